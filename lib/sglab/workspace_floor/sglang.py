"""The workspace floor in real SGLang: the fix's record (``FIX``), source check, code path, probe
(FlashInfer replaced by a recorder), the engine's scenarios and answers, and the comparison."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import gzip
import inspect
import itertools
import types

import pandas as pd

from sglab.core import lazy
from sglab.sglang import bootstrap, compare as real, engine as eng, source as S
from sglab.sglang.engine import Case, Scenario, revert_adjustment, trace_adjustment
from sglab.sglang.codepath import Node
from sglab.sglang.fix import Fix, Probe, Spec, symbols_in
from sglab.sglang.probing import patched
from sglab.sglang.releases import installed_releases, package_dir
from sglab.sglang.upstream import Verdict

# imported by the probes and the comparison that use them: reading FIX needs none of them
torch = lazy.Module("torch")
traces = lazy.Module("sglab.workspace_floor.traces")
rebuild = lazy.Module("sglab.workspace_floor.rebuild")

LAYERNORM = "srt/layers/layernorm.py"
FUSION = "srt/layers/flashinfer_comm_fusion.py"
_PR_FLOOR = "max(x.shape[0], 2048)"
RELEASES = ("0.5.12.post1", "0.5.13")
OWN_POLICY = {"0.5.12.post1": "before_pr", "0.5.13": "floor_2048"}  # the rebuild's call sites
ALT_SITES = ("floor_0", "floor_1024")
SCENARIOS = (0, 2048)
WORLD_SIZE, HIDDEN = 2, 7168
# the code path in the release that has the floor, start-up first, then every forward step
RELEASE = "0.5.13"
CODE_PATH = (Node("srt/model_executor/model_runner.py",
                  "ModelRunner._pre_initialize_flashinfer_allreduce_workspace",
                  "start-up, before graph capture: at FUSE_ALLREDUCE_MAX_BATCH_SIZE tokens"),
             Node(FUSION, "pre_initialize_workspaces",
                  "creates both workspaces: MoE TP, attention TP"),
             Node("srt/layers/communicator.py", "apply_flashinfer_allreduce_fusion",
                  "each step: fused only up to 2048 tokens (SM90/SM100, no DP attention)"),
             Node(LAYERNORM, "_forward_with_allreduce_fusion",
                  "the call site: max_token_num=max(x.shape[0], 2048), the PR's line"),
             Node(FUSION, "flashinfer_allreduce_residual_rmsnorm",
                  "asserts x.shape[0] <= max_token_num"),
             Node(FUSION, "ensure_workspace_initialized",
                  "creates only when the workspace is too small"),
             Node(FUSION, "FlashInferWorkspaceManager.initialize",
                  "the creation: IPC buffers, barriers"))


# -- the source check (the release timeline, `sglab upstream`) -------------------------------------
def check(read) -> Verdict:
    """The state of #26382 part B in one SGLang, read from ``layers/layernorm.py``."""
    src, tree = S.parsed(read, LAYERNORM)
    if src is None:
        return Verdict("absent", "no layers/layernorm.py in this SGLang")
    if tree is None:
        return Verdict("unknown", "layers/layernorm.py does not parse")
    fused = S.calls(
        S.find(tree, "_forward_with_allreduce_fusion") or tree,
        "flashinfer_allreduce_residual_rmsnorm")
    if not fused:
        return Verdict(
            "absent", "layernorm.py does not call flashinfer_allreduce_residual_rmsnorm "
            "(no fused all-reduce + RMSNorm, no workspace to size)")
    passed = [S.keyword(c, "max_token_num") for c in fused]
    if all(e is None for e in passed):  # then the callee's default applies, and its assert
        fn = S.find(S.parsed(read, FUSION)[1], "flashinfer_allreduce_residual_rmsnorm")
        args = fn.args.args[len(fn.args.args) - len(fn.args.defaults):] if fn else []
        default = next(
            (ast.unparse(d) for a, d in zip(args, fn.args.defaults) if a.arg == "max_token_num"),
            None)
        guard = default and any(
            isinstance(n, ast.Assert) and "max_token_num" in ast.unparse(n.test)
            for n in ast.walk(fn))
        return Verdict(
            "before", "layernorm.py calls flashinfer_allreduce_residual_rmsnorm without "
            "max_token_num"
            + (f": the callee's default max_token_num={default} applies" if default else "")
            + (f" and it asserts the batch has at most {default} tokens" if guard else ""))
    spelled = {ast.unparse(e) for e in passed if e is not None}
    if _PR_FLOOR in spelled:
        return Verdict(
            "pr-era", f"layernorm.py passes max_token_num={_PR_FLOOR} to "
            "flashinfer_allreduce_residual_rmsnorm")
    floors = [
        e for e in passed
        if isinstance(e, ast.Call) and S.callee_name(e) == "max" and len(e.args) == 2
        and isinstance(e.args[1], ast.Constant) and isinstance(e.args[1].value, int)
    ]
    if floors:
        return Verdict(
            "changed", f"layernorm.py passes max_token_num={ast.unparse(floors[0])}: a "
            "floor other than the PR's 2048")
    return Verdict(
        "unknown", f"layernorm.py passes max_token_num={sorted(spelled)[0]}, not a floor "
        "this check recognises")


