"""How the report writes numbers: one place, so the tests can rebuild the exact strings the
report prints."""

from __future__ import annotations

import json
import math
from typing import Any

from harness.report.stats import Interval
from harness.report.studydata import CellRow


def fmt(x: float | None) -> str:
    """A number with 3 significant digits; "—" for None or NaN (never "nan" in a report)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "—"
    if math.isinf(x):
        return "∞" if x > 0 else "−∞"
    if 1e3 <= abs(x) < 1e6:
        return f"{x:.0f}"
    return f"{x:.3g}"


def fmt_interval(iv: Interval | None) -> str:
    """``point [low, high]`` with :func:`fmt` numbers."""
    if iv is None:
        return "—"
    if math.isnan(iv.point):
        return "—"
    return f"{fmt(iv.point)} [{fmt(iv.low)}, {fmt(iv.high)}]"


def fmt_pct(x: float | None) -> str:
    """A probability as a whole percentage, "83 %"."""
    if x is None or math.isnan(x):
        return "—"
    return f"{100.0 * x:.0f} %"


def fmt_pct_interval(iv: Interval | None) -> str:
    """A probability interval as percentages, "83 % [61 %, 97 %]"."""
    if iv is None or math.isnan(iv.point):
        return "—"
    return f"{fmt_pct(iv.point)} [{fmt_pct(iv.low)}, {fmt_pct(iv.high)}]"


def _fmt_duration(seconds: float) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "—"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    if h:
        return f"{h} h {m:02d} min {sec:02d} s"
    if m:
        return f"{m} min {sec:02d} s"
    return f"{seconds:.1f} s"


def value_str(v: Any) -> str:
    """A configuration value or a grid level as exact text: a string as it is, anything else in
    JSON (``str()`` where JSON cannot write it).  Hashable, so it also keys a level (lists and
    dicts are levels too), and it is what runs.csv writes; the report's prose spells a level as
    the cell labels do instead (:func:`level_str`)."""
    if isinstance(v, str):
        return v
    try:
        return json.dumps(v, default=str)
    except (TypeError, ValueError):
        return str(v)


def _code(text: str) -> str:
    """Inline code span (labels and keys), with backticks in the text made harmless and line
    breaks made spaces (a span cannot cross a line that starts a block)."""
    one_line = " ".join(str(text).replace("`", "'").splitlines())
    return "`" + one_line + "`"


def _clip_triple(r: CellRow) -> str:
    return f"{fmt(r.clipfrac_low)} / {fmt(r.clipfrac_high)} / {fmt(r.dual_clipfrac)}"
