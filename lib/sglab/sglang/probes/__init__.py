"""Probes: functions ``probe(prepared, params) -> list[dict]`` that run real SGLang code of one release inside a
worker process (:mod:`sglab.sglang.runner`). Each module covers one fix and returns plain rows; the comparison with
the rebuild in :mod:`sglab.fixes` happens in the caller (tests, notebooks), which never imports SGLang."""
