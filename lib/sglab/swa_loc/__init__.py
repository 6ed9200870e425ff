"""Notebook 04 · the SWA location preset before decode-graph capture (SGLang #23552, follow-up
#24743); the modules as docs/structure.md lays them out."""
