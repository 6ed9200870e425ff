"""Notebook 01: Kimi-K2.5 wrapper: `.model` property + __setattr__ guard (#26382)."""
