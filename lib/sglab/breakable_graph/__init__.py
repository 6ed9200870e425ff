"""Notebook 03: Breakable CUDA graph captures only the layer stack (#24662)."""
