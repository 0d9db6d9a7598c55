"""Reading a Prometheus /metrics text (SGLang's replicas, the smg gateway): the one parsing rule
every reader shares."""

from __future__ import annotations

import re


def summed(text: str, pattern: re.Pattern, group: int) -> int | None:
    """The sum, over every label set, of the value that PATTERN (matched against a whole line)
    captures in GROUP; None when no line matches (metrics off, or another server)."""
    total, seen = 0.0, False
    for line in text.splitlines():
        m = pattern.fullmatch(line.strip())
        if m:
            try:
                total += float(m.group(group))
            except ValueError:
                continue
            seen = True
    return int(total) if seen else None
