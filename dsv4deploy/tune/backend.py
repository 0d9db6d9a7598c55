"""Where the host plugs in: `open_backend` is the one function the on-host measurement replaces.

Everything else in dsv4deploy/tune is pure and runs without a host; only this module talks to
one. Until the rollout-backed implementation lands, `open_backend` raises NoBackend and
`dsv4deploy tune` without --plan stops with that message (exit 1) before writing anything.

The contract the implementation must keep (tests/test_tune_scheduler.py runs the core against a
table-driven stand-in with the same shape):

- `measure(candidate, level) -> Measurement`: serve `candidate.profile` through the rollout's
  release machinery (a release record per candidate, so `make history` shows the run; restart
  only when the rendered files changed; wait for health; confirm the process is ours), then run
  the gate's methodology and client at `level.concurrency` with `level.num_prompts` requests of
  `level.input_len`/`level.output_len` tokens, stopping early as "cannot reach" against
  `level.floor`. Fill output_throughput, p99_ttft_ms, p99_tpot_ms, completed, failed,
  cannot_reach, gate_passed and release. A candidate that does not start (OOM at graph capture,
  no health) is a Measurement with `error` set, not an exception; the scheduler times the call.
- `settle(chosen, tuned_profile) -> str`: leave the host serving `chosen` (deployed as the
  validated `tuned_profile`, with the full gate) or, when `chosen` is None or that deploy fails,
  the release that was serving when the tune started: never a worse one. It is also called with
  (None, None) when the search is cut off (Ctrl-C, an exception). Returns one line saying which
  release serves now.
- `close()`: release whatever the backend holds (connections).
- `calibration()`: the host's memory calibration as it is now (reports/<host>/calibration.json,
  which every candidate's deploy rewrites; None before the host's first start): the search checks
  each candidate with it again just before that candidate's deploy (tune/budget.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from dsv4deploy.cli.settings import Settings
from dsv4deploy.profile.load import Profile
from dsv4deploy.tune.candidates import Candidate
from dsv4deploy.tune.objective import Method
from dsv4deploy.tune.scheduler import Measure


class NoBackend(Exception):
    """No measuring backend is available: only --plan can run."""


@dataclass
class Backend:
    measure: Measure
    settle: Callable[[Candidate | None, str | None], str]
    close: Callable[[], None] = lambda: None
    calibration: Callable[[], "dict | None"] = lambda: None
    where: str = ""          # the host measured on, and whether it is the twin: the tuned profile says so


def calibration_reader(path) -> Callable[[], "dict | None"]:
    """Read the host's calibration at PATH now; one that became unreadable mid-search counts as
    the last one read (the deploy that rewrites it warns about it)."""
    from dsv4deploy.profile import calibration

    last: list = [calibration.read(path)]       # CalibrationError here: the tune does not start

    def read():
        try:
            last[0] = calibration.read(path)
        except calibration.CalibrationError:
            pass
        return last[0]
    return read


def open_backend(inventory: str, base: Profile, method: Method, settings: Settings) -> Backend:
    """The measuring backend for the hosts of `inventory`, starting from `base`: the rollout
    itself (dsv4deploy/tune/rollout_backend.py). The release serving now is what a cut-off or
    fruitless search puts back."""
    from dsv4deploy.host.connect import RemoteError, connected, on
    from dsv4deploy.host.release_store import ReleaseStore
    from dsv4deploy.profile import calibration
    from dsv4deploy.tune.rollout_backend import RolloutBackend

    try:
        with connected(inventory) as hosts:
            if len(hosts) != 1:
                raise NoBackend(f"{inventory} has {len(hosts)} hosts: tune measures on one host at a time")
            with on(hosts[0]):
                live = ReleaseStore(hosts[0]).current()
            name = hosts[0].name
            twin = bool(hosts[0].data.get("stand_ins"))
    except RemoteError as exc:
        raise NoBackend(f"cannot reach the host of {inventory}: {exc}") from None
    try:
        read = calibration_reader(calibration.path_for(settings.reports, name))
    except calibration.CalibrationError as exc:
        raise NoBackend(f"{exc}: fix or remove it (the next deploy there makes it anew)") from None
    rollout = RolloutBackend(inventory, base, method, settings, start_release=live["release"] if live else None)
    where = (f"{name}, a CT200 twin (its GPUs and SGLang server are stand-ins: figures are the twin's, not CT200's)"
             if twin else f"{name}") + f", inventory {inventory}"
    return Backend(measure=rollout.measure, settle=rollout.settle, close=rollout.close, calibration=read, where=where)
