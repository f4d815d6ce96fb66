"""Numbers as a person reads them in the Prefect UI: rounded, with units and percentages.

Every artifact goes through these; raw floats (``7.109127759933472``) never reach a table or a chart label.
"""

from __future__ import annotations

import math

_SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_BYTES = ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB"))


def count(n: float | None) -> str:
    """A whole number with thousands separators: ``12,345``."""
    return "n/a" if n is None else f"{round(n):,}"


def sig(x: float | None, digits: int = 3) -> str:
    """``digits`` significant digits, no trailing zeros, no exponent for everyday magnitudes: ``7.11``, ``0.00745``,
    ``36``, ``1,234``."""
    if x is None or not math.isfinite(x):
        return "n/a"
    if x == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(x)))
    if magnitude >= digits - 1:
        return f"{round(x):,}"
    if magnitude < -4:
        return f"{x:.{digits - 1}e}"
    text = f"{x:.{digits - 1 - magnitude}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def si(x: float | None, digits: int = 3) -> str:
    """Short form for axis ticks and throughput: ``950``, ``12.3k``, ``4.5M``."""
    if x is None or not math.isfinite(x):
        return "n/a"
    for scale, suffix in _SI:
        if abs(x) >= scale:
            return sig(x / scale, digits).replace(",", "") + suffix
    return sig(x, digits)


def size(n: float | None) -> str:
    """Bytes in decimal units: ``812 B``, ``4.1 kB``, ``1.23 MB``."""
    if n is None:
        return "n/a"
    for scale, unit in _BYTES:
        if abs(n) >= scale:
            return f"{sig(n / scale).replace(',', '')} {unit}"
    return f"{round(n)} B"


def pct(share: float | None, digits: int = 1) -> str:
    """A share in [0, 1] as a percentage: ``38.1%``."""
    return "n/a" if share is None or not math.isfinite(share) else f"{100 * share:.{digits}f}%"


def seconds(s: float | None) -> str:
    """A duration: ``0.42 s``, ``12.3 s``, ``4 min 05 s``, ``1 h 02 min``."""
    if s is None or not math.isfinite(s):
        return "n/a"
    if s < 60:
        return f"{sig(s)} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60):02d} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60):02d} min"