# -- the CPU probe (inside one release's worker process) -------------------------------------------
class RecordedWorkspace:
    """What ``create_allreduce_fusion_workspace`` would return, with FlashInfer's size rule."""

    def __init__(self, comm, kwargs: dict):
        self.comm, self.kwargs, self.backend = comm, kwargs, kwargs.get("backend", "trtllm")
        self.metadata = dict(tp_size=kwargs["world_size"], max_token_num=kwargs["max_token_num"],
                             hidden_dim=kwargs["hidden_dim"], use_fp32_lamport=False)

    def is_buffer_size_sufficient(self, tp_size, num_tokens, hidden_dim, dtype=None,
                                  use_oneshot=None):
        return rebuild.size_sufficient(self.metadata, num_tokens, hidden_dim, tp_size)

    def destroy(self):
        self.comm.destroyed += 1


class RecordingComm:
    """Stands in for ``flashinfer.comm``: records every creation with the trace step it fell on."""

    def __init__(self):
        self.step, self.created, self.destroyed, self.fused_calls = -1, [], 0, 0
        self.AllReduceFusionPattern = types.SimpleNamespace(kARResidualRMSNorm="kARResidualRMSNorm")

    def create_allreduce_fusion_workspace(self, **kwargs):
        self.created.append({"step": self.step, "max_token_num": int(kwargs["max_token_num"])})
        return RecordedWorkspace(self, kwargs)

    def allreduce_fusion(self, **kwargs):
        self.fused_calls += 1


def undecorated(module, name: str):
    """``module.name`` compiled without its decorators (a CUDA-only torch op's registration)."""
    tree = ast.parse(inspect.getsource(module))
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if node is None:
        raise AttributeError(f"{module.__name__} defines no function {name} in this release")
    node.decorator_list = []
    code = compile(ast.Module([node], type_ignores=[]), inspect.getsourcefile(module), "exec")
    namespace = module.__dict__  # the function reads (patched) module globals at call time
    saved = namespace.get(name)
    exec(code, namespace)
    fn, namespace[name] = namespace[name], saved
    return fn


@contextlib.contextmanager
def _wired(prepared, comm: RecordingComm, world_size: int):
    """The release's modules with FlashInfer, preflight, parallel state and managers replaced."""
    fc = bootstrap.import_release_module(prepared, "sglang.srt.layers.flashinfer_comm_fusion")
    dist = bootstrap.import_release_module(prepared, "sglang.srt.distributed")
    group = types.SimpleNamespace(device_group="device_group", cpu_group="cpu_group",
                                  world_size=world_size)
    sizes = dict(get_attn_tensor_model_parallel_world_size=lambda: world_size,
                 get_moe_tensor_parallel_world_size=lambda: world_size,
                 get_moe_expert_parallel_world_size=lambda: 1)
    # get_tp_group of one rank: no vote to sync
    others = dict(
        get_attn_tensor_model_parallel_rank=lambda: 0, get_moe_tensor_parallel_rank=lambda: 0,
        get_moe_expert_parallel_rank=lambda: 0, get_attn_tp_group=lambda: group,
        get_moe_tp_group=lambda: group, get_moe_ep_group=lambda: group,
        get_tp_group=lambda: types.SimpleNamespace(world_size=1),
        is_flashinfer_available=lambda: True, _flashinfer_comm=comm,
        _flashinfer_allreduce_unavailable=False, _preflight_check_workspace_memory=lambda **k: True,
        flashinfer_allreduce_residual_rmsnorm=undecorated(fc,
                                                          "flashinfer_allreduce_residual_rmsnorm"),
        _attn_tp_workspace_manager=fc.FlashInferWorkspaceManager(),
        _moe_tp_workspace_manager=fc.FlashInferWorkspaceManager())
    with patched(fc, **sizes, **others), patched(dist, **sizes):  # the call site imports per call
        yield fc


