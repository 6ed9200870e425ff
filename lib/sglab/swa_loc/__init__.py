"""Notebook 04: SWA location preset before decode-graph capture (#23552, #24743)."""
