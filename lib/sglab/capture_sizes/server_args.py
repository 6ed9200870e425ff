"""Your own setup for notebook 06: a parallel layout -> the piecewise sizes per rule and the ones
the reduce-scatter refuses (:func:`your_setup`), and your server arguments put to each installed
release's own ``ServerArgs`` beside the rebuild's rules (:func:`command`, ``sglab capture-sizes``).
"""

from __future__ import annotations

import functools
import itertools
import sys
import textwrap
from pathlib import Path

import pandas as pd

from sglab.capture_sizes import rebuild as fx
from sglab.capture_sizes import sglang
from sglab.core import notebook
from sglab.sglang.releases import PINNED, installed_releases, parse_version


def _few(sizes, head: int = 5) -> str:
    return ", ".join(map(str, sizes[:head])) + (", …" if len(sizes) > head else "")


@functools.lru_cache(maxsize=1)
def releases_by_state() -> dict[str, str]:
    """``{state: "first–last[, a–b]"}`` of the fix's releases, read from the released wheels."""
    out: dict[str, list[str]] = {}
    for state, group in itertools.groupby(sglang.FIX.releases(), key=lambda vs: vs[1]):
        vs = [v for v, _ in group]
        out.setdefault(state, []).append(vs[0] if len(vs) == 1 else f"{vs[0]}–{vs[-1]}")
    return {state: ", ".join(parts) for state, parts in out.items()}


def rule_table(attn_tp: int, attn_cp: int, dense_tp1: bool, tbo: bool,
               max_tokens: int = fx.MLA_MAX_TOKENS):
    """Per rule and its releases: the default piecewise sizes at attention TP x CP, the refused."""
    tp, cp, g, tbo = sglang.widths(
        dict(tp_size=int(attn_tp) * int(attn_cp), attn_cp_size=int(attn_cp),
             moe_dense_tp_size=1 if dense_tp1 else None, enable_two_batch_overlap=bool(tbo)))
    default = fx.default_piecewise_capture_sizes(max_tokens)
    facts = dict(attn_tp_size=tp, attn_cp_size=cp, gathered_buffer=g, pool_size=None,
                 enable_two_batch_overlap=tbo)
    pw, dec = _rebuild("piecewise", default, facts), _rebuild("decode", default, facts)
    seen = releases_by_state()
    rules = [("before #23972", seen.get("before", ""), 1, default),
             ("#23972 filter", seen.get("pr-era", ""), pw["filter_base"], pw["filter_keeps"]),
             ("no alignment", seen.get("regressed", ""), 1, default),
             ("round-up", seen.get("changed", ""), pw["round_up_alignment"], pw["round_up"]),
             ("decode runner's rule on this list", "decode, every release", dec["filter_base"],
              dec["filter_keeps"])]
    rows = []
    for rule, releases, base, sizes in rules:
        refused = [n for n in sizes or () if g and n % tp]
        said = f"{len(refused)}: {_few(refused)}" if refused else "none"
        rows.append({
            "rule": rule, "releases": releases, "multiple of": base, "captures": len(sizes or ()),
            "refused": said if sizes is not None else
            "the PR's assertion: no size is a multiple, the server does not start",
            **({"smallest sizes": _few(sizes, 6)} if sizes is not None else {})
        })
    df = pd.DataFrame(rows)
    df.attrs["setting"] = (
        f"attention TP {tp}, CP {cp}, " + ("tokens scattered over attention TP (dense TP 1)" if g
                                           else "no token scatter (all-reduce): nothing to refuse"))
    if cp > 1:
        df.attrs["setting"] += ("; 0.5.10.post1 to 0.5.13 turn the piecewise runner off under "
                                "context parallelism unless --enforce-piecewise-cuda-graph "
                                "(ServerArgs._handle_piecewise_cuda_graph)")
    return df


def your_setup(interactive: bool = False):
    """Attention TP, CP, dense TP 1 and two-batch overlap -> :func:`rule_table`."""
    controls = dict(attn_tp=list(range(1, 9)), attn_cp=[1, 2, 3, 4], dense_tp1=[True, False],
                    tbo=[False, True])
    static = [
        dict(attn_tp=tp, attn_cp=1, dense_tp1=True, tbo=tbo)
        for tp, tbo in ((8, False), (8, True), (3, False))
    ]
    return notebook.explore(
        rule_table, controls, static=static, interactive=interactive,
        title="Your parallel layout: piecewise capture sizes per rule, and the refused ones")


LISTS = ("piecewise", "decode")
REBUILD_COLUMNS = ("filter_base", "filter_keeps", "round_up_alignment", "round_up")  # _rebuild's
FAILED = ("error", "unsupported", "not-run", "probe-error")