class _Norm:
    """The norm module the call site reads; its unfused ``forward`` must not run."""

    variance_epsilon = 1e-6

    def forward(self, x, residual, post_residual_addition=None):
        raise AssertionError("the call site fell back to the unfused norm: the fused path was not "
                             "taken")


def _call(prepared, fc, site: str, tokens: int, hidden: int):
    """One step through the release's call site, or the real callee at a chosen floor."""
    x = torch.empty((tokens, hidden), dtype=torch.bfloat16)
    residual, weight = torch.empty_like(x), torch.empty(hidden, dtype=torch.bfloat16)
    if site == "release":
        ln = bootstrap.import_release_module(prepared, "sglang.srt.layers.layernorm")
        return ln._forward_with_allreduce_fusion(_Norm(), x, residual, None, weight)
    return fc.flashinfer_allreduce_residual_rmsnorm(
        input_tensor=x, residual=residual, weight=weight,
        max_token_num=max(tokens, int(site.removeprefix("floor_"))))


def replay_release(prepared, trace: list, site: str, *, pre_initialize: int = 0,
                   world_size: int = WORLD_SIZE, hidden: int = HIDDEN) -> dict:
    """The trace through the real code: the creations it asked for, the calls the callee refused."""
    comm, refused = RecordingComm(), 0
    with _wired(prepared, comm, world_size) as fc:
        if pre_initialize:
            fc.pre_initialize_workspaces(max_token_num=pre_initialize, hidden_dim=hidden,
                                         dtype=torch.bfloat16)
        for step, tokens in enumerate(trace):
            comm.step = step
            try:
                _call(prepared, fc, site, int(tokens), hidden)
            except AssertionError as exc:
                if "unfused" in str(exc):
                    raise
                refused += 1  # the callee's `assert input_tensor.shape[0] <= max_token_num`
        high_water = hasattr(fc._attn_tp_workspace_manager, "_max_token_num_seen")
    at = [c for c in comm.created if c["step"] >= 0]
    sizes, steps = [c["max_token_num"] for c in at], [c["step"] for c in at]
    return dict(recreations=len(at), sizes=sizes, steps=steps,
                preinit_creations=len(comm.created) - len(at), refused_calls=refused,
                fused_calls=comm.fused_calls, manager_high_water_mark=high_water)


def probe(prepared, params: dict) -> list[dict]:
    """Rows ``trace, site, scenario, metric, value``: the call site's line, then each cell's."""
    layernorm = bootstrap.import_release_module(prepared, "sglang.srt.layers.layernorm")
    source = inspect.getsource(layernorm._forward_with_allreduce_fusion)
    lines = [ln.strip().rstrip(",") for ln in source.splitlines() if "max_token_num=" in ln]
    call_site = lines[0] if lines else "(none)"
    rows = [dict(trace="", site="release", scenario="", metric="call_site", value=call_site)]
    W, H = int(params["world_size"]), int(params["hidden"])
    for (name, trace), site, pre in itertools.product(params["traces"].items(), params["sites"],
                                                      params["pre_initialize"]):
        got = replay_release(prepared, trace, site, pre_initialize=int(pre), world_size=W, hidden=H)
        where = dict(trace=name, site=site, scenario=f"preinit_{pre}" if pre else "cold")
        rows += [{**where, "metric": k, "value": v} for k, v in got.items()]
    return rows


def probe_params() -> dict:
    """The notebook's question to each release: both traces, every call site, cold and warm."""
    tokens = {t: traces.trace_tokens(t) for t in traces.TRACES}
    return dict(traces=tokens, sites=["release", *ALT_SITES], pre_initialize=list(SCENARIOS),
                world_size=WORLD_SIZE, hidden=HIDDEN)


