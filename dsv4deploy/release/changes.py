"""Why this run restarts the server: steps notify what they changed, the way Ansible handlers
read, and the restart, the release record and the gate follow from the reasons.

Every operation here is decided from the host's state read before the run (host/state.py), so
the reasons are known while pyinfra prepares: `make plan` prints them, and a run with none
sends no restart, writes no release and runs no gate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _changes(item: Any) -> bool:
    if isinstance(item, bool) or item is None:
        return bool(item)
    if isinstance(item, str):
        return bool(item)
    return bool(item.will_change)      # a pyinfra OperationMeta


@dataclass
class Changes:
    """Named groups of operations (or plain facts) whose change means a restart."""

    _notes: list[tuple[str, list[Any]]] = field(default_factory=list)

    def notify(self, what: str, *items: Any) -> bool:
        """WHAT changed if any of ITEMS changes (operations, lists of them, bools, reason strings);
        returns whether it did."""
        flat: list[Any] = []
        for item in items:
            flat += item if isinstance(item, list) else [item]
        self._notes.append((what, flat))
        return any(_changes(i) for i in flat)

    @property
    def reasons(self) -> list[str]:
        out = []
        for what, items in self._notes:
            said = [i for i in items if isinstance(i, str) and i]
            if said:
                out += [f"{what}: {s}" for s in said]
            elif any(_changes(i) for i in items):
                out.append(f"{what} changed")
        return out

    def __bool__(self) -> bool:
        return bool(self.reasons)
