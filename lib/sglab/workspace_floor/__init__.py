"""Notebook 02: layernorm passes max_token_num=max(x.shape[0], 2048) to the fused AR+norm (#26382)."""