# -- the real engine (`sglab engine --scenario NAME`: data/recorded/engine_workspace_floor/), record
WORKSPACE_TRACE = trace_adjustment(
    "trace-flashinfer-workspace",
    "SGLang logs nothing when it creates a FlashInfer all-reduce workspace: each call of "
    "FlashInferWorkspaceManager.initialize prints one line with its max_token_num (behaviour "
    "unchanged)", "sglang.srt.layers.flashinfer_comm_fusion",
    "FlashInferWorkspaceManager.initialize", "workspace", ("max_token_num", "world_size", "rank"))
FUSION_ARGS = ("--enable-flashinfer-allreduce-fusion", "--disable-radix-cache")
# the rebuild's floor_0 policy in the released engine: which keeps the workspace, the floor or
# SGLang's pre-initialisation at 2048 before capture?
FLOOR_TO_SHAPE = revert_adjustment(
    "pr26382-floor-to-x-shape",
    "on 0.5.13 the call site's `max_token_num=max(x.shape[0], 2048),` in "
    "layers/layernorm.py::_forward_with_allreduce_fusion is replaced by `max_token_num="
    "x.shape[0],` (the rebuild's floor_0 policy, never released); nothing else changes",
    "sglang.srt.layers.layernorm", "_forward_with_allreduce_fusion",
    text="max_token_num=max(x.shape[0], 2048),", replacement="max_token_num=x.shape[0],")


def _fusion_cases(tp: int) -> tuple:
    args = ("--tp-size", str(tp), *FUSION_ARGS)
    return (Case("fusion", args, (WORKSPACE_TRACE,)),
            Case("x-shape", args, (WORKSPACE_TRACE, FLOOR_TO_SHAPE), releases=("0.5.13",)))


_TP2 = Scenario(
    fix="workspace_floor", name="02-ar-fusion", gpus=2,
    what="--enable-flashinfer-allreduce-fusion at TP 2 over a short-prompt trace: FlashInfer "
    "workspace creations per rank, their size and time (needs the whole FlashInfer package: "
    "FLASHINFER_FULL=1 bundles)", model="deepseek_v3_tiny", tool="engine",
    releases=("0.5.12.post1", "0.5.13"), cases=_fusion_cases(2), requests=(1,),
    input_lens=(4, 16, 64, 200, 700, 1500, 2100, 3000), output_len=4, repeats=1, timeout=1500.0,
    expect="both releases create two workspaces per rank (attention TP and MoE TP) at 2048 "
    "tokens before graph capture (pre_initialize_workspaces) and none per forward step: the "
    "fusion runs only up to 2048 tokens (communicator.apply_flashinfer_allreduce_fusion); "
    "the same with the floor replaced by x.shape[0]")

# the same at TP 4 and 8: the count per rank does not depend on TP
ENGINE = (_TP2, *(dataclasses.replace(
    _TP2, name=f"02-ar-fusion-tp{tp}", gpus=tp, cases=_fusion_cases(tp),
    what=f"--enable-flashinfer-allreduce-fusion at TP {tp} over the same trace: workspace "
    "creations per rank (FLASHINFER_FULL=1 bundles)",
    expect="two workspaces per rank at 2048 tokens before capture and none per forward step, "
    "with and without the floor") for tp in (4, 8)))

FIX = Fix(
    name="workspace_floor", number="02", part="part B", prs=(26382,), gpus=2,
    title="layernorm passes max_token_num=max(x.shape[0], 2048) to the fused AR+norm (#26382)",
    check=check, hunks=(Spec(26382, symbols_in(LAYERNORM, "_forward_with_allreduce_fusion")),),
    probe=Probe("sglab.workspace_floor.sglang:probe", RELEASES, probe_params), engine=ENGINE)

# -- the engine's answers, read from each run's log (claims.ENGINE, show.VIEW) ---------------------
# the call site each engine variant runs, as the rebuild's policy (the released managers keep no
# high-water mark)
ENGINE_POLICY = {("0.5.12.post1", "fusion"): "before_pr", ("0.5.13", "fusion"): "floor_2048",
                 ("0.5.13", "x-shape"): "shape_no_hwm"}


