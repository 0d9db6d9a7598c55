"""Stand-ins for the host in the tune tests: a table-driven measure and a clock it advances."""

from __future__ import annotations

from dataclasses import dataclass, field

from dsv4deploy.tune.objective import Measurement


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class TableMeasure:
    """measure(candidate, level) from a table keyed by the candidate's overrides (a frozenset of
    items; frozenset() is the base). Each call advances the clock by `cost_s` and is recorded."""

    table: dict
    clock: FakeClock
    cost_s: float = 60.0
    calls: list = field(default_factory=list)
    interrupt_after: int | None = None   # raise KeyboardInterrupt on this call (a cut-off run)

    def __call__(self, candidate, level) -> Measurement:
        if self.interrupt_after is not None and len(self.calls) == self.interrupt_after:
            raise KeyboardInterrupt
        self.calls.append((candidate.id, level.index))
        self.clock.now += self.cost_s
        return measurement(self.table[frozenset(candidate.overrides.items())], level.num_prompts)


def measurement(row, num_prompts: int = 0) -> Measurement:
    """A table row (output tok/s, p99 TTFT ms, p99 TPOT ms, failed requests) as a Measurement."""
    if isinstance(row, Measurement):
        return row
    tp, ttft, tpot, failed = row
    return Measurement(tp, p99_ttft_ms=ttft, p99_tpot_ms=tpot, failed=failed, completed=num_prompts - failed)


def key(**overrides) -> frozenset:
    """key(**{"server.context_length": 8192}) -> the table key of that candidate."""
    return frozenset(overrides.items())
