"""The real SGLang workspace decisions beside the rebuild's simulation, trace by trace (#26382 B).

Each release runs its own call site (0.5.12.post1: no ``max_token_num``, the callee's 2048 and its assert;
0.5.13: ``max(x.shape[0], 2048)``) and, through the same real callee and manager, the alternative floors the
notebook weighs (:data:`ALT_SITES`), along both stored traces, cold and pre-initialised (probe:
:mod:`sglab.sglang.probes.workspace_floor`; FlashInfer's creation replaced by a recorder). The rebuild runs
:func:`sglab.fixes.workspace_floor.simulate` with the policy of the same call site and the manager the release
has: neither 0.5.12.post1 nor 0.5.13 keeps a high-water mark (the probe reads it off the real manager), so the
rebuild's manager runs with ``high_water`` set as the release's. Steps, sizes and refused calls must be equal.
"""

from __future__ import annotations

from sglab.workspace_floor.sglang import FIX

import dataclasses

from sglab.fixes import workspace_floor as wf

from sglab.experiments.workspace_floor.traces import trace_tokens

RELEASES, PROBE = FIX.probe.releases, FIX.probe.fn  # the record's probe (sglab.workspace_floor.sglang)
OWN_POLICY = {"0.5.12.post1": "before_pr", "0.5.13": "floor_2048"}   # the rebuild's name for each call site
ALT_SITES = ("floor_0", "floor_1024")
SCENARIOS = (0, 2048)
WORLD_SIZE, HIDDEN = 2, 7168
RECORDED = "workspace_floor"                 # data/recorded/real_workspace_floor/


def params(traces=None) -> dict:
    from sglab.experiments.workspace_floor import TRACES

    names = traces or TRACES
    return {"traces": {t: [int(x) for x in trace_tokens(t)] for t in names}, "sites": ["release", *ALT_SITES],
            "pre_initialize": list(SCENARIOS), "world_size": WORLD_SIZE, "hidden": HIDDEN}


def probe(releases=RELEASES, traces=None) -> dict:
    """{release: ProbeResult} of the real probe (one subprocess per release)."""
    from sglab.sglang import compare_old as report

    return report.run(releases, PROBE, params(traces))


def rebuild_policy(release: str, site: str, high_water: bool) -> wf.Policy:
    """The rebuild's policy for a real call site, with the release's manager (``high_water`` as it has)."""
    if site == "release":
        return dataclasses.replace(wf.POLICIES[OWN_POLICY[release]], high_water=high_water)
    floor = int(site.removeprefix("floor_"))
    named = next((p for p in wf.POLICIES.values() if p.floor == floor and p.high_water), None)
    return dataclasses.replace(named or wf.Policy(site, floor), high_water=high_water)


def rebuild_cell(policy: wf.Policy, trace: str, pre: int) -> dict:
    mgr, refused = wf.simulate(policy, trace_tokens(trace), world_size=WORLD_SIZE, hidden_dim=HIDDEN,
                               pre_initialize=pre or None)
    events = [e for e in mgr.events if e.step >= 0]
    return {"recreations": len(events), "sizes": [e.max_token_num for e in events],
            "steps": [e.step for e in events], "refused_calls": refused}


def _real_cells(result) -> dict:
    """{(trace, site, scenario): {metric: value}} of one release's rows."""
    cells: dict = {}
    for r in result.rows.itertuples():
        if r.trace:
            cells.setdefault((r.trace, r.site, r.scenario), {})[r.metric] = r.value
    return cells


def _site_label(result, site: str) -> str:
    if site != "release":
        return f"max_token_num=max(x.shape[0], {site.removeprefix('floor_')}) (probe's call)"
    text = result.rows.loc[result.rows.metric == "call_site", "value"].iloc[0]
    return f"{text} (its own)" if text != "(none)" else "no max_token_num (its own)"


def comparison(results: dict):
    """One row per (release, call site, trace, scenario): real and rebuilt re-creations, sizes and refused calls,
    ``agrees`` when steps, sizes and refused calls are all equal."""
    import pandas as pd

    rows = []
    for release, result in results.items():
        if not result.ok:
            continue
        for (trace, site, scenario), real in _real_cells(result).items():
            hwm = bool(real["manager_high_water_mark"])
            policy = rebuild_policy(release, site, hwm)
            reb = rebuild_cell(policy, trace, 0 if scenario == "cold" else int(scenario.split("_")[1]))
            agrees = all(real[k] == reb[k] for k in ("steps", "sizes", "refused_calls"))
            rows.append({"release": release, "call site": _site_label(result, site), "trace": trace,
                         "scenario": scenario, "real re-creations": real["recreations"], "real sizes": real["sizes"],
                         "real refused": real["refused_calls"],
                         "rebuild variant": f"{policy.name}{'' if hwm else ', no high-water mark'}",
                         "rebuild re-creations": reb["recreations"], "rebuild sizes": reb["sizes"],
                         "rebuild refused": reb["refused_calls"], "agrees": agrees})
    return pd.DataFrame(rows)


def first_high_water_release() -> str | None:
    """The oldest installed release whose ``FlashInferWorkspaceManager`` keeps ``_max_token_num_seen`` (read in
    its ``layers/flashinfer_comm_fusion.py``, not imported), or None."""
    from sglab.sglang.releases import installed_releases, package_dir

    for v in installed_releases():
        path = package_dir(v) / "srt" / "layers" / "flashinfer_comm_fusion.py"
        if path.is_file() and "_max_token_num_seen" in path.read_text():
            return v
    return None


def high_water_note(results: dict) -> str:
    """Which real managers keep a high-water mark, and whether the rebuild's (which keeps one) counts the same
    on the releases' own call sites: computed, not asserted."""
    have = {v: bool(r.rows.loc[r.rows.metric == "manager_high_water_mark", "value"].iloc[0])
            for v, r in results.items() if r.ok}
    if not have:
        return "no release ran: nothing to say about the high-water mark"
    same = all(rebuild_cell(rebuild_policy(v, s, True), t, p) == rebuild_cell(rebuild_policy(v, s, False), t, p)
               for v in have for s in ("release", *ALT_SITES) for t in params()["traces"] for p in SCENARIOS)
    parts = ", ".join(f"{v}: {'yes' if h else 'no'}" for v, h in have.items())
    first = first_high_water_release()
    since = f" (the manager of {first} on)" if first else ""
    return (f"real manager keeps a high-water mark (_max_token_num_seen)? {parts}. The rebuild's manager keeps "
            f"one by default{since}; with it on, every cell above counts {'the same' if same else 'DIFFERENTLY'}.")
