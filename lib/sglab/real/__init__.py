"""Real SGLang releases, side by side."""
