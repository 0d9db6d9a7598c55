"""The gate client's running rate (client.steady_rate), the number its early stop judges a level
by. The figures are the CI run that failed on stop 25: the 1M-context baseline at C=64 on the twin
decodes one token for each of the 64 slots every ~2.1 s, longer than the 2 s rate window, and a
rate read between two steps came out as 0.5 tok/s instead of the ~30 tok/s plateau."""

from __future__ import annotations

import pytest

from dsv4deploy.gate.client import STALL_S, STEADY_ROUNDS, steady_rate

C = 64
STEP = 2.1            # s per decode step: 64 tokens per step = 30.5 tok/s
TS = 17.284           # all of the first 64 requests stream (the CI run's steady_at_s)
G0 = 64               # their first tokens


def after_steps(n: int, t: float) -> tuple[float, bool]:
    """The rate read at t, n decode steps after the level became steady."""
    return steady_rate(t, G0 + n * C, TS, G0, TS + n * STEP if n else TS, C)


def test_a_read_between_two_steps_is_not_trusted_yet():
    """The CI failure: 2 s after steady, one step not yet landed."""
    rate, settled = after_steps(0, TS + 2.0)
    assert not settled
    rate, settled = after_steps(1, TS + 2.0 + STEP)
    assert not settled                        # one round is not STEADY_ROUNDS
    assert STEADY_ROUNDS == 2


@pytest.mark.parametrize("n", [2, 3, 5, 20])
@pytest.mark.parametrize("late", [0.0, 0.5, 2.0])
def test_the_rate_is_the_plateau_whenever_it_is_read(n, late):
    """Read right at a step or up to a whole step later, the rate is the decode plateau."""
    rate, settled = after_steps(n, TS + n * STEP + late)
    assert settled and rate == pytest.approx(C / STEP)


def test_a_stalled_server_reads_as_slow_once_nothing_came_for_the_stall_time():
    t = TS + 2 * STEP + STALL_S
    rate, settled = after_steps(2, t)
    assert settled and rate == pytest.approx(2 * C / (t - TS))
    rate, settled = after_steps(0, TS + STALL_S)
    assert settled and rate == 0.0


def test_before_the_level_is_steady_the_rate_is_since_the_start_and_not_trusted():
    assert steady_rate(5.0, 40, None, 0, 4.0, C) == (8.0, False)
    assert steady_rate(0.0, 0, None, 0, None, C) == (0.0, False)
    assert steady_rate(TS, G0, TS, G0, TS, C) == (G0 / TS, False)


def test_a_small_level_settles_after_two_tokens_per_slot():
    """C=1: a token every 40 ms; two tokens after steady are enough."""
    assert steady_rate(1.1, 3, 1.0, 1, 1.08, 1) == (pytest.approx(25.0), True)
    assert steady_rate(1.05, 2, 1.0, 1, 1.04, 1)[1] is False
