"""Investigate your own setup: what each fix means for your SGLang release, arguments, traffic and model.

- :mod:`.swa_cost`       your model's sliding-window layout → what the SWA location preset saves per decode step (04)
- :mod:`.widgets`        the same questions as notebook controls, with a static table where nothing is interactive
"""
