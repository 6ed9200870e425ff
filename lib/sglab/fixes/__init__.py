"""The upstream mechanisms, PR-era, each with an explicit before/after switch (no measuring here)."""