def engine_facts(run) -> list[dict]:
    """Per engine variant that started: its creations per rank, their sizes, the simulation."""
    specs = {(s["release"], s["case"]): s for s in run.manifest.params.get("specs", [])}
    out: dict = {}
    for i, e in enumerate(run.manifest.engine_runs):
        key = (e["release"], e["case"])
        log = run.sidecar(f"log_{i}")
        if e.get("status") != "ok" or key not in ENGINE_POLICY or log is None:
            continue
        d = eng.read_log(gzip.decompress(log.read_bytes()).decode(errors="replace"))
        hidden = int(eng.text_config(e["model"]["config"])["hidden_size"])
        world = int(d["resolved"].get("tp_size", 2)) if d.get("resolved") else 2
        policy = dataclasses.replace(rebuild.POLICIES[ENGINE_POLICY[key]], high_water=False)
        spec, steps = specs.get(key, {}), []
        rounds = range(int(spec.get("warmup", 0)) + int(spec.get("repeats", 1)))
        for il, _, n in itertools.product(spec.get("input_lens", []), rounds,
                                          spec.get("requests", [1])):
            steps += [il * n] + [n] * (int(spec.get("output_len", 1)) - 1)
        trace = [
            int(t) for t in sorted(d.get("decode_bs") or [], reverse=True) +
            sorted(d.get("pcg_tokens") or [], reverse=True) + steps
            if rebuild.fusion_applies(int(t))
        ]
        mgr, _ = rebuild.simulate(policy, trace, world_size=world, hidden_dim=hidden,
                                  pre_initialize=rebuild.FUSE_ALLREDUCE_MAX_BATCH_SIZE)
        ev = [x for x in d["events"] if x.get("event") == "workspace"]
        ranks = sorted({int(x["rank"]) for x in ev})
        by_rank = {r: [x for x in ev if int(x["rank"]) == r] for r in ranks}
        first, timed = {}, {}
        for c in d["calls"]:
            ms = float(c["seconds"]) * 1e3
            (first if int(c.get("warmup", 0)) else timed)[int(c["input_len"])] = ms
        per_rank = {r: len(v) for r, v in by_rank.items()}
        managers = {r: len({x.get("obj") for x in v}) for r, v in by_rank.items()}
        ms_by_rank = {
            r: [float(x["seconds"]) * 1e3 for x in v if "seconds" in x]
            for r, v in by_rank.items()
        }
        sizes = sorted({int(x["max_token_num"]) for x in ev})
        sim_sizes = sorted({x.max_token_num for x in mgr.events})
        variant, in_calls = f"{key[0]}+{key[1]}", sum(c.get("events", 0) for c in d["calls"])
        out.pop((world, variant), None)  # a newer start of the variant replaces the older
        out[(world, variant)] = dict(variant=variant, policy=policy.name, world=world, calls=len(
            d["calls"]), sim=len(mgr.events), first_call_ms=first, call_ms=timed, per_rank=per_rank,
                                     managers=managers, sizes=sizes, in_calls=in_calls,
                                     sim_sizes=sim_sizes, ms_by_rank=ms_by_rank)
    return list(out.values())


def engine_facts_of(runs_: list) -> list[dict]:
    """:func:`engine_facts` over several runs, the newest answer per TP size and variant."""
    best = {}
    for r in sorted(runs_, key=lambda r: r.manifest.created_utc):
        best.update({(f["world"], f["variant"]): f for f in engine_facts(r)})
    return [best[k] for k in sorted(best)]


# -- the real decisions beside the rebuild's (the notebook's real-SGLang section) ------------------
def rebuild_policy(release: str, site: str, high_water: bool) -> rebuild.Policy:
    """The rebuild's policy for a real call site, with the release's manager."""
    name = OWN_POLICY[release] if site == "release" else site
    named = rebuild.POLICIES.get(name) or rebuild.floor_policy(int(site.removeprefix("floor_")))
    return dataclasses.replace(named, high_water=high_water)


def rebuild_cell(policy: rebuild.Policy, trace: str, pre: int) -> dict:
    mgr, refused = rebuild.simulate(policy, traces.trace_tokens(trace), world_size=WORLD_SIZE,
                                    hidden_dim=HIDDEN, pre_initialize=pre or None)
    events = [e for e in mgr.events if e.step >= 0]
    return dict(recreations=len(events), sizes=[e.max_token_num for e in events],
                steps=[e.step for e in events], refused_calls=refused)


