"""Your server arguments: which capture sizes each SGLang release would use, and which the reduce-scatter refuses.

``sglab capture-sizes [--release V ...] -- <SGLang server arguments>`` parses the arguments with each release's
own ``ServerArgs`` in a subprocess per release (:mod:`.capture_probe`), and for the piecewise (prefill) and the
decode CUDA-graph runner reports:

- what the release captures (its own runner code) and, where it is off, the release's own reason;
- which captured sizes the attention-TP reduce-scatter refuses: with the layer communicator scattering tokens
  over attention TP (the release's ``require_gathered_buffer``), a size ``n`` with ``n % attn_tp != 0`` gives
  unequal ``tensor_split`` shards (:func:`sglab.fixes.capture_sizes.check_equal_shards`); the server then fails
  while capturing at start-up (a decode size counts one token per request: no speculative decoding);
- from the rebuild (:mod:`sglab.fixes.capture_sizes`), on the list the release configured: what #23972's filter
  keeps (piecewise; for decode the runner's own ``get_batch_sizes_to_capture`` rule, which the PR copied) and
  what the 0.5.22+ round-up makes of it: ``get_prefill_num_tokens_to_capture`` (model_executor/runner/
  prefill_cuda_graph_runner.py) rounds every size up to
  ``get_cuda_graph_batch_size_alignment()`` (utils/common.py of 0.5.23: x2 under two-batch overlap, x attention
  TP when gathered, x CP when CP does not divide that), which is the rebuild's ``decode_mul_base``.

Assumed, and printed with the table: an MLA model (piecewise maximum 2048 unless given), a text model, 141 GB per
GPU (an H200) and a request pool of 4096 unless ``--max-running-requests`` is given. ``--model-path`` may be left
out: the model is never loaded. Exit status: 0 when a release answered, 2 when every release that parsed the
arguments refused them (SGLang's own one-line message), 1 when no release could answer at all.
"""

from __future__ import annotations

import argparse
import sys

from sglab.fixes import capture_sizes as fx
from sglab.investigate.capture_probe import RUNNER_FILE, unsupported
from sglab.sglang.releases import package_dir

PROBE = "sglab.investigate.capture_probe:run"
MODEL_PLACEHOLDER = "model-not-loaded"
LISTS = ("piecewise", "decode")


class ArgsError(ValueError):
    """A bad command line of ``sglab capture-sizes`` itself (one line)."""


def pick_releases(requested: list[str] | None) -> list[str]:
    """The installed pinned releases, or the ``requested`` ones (each must be installed)."""
    from sglab.sglang import PINNED, installed_releases
    from sglab.sglang.releases import parse_version

    installed = installed_releases()
    if not requested:
        picked = [v for v in PINNED if v in installed]
        if not picked:
            raise ArgsError("no SGLang release is installed under .sglang/ (run `sglab real install`)")
        return picked
    for v in requested:
        try:
            parse_version(v)
        except ValueError as e:
            raise ArgsError(str(e)) from None
        if v not in installed:
            raise ArgsError(f"sglang {v} is not installed (installed: {', '.join(installed) or 'none'}; "
                            f"run `sglab real install --releases {v}`)")
    return list(dict.fromkeys(requested))


def probe_call(cases: dict[str, list[str]], releases, *, mla: bool = True,
               gpu_mem_gb: float = 141.0,
               max_running_requests: int = 4096) -> tuple[str, dict, list[str]]:
    """``(probe, params, releases)``: the one probe call :func:`ask` makes for ``cases``, on the
    releases the probe reaches (decided from their files, so no process is started for the others).
    ``--model-path`` is put first in every argument list; a later one given by the user wins."""
    params = {"cases": {k: ["--model-path", MODEL_PLACEHOLDER, *argv] for k, argv in cases.items()},
              "mla": mla, "gpu_mem_gb": gpu_mem_gb, "max_running_requests": max_running_requests}
    return PROBE, params, [v for v in releases if (package_dir(v) / RUNNER_FILE).is_file()]


