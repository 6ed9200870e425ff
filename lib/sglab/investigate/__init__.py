"""Investigate your own setup: what each fix means for your SGLang release, arguments, traffic and model.

- :mod:`.swa_cost`       your model's sliding-window layout → what the SWA location preset saves per decode step (04)
- :mod:`.capture_sizes`  your server arguments → the capture sizes each release uses, and which the reduce-scatter
                         refuses (06); :mod:`.capture_probe` is its half that runs inside each release's worker
- :mod:`.widgets`        the same questions as notebook controls, with a static table where nothing is interactive
"""
