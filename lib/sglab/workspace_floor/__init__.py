"""Notebook 02 · the allreduce-fusion workspace floor: layernorm passes
``max_token_num=max(x.shape[0], 2048)`` to the fused all-reduce + RMSNorm (#26382, part B)."""
