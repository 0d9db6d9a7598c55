"""Waiting for health: a crash fails at once, a slow start waits, the budget is a hard limit."""

from __future__ import annotations

import time

import pytest

from dsv4deploy.sglang.health import HealthError, Observation, identity_problems, wait_healthy


def obs(http=0, active="active", sub="running", pid=100, restarts=0):
    return Observation(http=http, active_state=active, sub_state=sub, main_pid=pid, n_restarts=restarts)


def sequence(*items):
    it = iter(items)
    last = [items[-1]]

    def observe():
        try:
            last[0] = next(it)
        except StopIteration:
            pass
        return last[0]
    return observe


def test_port_closed_then_503_then_200():
    result = wait_healthy(sequence(obs(0), obs(0), obs(503), obs(200)), budget_s=10, poll_s=0.01)
    assert result.http == 200


def test_a_crash_fails_at_once_not_after_the_budget():
    start = time.monotonic()
    with pytest.raises(HealthError, match="unit is failed"):
        wait_healthy(sequence(obs(0), obs(0), obs(0, active="failed", sub="failed")), budget_s=60, poll_s=0.01)
    assert time.monotonic() - start < 5


def test_a_restart_by_systemd_counts_as_a_crash():
    with pytest.raises(HealthError, match="restarting it"):
        wait_healthy(sequence(obs(0), obs(0, active="activating", sub="auto-restart", restarts=1)),
                     budget_s=60, poll_s=0.01)


def test_a_new_main_pid_counts_as_a_crash():
    with pytest.raises(HealthError, match="PID 100 to 200"):
        wait_healthy(sequence(obs(503, pid=100), obs(0, pid=200)), budget_s=60, poll_s=0.01)


def test_a_first_read_that_got_no_answer_is_no_baseline():
    """An SSH hiccup on the first poll reads as nothing at all; a unit systemd restarted before
    this deploy (NRestarts 2, kept until reset-failed) is then not a crash."""
    silent = Observation(http=0, active_state="", sub_state="", main_pid=0, n_restarts=0)
    result = wait_healthy(sequence(silent, obs(503, restarts=2), obs(200, restarts=2)), budget_s=10, poll_s=0.01)
    assert result.http == 200
    with pytest.raises(HealthError, match="restarting it"):
        wait_healthy(sequence(silent, obs(503, restarts=2), obs(0, sub="auto-restart", restarts=3)),
                     budget_s=10, poll_s=0.01)


@pytest.mark.slow
def test_never_healthy_ends_at_the_budget():
    start = time.monotonic()
    with pytest.raises(HealthError, match=r"not healthy after 1 s \(last: 503"):
        wait_healthy(sequence(obs(503)), budget_s=1, poll_s=0.05)
    assert time.monotonic() - start < 3


def test_identity_accepts_our_server():
    assert identity_problems(port_pids=[100], main_pid=100, server_info={"model_path": "/m", "tp_size": 4},
                             expected={"model_path": "/m", "tp_size": 4}) == []


def test_identity_detects_a_stale_server_on_the_port():
    problems = identity_problems(port_pids=[999], main_pid=100, server_info={"model_path": "/old"},
                                 expected={"model_path": "/m"})
    assert any("held by PID 999, not by the unit's MainPID 100" in p for p in problems)
    assert any("model_path is '/old', expected '/m'" in p for p in problems)
