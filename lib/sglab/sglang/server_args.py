"""SGLang's ``ServerArgs`` defaults that several rebuilds share (``srt/server_args.py``)."""


def piecewise_cuda_graph_tokens(max_tokens: int = 4096) -> list[int]:
    """``ServerArgs._generate_piecewise_cuda_graph_tokens``: the token counts that get one piecewise
    capture each: 4..32 step 4, 48..256 step 16, 288..512 step 32, 576..1024 step 64, 1280..4096
    step 256, then step 512, cut at ``max_tokens``."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32)) + list(
        range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(
            4608, max_tokens + 1, 512)))
    return [s for s in sizes if s <= max_tokens]
