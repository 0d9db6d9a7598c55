"""Waiting for SGLang to come up, and proving it is the server we started.

Loading 149 GiB of weights and capturing CUDA graphs takes many minutes, so the budget is
long; but a unit that crashed must fail at once, with its journal, instead of waiting the
budget out. Each poll reads the HTTP status and the unit's state together.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from rich.console import Console



class HealthError(Exception):
    """The server did not become healthy: crashed, or out of time. The message says which."""


@dataclass(frozen=True)
class Observation:
    http: int                 # 0 = connection refused / no answer
    active_state: str
    sub_state: str
    main_pid: int
    n_restarts: int

    @property
    def phase(self) -> str:
        if self.http == 0:
            return "port closed (loading weights)"
        if self.http == 503:
            return "503 (warming up)"
        return str(self.http)


def crashed(first: Observation, now: Observation) -> str | None:
    """Why the unit is no longer the process we are waiting for, if it is not."""
    if now.active_state in ("failed", "inactive"):
        return f"unit is {now.active_state} ({now.sub_state})"
    if now.sub_state == "auto-restart" or now.n_restarts > first.n_restarts:
        return f"unit crashed and systemd is restarting it (restarts: {now.n_restarts})"
    if first.main_pid and now.main_pid and now.main_pid != first.main_pid:
        return f"server process changed from PID {first.main_pid} to {now.main_pid} (it crashed)"
    return None


def wait_healthy(observe: Callable[[], Observation], budget_s: float, poll_s: float = 2.0,
                 console: Console | None = None) -> Observation:
    """Poll until HTTP 200; raise HealthError on a crash at once, or when the budget is spent."""
    # imported here, not with the module: a deploy imports this before its read of the host, and
    # waits for health only after the restart, while the server starts (0.03 s off every run)
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    from tenacity import RetryError, Retrying, retry_if_result, stop_after_delay, wait_fixed

    console = console or Console(stderr=True)
    start = time.monotonic()
    first = observe()

    def check() -> Observation:
        nonlocal first
        obs = observe()
        if not first.active_state:      # the first read said nothing (no answer): the baseline is this one
            first = obs
        reason = crashed(first, obs)
        if reason:
            raise HealthError(reason)
        progress.update(task, description=f"waiting for /health: {obs.phase}")
        return obs

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        task = progress.add_task(f"waiting for /health: {first.phase}", total=None)
        if first.http == 200 and not crashed(first, first):
            return first
        remaining = max(budget_s - (time.monotonic() - start), 0)
        retrying = Retrying(stop=stop_after_delay(remaining), wait=wait_fixed(poll_s),
                            retry=retry_if_result(lambda o: o.http != 200))
        try:
            return retrying(check)
        except RetryError as exc:
            last = exc.last_attempt.result()
            raise HealthError(f"not healthy after {budget_s:.0f} s (last: {last.phase})") from None


def identity_problems(*, port_pids: list[int | None], main_pid: int, server_info: dict | None,
                      expected: dict) -> list[str]:
    """Is the process answering on the port the unit's, serving the rendered model and args?"""
    problems = []
    pids = {p for p in port_pids if p}
    if not pids:
        problems.append("nothing is listening on the port")
    elif main_pid not in pids:
        problems.append(f"the port is held by PID {', '.join(map(str, sorted(pids)))}, not by the unit's "
                        f"MainPID {main_pid}: a stale server is answering")
    if server_info is None:
        problems.append("/server_info did not answer")
        return problems
    for key, want in expected.items():
        got = server_info.get(key)
        if got != want:
            problems.append(f"/server_info {key} is {got!r}, expected {want!r}")
    return problems
