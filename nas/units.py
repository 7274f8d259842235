"""Human sizes such as ``113M``, ``1.2B`` or ``500k`` for parameter and token budgets."""

from __future__ import annotations

import math
import re

from nas.errors import UsageError

_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmbgt]?)\s*$", re.IGNORECASE)


def parse_size(text: str | int, what: str = "size") -> int:
    """``"113M" -> 113_000_000``; ``"1.2B" -> 1_200_000_000``; plain integers pass through."""
    if isinstance(text, bool):
        raise UsageError(f"{what} {text!r} is not a size")
    if isinstance(text, int):
        value = text
    else:
        match = _PATTERN.match(str(text))
        if not match:
            raise UsageError(
                f"{what} {text!r} is not a size: use an integer or a number with k, M or B (e.g. 500k, 113M, 1.2B)"
            )
        number = float(match.group(1)) * _SUFFIX[match.group(2).lower()]
        if not math.isfinite(number) or number > 10**15:
            raise UsageError(f"{what} {text!r} is too large: at most 1000T")
        value = round(number)
        if value <= 0 < number:  # 0.4, 1e-3k: a fraction of one
            raise UsageError(f"{what} {text!r} must be at least 1 (it rounds to {value})")
        if abs(number - value) > 1e-9 * number:  # 1.5, 1.2345k: refused as typed, not rounded and refused as 2
            raise UsageError(f"{what} {text!r} is {number:g}, not a whole number: give a count (e.g. {value})")
    if value <= 0:
        raise UsageError(f"{what} {text!r} must be positive")
    return value


def format_size(n: int | float) -> str:
    """``113_000_000 -> "113.0M"``: short, for tables and logs."""
    n = float(n)
    for suffix, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.1f}{suffix}"
    return f"{n:.0f}"


def format_duration(seconds: float) -> str:
    """``75 -> "1m15s"``, ``3720 -> "1h02m"``: an ETA or an elapsed time on a progress line."""
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"
