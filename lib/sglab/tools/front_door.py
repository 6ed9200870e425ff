"""Notebook 00, the front door: the reading order, "does it affect us?" (one row per fix, from its
review card, its record and its recorded runs) and the glossary the fix notebooks lean on.

A symptom is declared here in a line, with what it is derived from; a log line in it is only ever
SGLang's own, read from the recorded probe answers or engine runs of an affected release."""

from __future__ import annotations

import re
from typing import Optional

from sglab.core.card import releases_line, table
from sglab.tools import fixes


AFFECTED = ("before", "regressed")  # the release states in which a fix's bug is live

READING_ORDER = (  # (notebook, what it teaches, what it builds on)
    ("01_pcg_gate", "Piecewise CUDA graphs (PCG) for prefill, and the start-up gate that decides "
     "whether a model gets them. One GPU, the simplest mechanism: start here.", "the primer"),
    ("03_breakable_graph", "The breakable CUDA graph (BCG), the other way to graph a prefill, and "
     "why its logits tail had to leave the graph for batches of several requests.", "01's graphs"),
    ("04_swa_loc", "Decode CUDA graphs freeze the Python branch taken at capture; sliding-window "
     "models and SGLang's two KV pools.",
     "the primer"), ("06_capture_sizes",
                     "PCG capture sizes meet attention TP: a reduce-scatter that needs equal "
                     "shards stops the server at start-up.", "01, tensor parallelism"),
    ("02_workspace_floor", "The allreduce-fusion workspace at TP ≥ 2: what creating it costs every "
     "rank, and the floor that creates it once.", "tensor parallelism"),
    ("05_grid_thw", "How a tensor reaches every TP rank, and why a few bytes left on `cuda:0` open "
     "a CUDA context per rank on GPU 0.", "tensor parallelism"),
    ("07_how_we_measure", "How the engine numbers are made to repeat: interleaved starts, A/A "
     "controls, the host's launch cost, reruns on other machines. Read it before comparing "
     "numbers.", "any fix notebook"))


def affects_rows() -> list[dict]:
    """One row per fix: its notebook, bug, who it affects, releases and what a reader sees."""
    from sglab.swa_loc.claims import EXTRA_PER_SWA_LAYER
    from sglab.workspace_floor.rebuild import CALLEE_DEFAULT_MAX_TOKEN_NUM

    # per fix: what a reader of an affected release sees, and what that line is derived from
    symptoms = {
        "pcg_gate": (
            "Prefill runs eagerly where piecewise graphs were asked for; whether the first token "
            "comes later for it depends on the prompt length (01 measures both ways). Where a "
            "plain `.model` alias passes the gate instead, the LLM's weights are registered "
            "twice.", "the card's bug and the source check; 01's TTFT before and after the fix"),
        "workspace_floor": (
            f"Nothing as shipped: the engine creates the workspace once, at start-up. On a path "
            f"that skips that, a batch of more than {CALLEE_DEFAULT_MAX_TOKEN_NUM} tokens meets "
            f"the callee's assert.", "the card's bug and who"),
        "breakable_graph": (
            "Prefill batches of two or more requests run eagerly, silently: `can_run` refuses them "
            "without a log line.", "the card's bug and 0.5.11's `can_run`"),
        "swa_loc": (
            f"No error: each decode replay runs {EXTRA_PER_SWA_LAYER} extra kernels (a gather and "
            "an int32 cast) in every sliding-window layer. With #23552 alone, padded tokens can "
            "also overwrite live requests' SWA cache.", "the card and 04's claims"),
        "grid_thw": (
            "Every TP rank ≥ 1 also holds a CUDA context on GPU 0, after rank 0 has sized its KV "
            "cache there. The NVML signal: `nvidia-smi` lists `sglang::scheduler_TP1` and up on "
            "GPU 0, each holding hundreds of MiB.", "the card's bug and who; the process titles "
            "05's engine runs read from NVML"),
        "capture_sizes": ("The server fails at start-up, capturing its piecewise graphs.",
                          "the card's bug")
    }
    rows = []
    for fix in fixes.FIXES:
        card = fixes.claims(fix.name).CARD
        (seen, source), line = symptoms[fix.name], log_line(fix)
        own = " · SGLang's own line" if line else ""
        rows.append(
            dict(notebook=fix.stem, bug=lead(card.bug, 220), who=lead(card.affects, 200),
                 releases=releases_line(fix.releases(told=True)), symptom=f"{seen} {line}".strip(),
                 source=source + own))
    return rows