def _describe(d: dict) -> str:
    """A cell's re-creations and refused calls in words: ``1× at T=2048, 385 refused``."""
    made = (f"{d['recreations']}× at T={', '.join(map(str, d['sizes']))}"
            if d["recreations"] else "never re-created")
    return f"{made}, {d['refused_calls']} refused"


def _real_cells(results: dict):
    """``(release, its call-site line, (trace, site, scenario), {metric: value})`` per real cell."""
    for release, result in real.ran(results).items():
        d = result.rows
        own = d.loc[d.metric == "call_site", "value"].iloc[0]
        for key, g in d[d.trace != ""].groupby(["trace", "site", "scenario"], sort=False):
            yield release, own, key, dict(zip(g.metric, g.value))


def comparison(results: dict):
    """Per (release, call site, trace, scenario): the real re-creations beside the rebuild's."""
    rows = []
    for release, own, (trace, site, scenario), got in _real_cells(results):
        hwm = bool(got["manager_high_water_mark"])
        policy = rebuild_policy(release, site, hwm)
        pre = 0 if scenario == "cold" else int(scenario.split("_")[1])
        where = (f"its own call ({'no max_token_num' if own == '(none)' else own})"
                 if site == "release" else f"max_token_num=max(x.shape[0], "
                 f"{site.removeprefix('floor_')})")
        want = rebuild_cell(policy, trace, pre)
        rows.append(
            real.facts_row(release, f"{where}, '{trace}', {scenario}", got,
                           policy.label + ("" if hwm else ", no high-water mark"), want,
                           ("steps", "sizes", "refused_calls"), _describe))
    return real.table(rows)


def decisions(results: dict):
    """The real code's creations (and refused calls) along each trace, per release and call site."""
    rows = []
    for release, _, (trace, site, scenario), got in _real_cells(results):
        refused = int(got["refused_calls"])
        said = f"{int(got['recreations'])}" + (f" ({refused} refused)" if refused else "")
        name = rebuild_policy(release, site, True).label
        rows.append(
            dict(order=(release, site != "release", site), release=release, site=name, trace=trace,
                 scenario=scenario, cell=said))
    if not rows:
        return pd.DataFrame()
    d = pd.DataFrame(sorted(rows, key=lambda r: r["order"])).rename(columns={"site": "call site"})
    t = d.pivot_table(index=["release", "call site"], columns=["trace", "scenario"], values="cell",
                      aggfunc="first")
    t.columns.names = ["creations along", ""]
    return t.reindex(pd.MultiIndex.from_frame(d[["release", "call site"]].drop_duplicates()))


def high_water_note(results: dict) -> str:
    """Which real managers keep a high-water mark; whether the rebuild's counts the same without."""
    have = {
        v: bool(r.rows.loc[r.rows.metric == "manager_high_water_mark", "value"].iloc[0])
        for v, r in real.ran(results).items()
    }
    if not have:
        return "no release ran: nothing to say about the high-water mark"
    same = all(
        rebuild_cell(rebuild_policy(v, s, True), t, p) == rebuild_cell(
            rebuild_policy(v, s, False), t, p) for v in have for s in ("release", *ALT_SITES)
        for t in traces.TRACES for p in SCENARIOS)
    first = next((v for v in installed_releases() if (package_dir(v) / FUSION).is_file()
                  and "_max_token_num_seen" in (package_dir(v) / FUSION).read_text()), None)
    return (f"real manager keeps a high-water mark (_max_token_num_seen)? "
            f"{', '.join(f'{v}: ' + ('yes' if h else 'no') for v, h in have.items())}. The "
            f"rebuild's manager keeps one by default"
            f"{f' (the manager of {first} on)' if first else ''}; with it on, every cell above "
            f"counts {'the same' if same else 'DIFFERENTLY'}.")


CELLS = "(release, call site, trace, scenario) cells"


def compare(full: bool = False) -> None:
    """The notebook's real-SGLang section (``full``: every cell)."""
    from sglab.core.notebook import show_table

    results = real.answers(FIX)
    if full:
        return real.section(FIX, comparison, what=CELLS, results=results)
    print(real.status_lines(results))
    df = comparison(results)
    if len(df):
        show_table(decisions(results))
    real.check_table(df, what=CELLS)
    print(high_water_note(results))


# the fix across the releases, then a released symbol beside the rebuilt one
released = functools.partial(real.released, FIX)
