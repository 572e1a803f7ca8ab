"""The look shared by every figure: one colour per method key, the same in every figure of every
config, and EMA smoothing.

A method's colour comes from its key (`METHOD_COLOURS`: the keys of the shipped configs, chosen so
that methods drawn together, e.g. DAPO, BFS-PO and BFS-PO (prompts) of the toy study, differ in
hue, and their ± std bands stay apart where they overlap). A config may still set a method's
`color`, which wins. Zero-shot is always grey. A key of no shipped config takes, from the
qualitative pool `PALETTE`, the colour farthest (`colour_distance`) from every colour its table
already uses (`distinct_colours`, in the table's order of methods), so that it is never a shade of
another method's colour; every figure of the table gives it that colour. The paired figure gives
each contrast its method's colour, and a contrast whose method an earlier contrast already drew
the pool colour farthest from the others.
"""

from __future__ import annotations

from matplotlib import colormaps, colors

ZERO_SHOT_COLOUR = "#7f7f7f"
BACKGROUND = "#ffffff"  # a new colour keeps away from it too: no pale shade
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
    # the recipe sweep's settings (issue 44, config/toy-recipe.yaml): tab20b's darker shades
    "dapo-win": "#5254a3",
    "dapo-lr1": "#6b6ecf",
    "dapo-b96m96": "#637939",
    "dapo-b96m48": "#8ca252",
    "dapo-b96m48-win": "#8c6d31",
    "dapo-t07": "#bd9e39",
    "dapo-m16": "#843c39",
    "dapo-m16-lr1": "#a55194",
    "bfspo-lr1": "#ad494a",
    "bfspo-b96m48-win": "#ce6dbd",
    # the 30- and 60-step studies (config/toy-paper-reading.yaml, toy-starts*.yaml)
    "dapo-s30": "#3182bd",
    "bfspo-s30": "#e6550d",
    "dapo-s60": "#e7969c",
    "bfspo-s60": "#a63603",
    # the earlier G = 8 recipe's studies under keys of their own (config/toy-seeds.yaml, toy-study.yaml)
    "dapo-g8s30": "#6baed6",
    "bfspo-g8s30": "#fd8d3c",
    "dapo-g8s20": "#756bb1",
    "bfspo-g8s20": "#d6616b",
    "bfspo-prompts-g8s20": "#31a354",
}
MAX_LUMINANCE = 0.45  # a pool colour darker than this (WCAG relative luminance) shows as a line on white


def luminance(colour: str) -> float:
    """WCAG 2's relative luminance of a colour: 0 black, 1 white."""
    def linear(x):
        return x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4
    r, g, b = map(linear, colors.to_rgb(colour))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


# the qualitative pool for other keys: the colours of tab20, Dark2, Set1 and tab20b that read as lines
# on white, but no grey (zero-shot's)
PALETTE = list(dict.fromkeys(
    c for name in ("tab20", "Dark2", "Set1", "tab20b") for c in map(colors.to_hex, colormaps[name].colors)
    if luminance(c) <= MAX_LUMINANCE and len({round(x, 2) for x in colors.to_rgb(c)}) > 1))
# EMA smoothing of the training curves: pandas ewm(alpha=EMA_ALPHA), as W&B's "exponential moving average"
EMA_ALPHA = 0.3
# opacity of a ± std band: low enough that two overlapping bands keep both hues
BAND_ALPHA = 0.12


def method_colour(method: dict) -> str | None:
    """The own colour of a method of a table spec ({key, color?}): its config's `color`, its key's in
    METHOD_COLOURS, grey for zero-shot; None for any other key (`distinct_colours` picks one)."""
    if method["key"] == "zero-shot":
        return ZERO_SHOT_COLOUR
    if method.get("color"):
        return colors.to_hex(method["color"])
    return METHOD_COLOURS.get(method["key"])


def colour_distance(a: str, b: str) -> float:
    """How far apart two colours look: the "redmean" weighted RGB distance (0 to about 765)."""
    (r1, g1, b1), (r2, g2, b2) = ([255 * x for x in colors.to_rgb(c)] for c in (a, b))
    red = (r1 + r2) / 2
    return ((2 + red / 256) * (r1 - r2) ** 2 + 4 * (g1 - g2) ** 2 + (2 + (255 - red) / 256) * (b1 - b2) ** 2) ** 0.5


def distinct_colours(preferred: list[str | None]) -> list[str]:
    """A colour per item, in order: its preferred colour where no earlier item has taken it (preferred
    colours are placed first), else the PALETTE colour farthest from every colour taken so far and
    from the white background (the first of the pool on a tie), so the same list always gives the
    same colours."""
    out = [None] * len(preferred)
    for i, c in enumerate(preferred):
        if c is not None and c not in out:
            out[i] = c
    for i in range(len(out)):
        if out[i] is None:
            taken = [BACKGROUND] + [c for c in out if c is not None]
            out[i] = max(PALETTE, key=lambda c: min((colour_distance(c, t) for t in taken), default=0.0))
    return out


def method_colours(methods: list[dict]) -> dict[str, str]:
    """method key -> its colour in every figure of a table with these methods (in the table's order)."""
    return dict(zip([m["key"] for m in methods], distinct_colours([method_colour(m) for m in methods])))


def ema(series):
    """The exponential moving average of a pandas Series (alpha EMA_ALPHA, bias-corrected as pandas does)."""
    return series.ewm(alpha=EMA_ALPHA).mean()