def _rebuild(kind: str, configured: list[int], f: dict) -> dict:
    """The rebuild's rules on a configured list: #23972's filter (decode: its own), the round-up."""
    tp, cp, g = f["attn_tp_size"], f["attn_cp_size"], f["gathered_buffer"]
    tbo = f["enable_two_batch_overlap"]
    align = fx.decode_mul_base(tp, cp, gathered=g, two_batch_overlap=tbo)
    if kind == "decode":
        keeps = fx.filter_decode_batch_sizes(configured, tp, cp, gathered=g, two_batch_overlap=tbo,
                                             num_max_requests=f["pool_size"])
        return dict(filter_base=align, filter_keeps=keeps, round_up_alignment=None, round_up=None)
    try:
        kept = fx.filter_piecewise_capture_sizes(configured, tp, cp, gathered=g)
    except fx.NoCaptureSizes:
        kept = None  # the PR's assertion fires: the server does not start
    return dict(filter_base=fx.piecewise_mul_base(tp, cp) if g else 1, filter_keeps=kept,
                round_up_alignment=align, round_up=fx.round_up_capture_sizes(configured, align))


def sizes_table(rows, case: str = "args"):
    """A row per release x list: captured, refused, the rebuild's rules; or why no answer came."""
    out = []
    for release, d in rows[rows.case == case].groupby("release", sort=False):
        f = dict(zip(d.metric, d.value))
        bad = next((m for m in FAILED if m in f), None)
        if bad:
            out.append({"release": release, "list": "", "status": bad, "note": str(f[bad])})
            continue
        for kind in LISTS:
            off = f.get(f"{kind}_off")
            captured = [] if off else list(f[kind])
            tp, g = f["attn_tp_size"], f["gathered_buffer"]
            configured = list(f[f"configured_{kind}"])
            rules = dict.fromkeys(REBUILD_COLUMNS) if off else _rebuild(kind, configured, f)
            out.append(
                dict(release=release, list=kind, status="off" if off else "captured", note=off
                     or "", attn_tp=tp, attn_cp=f["attn_cp_size"], gathered=g,
                     two_batch_overlap=f["enable_two_batch_overlap"], configured=configured,
                     captured=captured, refused=[n for n in captured if g and n % tp], **rules))
    return pd.DataFrame(out, dtype=object)


def _cells(r) -> tuple[str, ...]:
    if r.status not in ("captured", "off"):
        return (r.release, "", "", f"{r.status}: {r.note}")
    where = f"{r.list}, attn TP {r.attn_tp}" + (f" × CP {r.attn_cp}" if r.attn_cp > 1 else "")
    if r.status == "off":
        return (r.release, where, "off", f"not captured ({r.note})")
    c = r.captured
    refused = ("none (no token scatter)" if not r.gathered else
               f"{len(r.refused)}: {_few(r.refused)}" if r.refused else "none")
    what = "PR filter" if r.list == "piecewise" else "decode rule"
    tail = [
        f"{what}: asserts, no size is a multiple of {r.filter_base}"
        if r.filter_keeps is None else f"{what} keeps {len(r.filter_keeps)} of "
        f"{len(r.configured)} (multiples of {r.filter_base})"
    ]
    if r.round_up is not None:
        a = r.round_up_alignment
        moved = [f"{n}→{fx.ceil_align(n, a)}" for n in r.configured if n % a]
        tail.append(f"round-up to multiples of {a}: {len(r.round_up)}" +
                    (f" ({_few(moved, 3)})" if moved else ""))
    return (r.release, where, f"{len(c)}: {c[0]}–{c[-1]}" if c else "none",
            f"refused {refused}; " + "; ".join(tail))


def render(table) -> str:
    """The table as text: release, list, captured sizes, what is refused, the rebuild's rules."""
    head = ("release", "list", "captured",
            "refused by the reduce-scatter; rebuild (#23972 filter, 0.5.22+ round-up)")
    cells = [head] + [_cells(r) for r in table.itertuples()]
    widths = [max(len(c[i]) for c in cells) for i in range(3)]
    return "\n".join(
        "  ".join(c[i].ljust(widths[i]) for i in range(3)) + "  " + c[3] for c in cells)


def notes(table) -> list[str]:
    """The two-batch-overlap gap between the PR's filter and the rules that double the base."""
    pw = table[(table.status == "captured") & (table.list == "piecewise")]
    agree = []
    for r in pw.itertuples():
        if r.two_batch_overlap and r.filter_keeps and r.filter_base != r.round_up_alignment:
            a = r.round_up_alignment
            head = (f"two-batch overlap: the decode rule and the 0.5.22+ round-up align to {a}, "
                    f"the PR's filter to {r.filter_base}; ")
            gap = [n for n in r.filter_keeps if n % a]
            if gap:
                what = "sizes that are not multiples" if gap[1:] else "size that is not a multiple"
                return [head + f"it keeps {len(gap)} {what} of {a} ({_few(gap)})"]
            agree = agree or [
                head + f"on this list they agree: every size the filter keeps is a multiple of {a}"
            ]
    return agree


def to_csv(table, path) -> None:
    """The table with each list written as space-separated sizes."""
    flat = table.copy()
    for col in ("configured", "captured", "refused", "filter_keeps", "round_up"):
        if col in flat:
            flat[col] = [" ".join(map(str, v)) if isinstance(v, list) else "" for v in flat[col]]
    flat.to_csv(path, index=False)


