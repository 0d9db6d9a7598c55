"""A fault's row of the table: its cells, what a run's output says it did, and a fault of many
cases (6, 8, 9, 10) summed up into one row the same way for each.

A strike that did not land (its step never came, or the run ended first) is neither recovered
nor a failure to recover: the row says "DID NOT STRIKE" and is not counted as recovered, so that
`faults: N/N recovered` means every listed strike struck and was recovered from."""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass
class Row:
    number: str
    fault: str
    strikes: str = ""
    did: str = ""
    serving: str = ""
    history: str = ""
    lost: str = ""
    recover_s: float | None = None
    recovered: bool = False
    why_not: list[str] = field(default_factory=list)
    not_struck: list[str] = field(default_factory=list)     # strikes that did not land (cut_missed)
    details: list[str] = field(default_factory=list)
    outputs: dict[str, str] = field(default_factory=dict)   # the runs' output, for tests and debugging

    def cells(self) -> list[str]:
        t = "-" if self.recover_s is None else f"{self.recover_s:.1f}"
        return [self.number, self.fault, self.strikes, self.did, self.serving, self.history, self.lost, t,
                self._said("yes", "NO: ", 160)]

    def verdict(self) -> str:
        """How a case's detail line ends."""
        return self._said("recovered", "NOT: ", 200)

    def _said(self, ok: str, not_ok: str, width: int) -> str:
        if self.not_struck:
            return ("DID NOT STRIKE: " + "; ".join(self.not_struck))[:width]
        return ok if self.recovered else not_ok + "; ".join(self.why_not)[:width]

    def missed(self, why: str) -> None:
        """A strike of this row did not land (WHY: tool.cut_missed): the row is not recovered."""
        self.not_struck.append(why)
        self.recovered = False


def add_case(row: Row, case: Row, line: str, outputs: dict[str, str]) -> None:
    """One case of a many-case fault: its detail line, its runs' output, what went wrong in it."""
    row.details.append(f"{line}  {case.verdict()}")
    row.outputs.update(outputs)
    row.why_not += case.why_not
    row.not_struck += case.not_struck


def fold(row: Row, cases: list[Row]) -> Row:
    """A many-case row ends as its last case did, recovers as slowly as its slowest case, and is
    recovered when nothing went wrong in any."""
    if cases:
        row.serving, row.history, row.lost = cases[-1].serving, cases[-1].history, cases[-1].lost
    row.recover_s = max((c.recover_s or 0 for c in cases), default=0) or None
    row.recovered = not row.why_not and not row.not_struck
    return row


def summary(rows: list[Row]) -> str:
    """The matrix's last line: `faults: N/M recovered`, and the rows whose strikes did not land
    (said loudly: such a row proves nothing either way)."""
    line = f"faults: {sum(r.recovered for r in rows)}/{len(rows)} recovered"
    missed = [r for r in rows if r.not_struck]
    if missed:
        line += (f"; {sum(len(r.not_struck) for r in missed)} strike(s) DID NOT STRIKE "
                 f"(fault {', '.join(r.number for r in missed)})")
    return line


# What a run's output says it did, most telling first (one line of the table).
_DID = [
    (r"another deploy holds the lock on this host: PID \d+", "refused: another deploy holds the lock ({m})"),
    (r"preflight refused the host:\s*\n\s*- (.+)", "preflight refused: {g}"),
    (r"rollback to release \d+ failed: .+|release \d+ cannot be restored: .+", "{m}"),
    (r"rolled back: release \d+ \(restores \d+", "{m})"),
    (r"failed the smoke gate: (.+)", "gate failed: {g}"),
    (r"release \d+ \([^)]*\) failed: (.+)", "failed: {g}"),
    (r"release (\d+) deployed:", "release {g} deployed"),
    (r"No space left on device", "stopped at the weights push: No space left on device"),
    (r"checkpoint at \S+ is incomplete: .+", "{m}"),
]


def did(output: str) -> str:
    found = []
    for pattern, fmt in _DID:
        m = re.search(pattern, output)
        if m:
            g = m.group(1) if m.groups() else m.group(0)
            found.append(fmt.format(m=m.group(0).strip(), g=g.strip())[:110])
    if not found:
        return "exit 0, nothing to do" if not output.strip() else "-"
    return "; ".join(found[:2])
