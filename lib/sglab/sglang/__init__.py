"""Real SGLang releases side by side, each run in its own subprocess (nothing here imports SGLang
into the caller): the pins and their install (``releases``, ``install``, ``bootstrap``), the probes
(``runner``, ``store``, ``compare``), each fix's state per release and the PR hunks (``upstream``,
``wheels``, ``hunks``, ``codepath``), and a release's whole engine on a GPU (``engine``).
"""