def ask(cases: dict[str, list[str]], releases, *, mla: bool = True, gpu_mem_gb: float = 141.0,
        max_running_requests: int = 4096, timeout: float = 300.0):
    """Rows ``release, case, metric, value`` from each release (a ``not-run`` / ``probe-error`` row where a release
    could not answer); the probe's call is :func:`probe_call`."""
    import pandas as pd

    from sglab.sglang import run_probes

    probe, params, reached = probe_call(cases, releases, mla=mla, gpu_mem_gb=gpu_mem_gb,
                                        max_running_requests=max_running_requests)
    frames = [pd.DataFrame([{"release": v, "case": c, "metric": "unsupported",
                             "value": unsupported(v)} for c in cases])
              for v in releases if v not in reached]
    for v, r in run_probes(reached, probe, params, timeout=timeout).items():
        if r.ok:
            frames.append(r.rows.drop(columns=["probe"]))
        else:
            status = "not-run" if r.status == "not-run" else "probe-error"
            frames.append(pd.DataFrame([{"release": v, "case": c, "metric": status, "value": r.reason}
                                        for c in cases]))
    order = {v: i for i, v in enumerate(releases)}
    df = pd.concat(frames, ignore_index=True)
    return df.sort_values("release", key=lambda s: s.map(order), kind="stable", ignore_index=True)


# --------------------------------------------------------------------------------------------------------------
# one row per release x list
# --------------------------------------------------------------------------------------------------------------
def _rebuild(kind: str, configured: list[int], f: dict) -> dict:
    """The rebuild's rules on the configured list (see the module doc)."""
    tp, cp, g, tbo = f["attn_tp_size"], f["attn_cp_size"], f["gathered_buffer"], f["enable_two_batch_overlap"]
    if kind == "decode":
        kept = fx.filter_decode_batch_sizes(configured, tp, cp, gathered=g, two_batch_overlap=tbo,
                                            num_max_requests=f["pool_size"])
        return {"filter_base": fx.decode_mul_base(tp, cp, gathered=g, two_batch_overlap=tbo), "filter_keeps": kept,
                "round_up_alignment": None, "round_up": None}
    try:
        kept = fx.filter_piecewise_capture_sizes(configured, tp, cp, gathered=g)
    except fx.NoCaptureSizes:
        kept = None   # the PR's assertion fires: the server does not start
    align = fx.decode_mul_base(tp, cp, gathered=g, two_batch_overlap=tbo)
    return {"filter_base": fx.piecewise_mul_base(tp, cp) if g else 1, "filter_keeps": kept,
            "round_up_alignment": align, "round_up": fx.round_up_capture_sizes(configured, align)}


def _list_row(release: str, kind: str, f: dict) -> dict:
    off = f.get(f"{kind}_off")
    captured = [] if off else list(f[kind])
    tp, g = f["attn_tp_size"], f["gathered_buffer"]
    row = {"release": release, "list": kind, "status": "off" if off else "captured", "note": off or "",
           "attn_tp": tp, "attn_cp": f["attn_cp_size"], "gathered": g,
           "two_batch_overlap": f["enable_two_batch_overlap"], "configured": list(f[f"configured_{kind}"]),
           "captured": captured, "refused": [n for n in captured if g and n % tp != 0]}
    if off:
        return {**row, "filter_base": None, "filter_keeps": None, "round_up_alignment": None, "round_up": None}
    return {**row, **_rebuild(kind, row["configured"], f)}


def sizes_table(rows, case: str = "args"):
    """One row per release x list (``piecewise`` / ``decode``), or one row per release that did not answer
    (``status`` ``error``, ``unsupported``, ``not-run`` or ``probe-error``, the reason in ``note``)."""
    import pandas as pd

    out = []
    for release, d in rows[rows.case == case].groupby("release", sort=False):
        f = dict(zip(d.metric, d.value))
        bad = next((m for m in ("error", "unsupported", "not-run", "probe-error") if m in f), None)
        if bad:
            out.append({"release": release, "list": "", "status": bad, "note": str(f[bad])})
            continue
        out += [_list_row(release, kind, f) for kind in LISTS]
    return pd.DataFrame(out, dtype=object)


# --------------------------------------------------------------------------------------------------------------
# the printed table
# --------------------------------------------------------------------------------------------------------------
def _few(sizes, head: int = 5) -> str:
    return ", ".join(map(str, sizes[:head])) + (", …" if len(sizes) > head else "")


def _cells(r) -> list[str]:
    """The printed cells of one row of :func:`sizes_table`."""
    if r.status not in ("captured", "off"):
        return [r.release, "", "", f"{r.status}: {r.note}"]
    where = f"{r.list}, attn TP {r.attn_tp}" + (f" × CP {r.attn_cp}" if r.attn_cp > 1 else "")
    if r.status == "off":
        return [r.release, where, "off", f"not captured ({r.note})"]
    c = r.captured
    captures = f"{len(c)}: {c[0]}–{c[-1]}" if c else "none"
    if not r.gathered:
        refused = "none (no token scatter)"
    else:
        refused = f"{len(r.refused)}: {_few(r.refused)}" if r.refused else "none"
    what = "PR filter" if r.list == "piecewise" else "decode rule"
    if r.filter_keeps is None:
        kept = f"{what}: asserts, no size is a multiple of {r.filter_base}"
    else:
        kept = f"{what} keeps {len(r.filter_keeps)} of {len(r.configured)} (multiples of {r.filter_base})"
    tail = [kept]
    if r.round_up is not None:
        a = r.round_up_alignment
        moved = [f"{n}→{fx.ceil_align(n, a)}" for n in r.configured if n % a]
        tail.append(f"round-up to multiples of {a}: {len(r.round_up)}" + (f" ({_few(moved, 3)})" if moved else ""))
    return [r.release, where, captures, f"refused {refused}; " + "; ".join(tail)]


