"""SGLang's ``ServerArgs`` defaults that several rebuilds share (``srt/server_args.py``)."""


def piecewise_cuda_graph_tokens(max_tokens: int = 4096) -> list[int]:
    """``ServerArgs._generate_piecewise_cuda_graph_tokens``: a piecewise capture per count."""
    sizes = (*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
             *range(1280, 4097, 256), *range(4608, max_tokens + 1, 512))
    return [s for s in sizes if s <= max_tokens]