# the parallel widths the capture sizes depend on: each a positive integer (SGLang's own parsers
# take 0 or -1 and fail later with a modulo by zero, or print sizes for "attention TP 0")
PARALLEL_FLAGS = ("--tp-size", "--tp", "--dp-size", "--dp", "--pp-size", "--ep-size", "--ep",
                  "--moe-dense-tp-size", "--attn-cp-size", "--attention-context-parallel-size")


def _fail(msg: str, code: int = 2) -> int:
    print(f"sglab capture-sizes: {msg}", file=sys.stderr)
    return code


def _on_terminal() -> bool:
    return sys.stderr.isatty()


def command(argv: list[str], *, releases: list[str] | None = None, mla: bool = True,
            gpu_mem_gb: float = 141.0, model: str = sglang.MODEL, csv: str | None = None) -> int:
    """``sglab capture-sizes [--release V ...] [--model CONFIG.json] -- <server arguments>``: each
    release resolves the arguments with its own ``ServerArgs`` (:func:`sizes_table`). Exit 0 when
    a release answered, 2 when every release refused them, 1 when none could answer."""
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        return _fail("give SGLang server arguments after --, e.g. `sglab capture-sizes -- --tp 8 "
                     "--moe-dense-tp-size 1`")
    for i, a in enumerate(argv):
        flag, eq, val = a.partition("=")
        val = val if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        if flag in PARALLEL_FLAGS and not (val.isdigit() and int(val) > 0):
            return _fail(
                f"{flag} {val or '(no value)'}: a parallel size must be a positive integer")
    if csv and not Path(csv).resolve().parent.is_dir():  # said before the releases run, not after
        return _fail(f"--csv {csv}: no such folder {Path(csv).resolve().parent}")
    if csv and Path(csv).is_dir():
        return _fail(f"--csv {csv}: a folder, not a file")
    installed = installed_releases()  # the pinned ones, or those asked for
    picked = list(dict.fromkeys(releases)) if releases else [v for v in PINNED if v in installed]
    if not picked:
        return _fail("no SGLang release is installed under .sglang/ (run `sglab real install`)")
    try:
        for v in picked:
            parse_version(v)
            if v not in installed:
                return _fail(f"sglang {v} is not installed (installed: "
                             f"{', '.join(installed) or 'none'}; run `sglab real install "
                             f"--releases {v}`)")
        sglang.model_config(model)  # a missing config is said before any release starts
    except ValueError as e:
        return _fail(str(e))
    # each release parses in a process of its own, several seconds each: on a terminal, say so
    # while they run (a pipe or a log gets the table and the one-line errors only)
    tell = _on_terminal()
    if tell:
        print(f"asking {len(picked)} release(s) to parse the arguments, each in its own process …",
              file=sys.stderr, flush=True)

    def say(v, r):
        where = (f"recorded: {r.recorded}" if r.recorded else
                 "not run here" if r.status == "not-run" else f"{r.seconds:.1f} s")
        print(f"  sglang {v}: {r.status} ({where})", file=sys.stderr, flush=True)

    rows = sglang.ask({"args": argv}, picked, mla=mla, gpu_mem_gb=gpu_mem_gb, model=model,
                      progress=say if tell else None)
    table = sizes_table(rows)
    answered = table[table.status.isin(["captured", "off"])]
    errors = table[table.status == "error"]
    if answered.empty and not errors.empty:
        for msg, d in errors.groupby("note", sort=False):
            _fail(f"{msg} (sglang {', '.join(d.release)})")
        return 2
    print(f"SGLang server arguments: {' '.join(argv)}")
    # what the table assumes about the model and the machine, and what SGLang derived from it
    print(f"assumed: {gpu_mem_gb:g} GB per GPU (a CUDA host), a request pool of 4096 unless "
          f"--max-running-requests; 0.5.10.post1–0.5.13: {'an MLA' if mla else 'a non-MLA'} "
          f"text model; 0.5.14 on: the model config {model}")
    for release, g in rows[rows.case == "args"].groupby("release", sort=False):
        f = dict(zip(g.metric, g.value))
        if "piecewise_max_tokens" in f:
            print(f"  sglang {release}: piecewise max tokens {f['piecewise_max_tokens']}, "
                  f"decode max bs {f['decode_max_bs']}, request pool {f['pool_size']}" +
                  (f", attention backend {f['attention_backend']} (chosen without a GPU)" if f.
                   get("attention_backend") else ""))
    print(render(table))
    for line in notes(table):
        print(line)
    if not answered.empty:  # each distinct captured list once, with the releases that capture it
        ok, out = table[table.status == "captured"], []
        for kind in LISTS:
            groups: dict[tuple, list[str]] = {}
            for r in ok[ok.list == kind].itertuples():
                groups.setdefault(tuple(r.captured), []).append(r.release)
            for sizes, names in groups.items():
                out.append(f"{kind}, sglang {', '.join(names)} ({len(sizes)} sizes):")
                out.append(
                    textwrap.fill(" ".join(map(str, sizes)), 100, initial_indent="  ",
                                  subsequent_indent="  "))
        print("\ncaptured sizes:\n" + "\n".join(out))
    if csv:
        to_csv(table, csv)
        print(f"CSV: {csv}")
    return 0 if not answered.empty else 1
