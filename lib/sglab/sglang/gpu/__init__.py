"""Real SGLang on GPUs, recorded like every other run (``sglab real gpu``):
:mod:`~sglab.sglang.gpu.record` runs each fix's GPU plan, one worker subprocess per release;
:mod:`~sglab.sglang.gpu.graphs` measures captured graphs (kernel nodes, profiled kernels, replay
times) inside a worker. Nothing here imports SGLang into the calling process."""