def render(table) -> str:
    """The table as text: release, list, captured sizes, then what is refused and what the rebuild's rules do."""
    head = ["release", "list", "captured", "refused by the reduce-scatter; rebuild (#23972 filter, 0.5.22+ round-up)"]
    cells = [head] + [_cells(r) for r in table.itertuples()]
    widths = [max(len(c[i]) for c in cells) for i in range(3)]
    return "\n".join("  ".join(c[i].ljust(widths[i]) for i in range(3)) + "  " + c[3] for c in cells)


def captured_lists(table, width: int = 116) -> str:
    """Each distinct captured list once, with the releases that capture it."""
    import textwrap

    ok = table[table.status == "captured"]
    out = []
    for kind in LISTS:
        groups: dict[tuple, list[str]] = {}
        for r in ok[ok.list == kind].itertuples():
            groups.setdefault(tuple(r.captured), []).append(r.release)
        for sizes, releases in groups.items():
            out.append(f"{kind}, sglang {', '.join(releases)} ({len(sizes)} sizes):")
            out.append(textwrap.fill(" ".join(map(str, sizes)), width, initial_indent="  ", subsequent_indent="  "))
    return "\n".join(out)


def notes(table) -> list[str]:
    """What the table does not say by itself: the two-batch-overlap gap between the PR's filter and the rules that
    double the base."""
    out = []
    pw = table[(table.status == "captured") & (table.list == "piecewise")]
    for r in pw.itertuples():
        if r.two_batch_overlap and r.filter_keeps and r.filter_base != r.round_up_alignment:
            gap = [n for n in r.filter_keeps if n % r.round_up_alignment]
            out.append(f"two-batch overlap: the decode rule and the 0.5.22+ round-up align to {r.round_up_alignment}, "
                       f"the PR's filter to {r.filter_base}; it keeps {len(gap)} sizes that are not multiples of "
                       f"{r.round_up_alignment} ({_few(gap)})")
            break
    return out


def to_csv(table, path) -> None:
    """The table with each list written as space-separated sizes."""
    flat = table.copy()
    for col in ("configured", "captured", "refused", "filter_keeps", "round_up"):
        if col in flat:
            flat[col] = [" ".join(map(str, v)) if isinstance(v, list) else "" for v in flat[col]]
    flat.to_csv(path, index=False)


# --------------------------------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------------------------------
def add_parser(sub) -> None:
    """``sglab capture-sizes``: the one entry cli.py makes."""
    p = sub.add_parser("capture-sizes", help="your SGLang server arguments → capture sizes per release, and which "
                       "the attention-TP reduce-scatter refuses",
                       description="sglab capture-sizes [--release V ...] -- <SGLang server arguments>")
    p.add_argument("--release", nargs="+", action="extend", metavar="V",
                   help="releases to ask (default: the installed pinned ones)")
    p.add_argument("--csv", metavar="FILE", help="also write the table as CSV")
    p.add_argument("--no-mla", dest="mla", action="store_false",
                   help="the model has no MLA attention (the piecewise maximum is then the chunked prefill size)")
    p.add_argument("--gpu-mem-gb", type=float, default=141.0, help="GPU memory per GPU (sets SGLang's defaults)")
    p.add_argument("server_args", nargs=argparse.REMAINDER, help="-- then the arguments of sglang.launch_server")
    p.set_defaults(fn=main)


def _fail(msg: str, code: int = 2) -> int:
    print(f"sglab capture-sizes: {msg}", file=sys.stderr)
    return code


