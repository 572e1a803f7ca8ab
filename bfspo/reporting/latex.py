"""The marks the tables print, and text escaped for LaTeX (tables.py and paired.py write .tex files)."""

from __future__ import annotations

YES, NO = "✓", "✗"
LATEX_SUBS = [("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("#", r"\#"), ("_", r"\_"),
              ("±", r"$\pm$"), (YES, r"\checkmark"), (NO, r"$\times$")]


def latex_escape(text: str) -> str:
    for old, new in LATEX_SUBS:
        text = text.replace(old, new)
    return text
