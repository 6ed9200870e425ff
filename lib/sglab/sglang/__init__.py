"""Real SGLang releases side by side, each run in its own subprocess (nothing here imports SGLang
into the caller): pins and install, probes and their answers, each fix's state per release and the
PR hunks, and a release's whole engine on a GPU (``engine``)."""