_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z`\"“(#*])")


def _cut(sentence: str, room: int, *, words: bool) -> str:
    """The longest head of ``sentence`` within ``room`` ending at a clause (or a word), or ''."""
    head = sentence[:room + 1]
    for pattern in (r"[;:](?= )", r" ") if words else (r"[;:](?= )",):
        for end in reversed([m.start() for m in re.finditer(pattern, head)]):
            part = sentence[:end].rstrip(" ,;:")
            if part.count("(") == part.count(")") and len(part) >= 12:
                return part
    return ""


def lead(text: str, limit: int) -> str:
    """The first whole sentences of ``text`` within ``limit``, the next cut and marked '…'."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    out = ""
    for sentence in _SENTENCE.split(text):
        joined = f"{out} {sentence}".strip()
        if len(joined) <= limit:
            out = joined
            continue
        part = _cut(sentence, limit - len(out) - 1, words=not out)
        # a first sentence with no clause or word to cut at within the limit stays whole
        return f"{out} {part}".strip() + " …" if part or out else sentence
    return out


def _probe_lines(fix) -> list[tuple[str, str]]:
    """(release, line): what the fix's newest recorded probe logged on an affected release only."""
    from sglab.sglang import store

    rec = store.newest() if fix.probe else None
    if rec is None:
        return []
    state = dict(fix.releases())
    seen: dict[str, list] = {}
    for (_, release), d in rec.results.items():
        if d["probe"] != fix.probe.fn or d["status"] != "ok":
            continue
        for row in d["rows"]:
            if row.get("metric") in ("messages", "warnings") and isinstance(row.get("value"), list):
                seen.setdefault(release, []).extend(row["value"])
    fine = {m for r, ms in seen.items() if state.get(r) not in AFFECTED for m in ms}
    return [(r, m) for r, ms in seen.items() if state.get(r) in AFFECTED
            for m in ms if m not in fine]


def _engine_lines(fix) -> list[tuple[str, str]]:
    """(release, error): the error a recorded engine run of an affected release stopped with."""
    from sglab.core import engine_records

    shown = list(fix.recorded_engine())
    if not shown:
        return []
    df = engine_records.frame(shown)
    state = dict(fix.releases())
    status = df[df.metric == "status"]
    return [(str(r), re.sub(r" \(log: [^)]*\)$", "",
                            str(v).removeprefix("error: ")))
            for r, v in zip(status["release"], status["value"])
            if state.get(str(r)) in AFFECTED and str(v).startswith("error: ")]


def log_line(fix) -> str:
    """SGLang's own line for the symptom (a recorded probe's log, else an engine run's error)."""
    found, said, where = _probe_lines(fix), "logs", "its recorded probe"
    if not found:
        found, said, where = _engine_lines(fix), "stops with", "a recorded engine run"
    if not found:
        return ""
    line = found[0][1]
    releases = ", ".join(sorted({r for r, m in found if m == line}))
    return f"{releases} {said} “{line}” ({where})."


def _link(stem: str) -> str:
    return f"[{stem}]({stem}.ipynb)"


def affects_markdown(rows: Optional[list[dict]] = None) -> str:
    header = ("notebook", "the bug", "who it affects", "releases (read from the wheels)",
              "what you see (derived from)")
    out = []
    for r in affects_rows() if rows is None else rows:
        # one range a line, the affected ones in bold, a range never broken
        ranges = [p.replace("–", "\u2060–\u2060") for p in r["releases"].split(" · ")]
        releases = "<br>".join(f"**{p}**" if p.startswith("affected") else p for p in ranges)
        out.append((_link(r["notebook"]), r["bug"], r["who"], releases,
                    f"{r['symptom']} *({r['source']})*"))
    return table(header, out)


def reading_markdown() -> str:
    rows = [[str(i), _link(s), teaches, on] for i, (s, teaches, on) in enumerate(READING_ORDER, 1)]
    return table(["", "notebook", "read it for", "builds on"], rows)


# -- the glossary: (term, other spellings the notebooks use, definition) ---------------------------
def _glossary() -> tuple:
    """docs/glossary.md's entries: ``## term``, a line ``Also: a; b``, a blank line, the meaning."""
    from sglab.core.runs import repo_root

    text = (repo_root() / "docs" / "glossary.md").read_text(encoding="utf-8")
    parts = (entry.strip().split("\n", 2) for entry in text.split("\n## ")[1:])
    return tuple((term, tuple(also.removeprefix("Also: ").split("; ")), " ".join(meaning.split()))
                 for term, also, meaning in parts)


GLOSSARY = _glossary()


def glossary_markdown() -> str:
    return table(["term", "meaning"], [[f"**{t}**", d] for t, _, d in GLOSSARY])


def show(markdown: str) -> None:
    """Show a table of this module in the notebook (its markdown as text elsewhere)."""
    from sglab.core.notebook import display

    display(None, markdown, markdown)
