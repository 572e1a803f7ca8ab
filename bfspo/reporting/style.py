"""The look shared by every figure: one colour per method, the same in every figure, and EMA smoothing.

A method's colour is `color` in the config's `methods` entry when set; otherwise the workflow's
spec gives its position in the config's `methods` (`color_index`), which picks from 20 distinct
colours (tab10, then tab20's light shades), so ten methods never share one. A spec without either
(a hand-written one) derives the colour from the method key's hash. Zero-shot is always grey.
"""

from __future__ import annotations

import hashlib

from matplotlib import colormaps, colors

ZERO_SHOT_COLOUR = "#7f7f7f"
PALETTE = [colors.to_hex(c) for c in colormaps["tab10"].colors] + \
    [colors.to_hex(c) for c in colormaps["tab20"].colors[1::2]]
# EMA smoothing of the training curves: pandas ewm(alpha=EMA_ALPHA), as W&B's "exponential moving average"
EMA_ALPHA = 0.3


def method_colour(method: dict) -> str:
    """The colour of a method of a table spec ({key, color?, color_index?}); zero-shot is grey."""
    if method["key"] == "zero-shot":
        return ZERO_SHOT_COLOUR
    if method.get("color"):
        return colors.to_hex(method["color"])
    if method.get("color_index") is not None:
        return PALETTE[method["color_index"] % len(PALETTE)]
    return PALETTE[int(hashlib.sha256(method["key"].encode()).hexdigest(), 16) % len(PALETTE)]


def ema(series):
    """The exponential moving average of a pandas Series (alpha EMA_ALPHA, bias-corrected as pandas does)."""
    return series.ewm(alpha=EMA_ALPHA).mean()
