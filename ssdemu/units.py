"""Parsing of sizes as the CLI takes them: a number with an optional K/M/G/T suffix (powers of
1024, case-insensitive, an optional trailing B or iB)."""

import re

_SUFFIX = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)


MAX_SIZE = 1 << 60  # 1 EiB: past any media or tier this host could be asked to model


def parse_size(text: str) -> int:
    """'4k' -> 4096, '1M' -> 1048576, '512' -> 512.  Raises ValueError with the offending text
    (also for a size past MAX_SIZE: a typo, not a device)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"bad size {text!r}: expected a number with an optional K/M/G/T suffix")
    n = int(m.group(1)) * _SUFFIX[m.group(2).lower()]
    if n > MAX_SIZE:
        raise ValueError(f"bad size {text!r}: past {MAX_SIZE >> 60} EiB")
    return n


def format_size(n: int) -> str:
    """The shortest exact suffix form: 4096 -> '4K', 1000 -> '1000'."""
    for suffix in ("T", "G", "M", "K"):
        unit = _SUFFIX[suffix.lower()]
        if n and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)
