"""Go duration strings ("200ms", "1.5s", "1m30s") as GIE's config fields (metav1.Duration) write them."""

from __future__ import annotations

import re
from typing import Any

_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "\u00b5s": 1e-6,  # micro sign
    "\u03bcs": 1e-6,  # Greek mu
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PART = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Seconds in a Go duration string; ValueError for anything Go's time.ParseDuration rejects."""
    s = text.strip()
    sign = 1.0
    if s and s[0] in "+-":
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise ValueError(f"invalid duration {text!r}")
    total = 0.0
    pos = 0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            raise ValueError(f"invalid duration {text!r} (expected e.g. '200ms', '1.5s', '1m30s')")
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    return sign * total


def duration_seconds(value: Any) -> float:
    """A pydantic before-validator: a Go duration string becomes seconds. Bare numbers are refused
    because their unit would be a guess."""
    if isinstance(value, str):
        return parse_duration(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        raise ValueError(f"a duration is a string with a unit such as '200ms', got the number {value!r}")
    raise ValueError(f"a duration is a string such as '200ms', got {value!r}")
