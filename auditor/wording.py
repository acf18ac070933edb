"""How figures read, in one place: ms, %, bytes, rank lists, durations and severity words.

The findings' words (:mod:`auditor.report.phrasing`) are written with these, and every renderer
(the terminal verdict, the live panel, the HTML page, ``compare``) writes its cells with them, so
a figure reads the same wherever it appears. A bottom-level module: it imports nothing from
:mod:`auditor`, so any layer may import it (the analysis keeps a few short measured notes in
its evidence with it).

Two conventions: prose (a finding's sentence) says ``n/a`` for what is unknown and carries the unit
(``12 ms``, ``1.5 GiB``); a table cell says ``-`` (:data:`MISSING`) for what was not measured,
never 0, and leaves the unit to its column title (``12.3`` under ``step ms``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, TypeGuard

# A cell for what was not measured, and for a rank without enough steps yet.
MISSING = "-"
PENDING = "..."
GIB = 1024**3
MIB = 1024**2


def is_number(value: Any) -> TypeGuard[float]:
    """A real number (int or float, not a bool): what a measured figure is."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# --------------------------------------------------------------------------------------------
# prose (the rules' sentences)


def fmt_ms(seconds: float | None) -> str:
    """Seconds as whole milliseconds with the unit (``136 ms``); ``n/a`` when unknown."""
    return "n/a" if seconds is None else f"{seconds * 1e3:.0f} ms"


def fmt_bytes(n: float | None) -> str:
    """Bytes in the largest binary unit that keeps a figure >= 1 (small models read in KiB)."""
    if n is None:
        return "n/a"
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_gib(n_bytes: float | None) -> str:
    """Bytes in GiB with one decimal (``79.6 GiB``); ``n/a`` when unknown."""
    return "n/a" if n_bytes is None else f"{n_bytes / GIB:.1f} GiB"


def ranks_text(ranks: Iterable[int]) -> str:
    """``rank 3`` or ``ranks 1, 3, 5`` (sorted)."""
    rs = sorted(int(r) for r in ranks)
    return ("rank " if len(rs) == 1 else "ranks ") + ", ".join(str(r) for r in rs)


def fmt_duration(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def fmt_speedup(speedup: float, digits: int = 1) -> str:
    """A speed-up factor: ``1.5x``."""
    return f"{speedup:.{digits}f}x"


def fmt_predicted(speedup: float, span: Any = None, digits: int = 1) -> str:
    """A predicted speed-up with the range it is sure of: ``4.2x (3.8-5.0x)``; the figure alone
    (``4.2x``) where there is no range, or one that rounds to a single figure."""
    point = fmt_speedup(speedup, digits)
    if isinstance(span, (tuple, list)) and len(span) == 2 and all(map(is_number, span)):
        lo, hi = f"{span[0]:.{digits}f}", f"{span[1]:.{digits}f}"
        if lo != hi:
            return f"{point} ({lo}-{hi}x)"
    return point


def fmt_expected(speedup: float, span: Any = None) -> str:
    """What a fix is expected to give: :func:`fmt_predicted`, ``about 4.2x`` without a range."""
    said = fmt_predicted(speedup, span)
    return said if "(" in said else f"about {said}"


# Speed-ups below this are not worth naming next to a finding.
NAMED_SPEEDUP = 1.02


def speedup_worth_naming(speedup: Any) -> TypeGuard[float]:
    """A predicted speed-up large enough to say (not ``1.0x``)."""
    return is_number(speedup) and speedup >= NAMED_SPEEDUP


def severity_change(before: Any, after: Any) -> str:
    """``warning`` where it stayed; ``critical -> warning`` where it changed."""
    return str(after) if before == after else f"{before} -> {after}"


def finding_tag(kind: Any, severity: Any) -> str:
    """A finding named with its severity: ``data_starvation (critical)``."""
    return f"{kind} ({severity})"


# --------------------------------------------------------------------------------------------
# table cells ("-" when not measured, the unit in the column title)


def fmt_ms_value(seconds: float | None) -> str:
    """Seconds as a millisecond figure without the unit: ``136``, ``12.3``; ``-`` if unknown."""
    if seconds is None:
        return MISSING
    ms = seconds * 1e3
    return f"{ms:.0f}" if abs(ms) >= 100 else f"{ms:.1f}"


def fmt_pct(ratio: float | None) -> str:
    """A ratio in 0..1 as a whole percentage (``12%``); ``-`` when not measured."""
    return MISSING if ratio is None else f"{ratio * 100:.0f}%"


def fmt_share(value: Any) -> str:
    """:func:`fmt_pct` of anything: ``-`` for whatever is not a number."""
    return fmt_pct(float(value)) if is_number(value) else MISSING


def fmt_rate(value: float | None) -> str:
    """A rate (samples/s): whole above 100, one decimal below."""
    if value is None:
        return MISSING
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def fmt_flops(value: Any, unit: str = "") -> str:
    """FLOPs (or FLOP/s) with an SI prefix: ``312T``, ``4.1G``, ``950M`` (``unit`` after it:
    ``312 TFLOP/s``); ``-`` for whatever is not a number."""
    if not is_number(value):
        return MISSING
    v = float(value)
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            figure = v / scale
            text = f"{figure:.0f}" if abs(figure) >= 10 else f"{figure:.1f}"
            return f"{text} {prefix}{unit}" if unit else f"{text}{prefix}"
    return f"{v:.0f} {unit}" if unit else f"{v:.0f}"


def fmt_batch(value: float | None) -> str:
    """A median batch size: whole when it is, else one decimal."""
    if value is None:
        return MISSING
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def fmt_count(value: Any) -> str:
    return MISSING if value is None else str(value)


def fmt_size(n_bytes: Any) -> str:
    """Bytes as :func:`fmt_bytes` writes them; ``-`` when not measured."""
    return fmt_bytes(float(n_bytes)) if is_number(n_bytes) else MISSING


def fmt_mib(n_bytes: Any) -> str:
    """Bytes as whole MiB without the unit; ``-`` when not measured."""
    return MISSING if n_bytes is None else f"{n_bytes / MIB:.0f}"


def fmt_cores(value: Any, digits: int = 2) -> str:
    """CPU cores (``0.85``); ``-`` when not measured."""
    return MISSING if value is None else f"{value:.{digits}f}"


def fmt_setting(value: Any) -> str:
    """A loader setting: ``on``/``off`` for a flag, ``-`` for none."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return MISSING if value is None else str(value)


def short_host(host: str, limit: int = 12) -> str:
    """The host name without its domain, cut to ``limit`` characters."""
    if not host:
        return MISSING
    name = host if _is_ip(host) else host.split(".", 1)[0]
    return name if len(name) <= limit else name[: limit - 1] + "~"


def _is_ip(host: str) -> bool:
    parts = host.split(".")
    return len(parts) == 4 and all(p.isdigit() for p in parts)


def finite_or_zero(value: Any) -> float:
    """A measured number, or 0.0 for null (plots stack measured figures only)."""
    if not is_number(value):
        return 0.0
    v = float(value)
    return v if math.isfinite(v) else 0.0