def main(args) -> int:
    argv = list(args.server_args)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        return _fail("give SGLang server arguments after --, e.g. `sglab capture-sizes -- --tp 8 "
                     "--moe-dense-tp-size 1`")
    try:
        releases = pick_releases(args.release)
    except ArgsError as e:
        return _fail(str(e))
    rows = ask({"args": argv}, releases, mla=args.mla, gpu_mem_gb=args.gpu_mem_gb)
    table = sizes_table(rows)
    answered = table[table.status.isin(["captured", "off"])]
    errors = table[table.status == "error"]
    if answered.empty and not errors.empty:
        for msg, d in errors.groupby("note", sort=False):
            _fail(f"{msg} (sglang {', '.join(d.release)})")
        return 2
    print(f"SGLang server arguments: {' '.join(argv)}")
    print(assumptions(rows, mla=args.mla, gpu_mem_gb=args.gpu_mem_gb))
    print(render(table))
    for line in notes(table):
        print(line)
    if not answered.empty:
        print("\ncaptured sizes:\n" + captured_lists(table))
    if args.csv:
        to_csv(table, args.csv)
        print(f"CSV: {args.csv}")
    return 0 if not answered.empty else 1


def assumptions(rows, *, mla: bool, gpu_mem_gb: float, case: str = "args") -> str:
    """What the table assumes about the model and the machine, and the values SGLang derived from them."""
    d = rows[(rows.case == case) & rows.metric.isin(["piecewise_cuda_graph_max_tokens", "pool_size"])]
    vals = d.groupby("metric").value.first().to_dict()
    derived = (f"; so piecewise max tokens {vals['piecewise_cuda_graph_max_tokens']}, request pool "
               f"{vals['pool_size']}" if len(vals) == 2 else "")
    return (f"assumed: {'an MLA' if mla else 'a non-MLA'} text model, {gpu_mem_gb:g} GB per GPU, request pool 4096 "
            f"unless --max-running-requests{derived}")


# --------------------------------------------------------------------------------------------------------------
# the notebook's controls: the rebuild's rules for a parallel layout, no release needed
# --------------------------------------------------------------------------------------------------------------
def rule_table(attn_tp: int, attn_cp: int, dense_tp1: bool, tbo: bool, max_tokens: int = fx.MLA_MAX_TOKENS):
    """Per rule of the rebuild, the piecewise capture sizes of the default list for attention TP ``attn_tp`` x CP
    ``attn_cp`` (no DP attention), dense MLP at TP 1 or not, two-batch overlap or not, and which of them the
    reduce-scatter refuses. Releases per rule as found in the released wheels (0.5.14-0.5.21: no alignment)."""
    import pandas as pd

    a = fx.ParallelArgs(tp_size=int(attn_tp) * int(attn_cp), attn_cp_size=int(attn_cp),
                        moe_dense_tp_size=1 if dense_tp1 else None, enable_two_batch_overlap=bool(tbo))
    tp, cp, g = fx.attention_tp_size(a), a.attn_cp_size, fx.require_gathered_buffer(a)
    default = fx.default_piecewise_capture_sizes(max_tokens)
    align = fx.decode_mul_base(tp, cp, gathered=g, two_batch_overlap=a.enable_two_batch_overlap)
    try:
        pr = fx.filter_piecewise_capture_sizes(default, tp, cp, gathered=g)
    except fx.NoCaptureSizes:
        pr = None
    rules = [("before #23972", "0.5.10.post1", 1, default),
             ("#23972 filter", "0.5.11 – 0.5.13", fx.piecewise_mul_base(tp, cp) if g else 1, pr),
             ("no alignment", "0.5.14 – 0.5.21", 1, default),
             ("round-up", "0.5.22 +", align, fx.round_up_capture_sizes(default, align)),
             ("decode runner's rule on this list", "decode, every release", align,
              fx.filter_decode_batch_sizes(default, tp, cp, gathered=g, two_batch_overlap=a.enable_two_batch_overlap))]
    rows = []
    for rule, releases, base, sizes in rules:
        if sizes is None:
            rows.append({"rule": rule, "releases": releases, "multiple of": base, "captures": 0,
                         "refused": "the PR's assertion: no size is a multiple, the server does not start"})
            continue
        refused = [n for n in sizes if g and n % tp]
        rows.append({"rule": rule, "releases": releases, "multiple of": base, "captures": len(sizes),
                     "refused": f"{len(refused)}: {_few(refused)}" if refused else "none",
                     "smallest sizes": _few(sizes, 6)})
    df = pd.DataFrame(rows)
    df.attrs["setting"] = (f"attention TP {tp}, CP {cp}, " + ("tokens scattered over attention TP (dense TP 1)"
                           if g else "no token scatter (all-reduce): nothing to refuse"))
    if cp > 1:
        df.attrs["setting"] += ("; 0.5.10.post1 to 0.5.13 turn the piecewise runner off under context parallelism "
                                "unless --enforce-piecewise-cuda-graph (ServerArgs._handle_piecewise_cuda_graph)")
    return df
