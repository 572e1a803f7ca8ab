"""The look shared by every figure: one colour per method key, the same in every figure of every
config, and EMA smoothing.

A method's colour comes from its key (`METHOD_COLOURS`: the keys of the shipped configs, chosen so
that methods drawn together, e.g. DAPO, BFS-PO and BFS-PO (prompts) of the toy study, differ in
hue, and their ± std bands stay apart where they overlap). A key of no shipped config gets one of
the colours no shipped key uses, from a hash of the key, so it keeps that colour everywhere. A
config may still set a method's `color`, which wins. Zero-shot is always grey.
"""

from __future__ import annotations

import hashlib

from matplotlib import colormaps, colors

ZERO_SHOT_COLOUR = "#7f7f7f"
# method key (config `methods`) -> colour; the same meaning in every config
METHOD_COLOURS = {
    "dapo": "#1f77b4",  # blue
    "bfspo": "#d62728",  # red
    "bfspo-k1": "#ff7f0e",  # orange
    "bfspo-k2": "#8c564b",  # brown
    "no-bfs": "#9467bd",  # purple
    "global-adv": "#bcbd22",  # olive
    "no-overlong": "#e377c2",  # pink
    "bfspo-prompts": "#2ca02c",  # green
    # the breakdown study's arms (issue 25), drawn with dapo and bfspo
    "bfspo-first": "#17becf",  # cyan
    "dapo-g32": "#393b79",  # navy: a DAPO
    "bfspo-4q": "#7b4173",  # plum
}
# the colours left for other keys: tab20's dark shades that no shipped key uses, then its light ones
PALETTE = [c for c in map(colors.to_hex, colormaps["tab20"].colors[0::2] + colormaps["tab20"].colors[1::2])
           if c not in METHOD_COLOURS.values() and c != ZERO_SHOT_COLOUR]
# EMA smoothing of the training curves: pandas ewm(alpha=EMA_ALPHA), as W&B's "exponential moving average"
EMA_ALPHA = 0.3
# opacity of a ± std band: low enough that two overlapping bands keep both hues
BAND_ALPHA = 0.12


def method_colour(method: dict) -> str:
    """The colour of a method of a table spec ({key, color?}); zero-shot is grey."""
    if method["key"] == "zero-shot":
        return ZERO_SHOT_COLOUR
    if method.get("color"):
        return colors.to_hex(method["color"])
    if method["key"] in METHOD_COLOURS:
        return METHOD_COLOURS[method["key"]]
    return PALETTE[int(hashlib.sha256(method["key"].encode()).hexdigest(), 16) % len(PALETTE)]


def ema(series):
    """The exponential moving average of a pandas Series (alpha EMA_ALPHA, bias-corrected as pandas does)."""
    return series.ewm(alpha=EMA_ALPHA).mean()
