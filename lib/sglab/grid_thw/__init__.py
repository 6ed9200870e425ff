"""Notebook 05: Kimi-K2.5 grid on the CPU under image_grid_thw (#22858)."""
