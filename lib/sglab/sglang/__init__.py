"""Real SGLang releases, side by side, each run in its own subprocess; nothing here imports SGLang
into the calling process.

- :mod:`~sglab.sglang.releases`   pinned releases and where they live (``.sglang/releases/<V>/``)
- :mod:`~sglab.sglang.install`    ``sglab real install``: pip into target folders, in parallel
- :mod:`~sglab.sglang.bootstrap`  the stand-ins a release needs on this machine
- :mod:`~sglab.sglang.runner`     one worker per release for all its calls (each fix's probes)
- :mod:`~sglab.sglang.upstream`   which state each release is in, from each fix's source check
- :mod:`~sglab.sglang.hunks`      the PR hunks beside the rebuild
- :mod:`~sglab.sglang.compare`    rebuild and release side by side, as tables
- :mod:`~sglab.sglang.engine`     a release's whole engine on a GPU (``sglab engine``)
"""
