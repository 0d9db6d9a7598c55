"""The tune's state on the control node (`.cache/tune/<profile>.json`): every finished measurement
and the time spent, so an interrupted run continues where it stopped without measuring a
finished candidate again, and counts the time it already spent against its budget.

Measurements are keyed by what a candidate deploys (candidates.data_key) and its level, and are
reused only under the same method (concurrency, lengths, prompts per rung, SLOs): numbers taken
another way are not comparable. The file is rewritten atomically after each measurement, and a
lock file keeps two tunes of one profile from writing it at once.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from pathlib import Path

from dsv4deploy.profile.errors import Problem, ProfileError
from dsv4deploy.tune.objective import Measurement, Method

SCHEMA = "dsv4deploy.tune.state/1"


class Busy(Exception):
    """Another tune of the same profile holds the lock."""


class TuneState:
    """Measurements by (candidate key, level index), plus the seconds spent so far."""

    def __init__(self, path: Path | None, profile: str, method: Method):
        self.path = path
        self.profile = profile
        self.method = method
        self.spent_s = 0.0
        self.trials: dict[str, dict[str, dict]] = {}
        self.note = ""
        self._lock = None

    # --- lifecycle ------------------------------------------------------------------------
    @classmethod
    def open(cls, path: Path | None, profile: str, method: Method, *, fresh: bool = False) -> "TuneState":
        """Load the state at `path` (None: in memory only), locked for this process. A state of
        another method is set aside (renamed *.json.old), not mixed in; `fresh` sets it aside too."""
        state = cls(path, profile, method)
        if path is None:
            return state
        path.parent.mkdir(parents=True, exist_ok=True)
        state._lock = open(path.with_suffix(".lock"), "a")
        try:
            fcntl.flock(state._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            state._lock.close()
            raise Busy(f"another `dsv4deploy tune {profile}` is running (lock {path.with_suffix('.lock')})") from None
        if path.exists():
            doc = state._read(path)
            if fresh or doc.get("method") != method.to_dict():
                os.replace(path, path.with_name(path.name + ".old"))
                state.note = ("--fresh: the previous state was set aside" if fresh else
                              "the previous state measured another way (concurrency, lengths, prompts or "
                              "SLOs changed): set aside, starting afresh") + f" ({path.name}.old)"
            else:
                state.spent_s = float(doc.get("spent_s", 0.0))
                state.trials = doc.get("trials", {})
                n = sum(len(v) for v in state.trials.values())
                state.note = f"resumed: {n} measurement(s) and {state.spent_s:.0f} s from {path}"
        return state

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def __enter__(self) -> "TuneState":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _read(self, path: Path) -> dict:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ProfileError([Problem(f"not a readable tune state ({exc}): remove it or run with --fresh",
                                        file=str(path))]) from None
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("profile") != self.profile \
                or not isinstance(doc.get("trials", {}), dict):
            raise ProfileError([Problem(f"not a tune state of {self.profile} ({SCHEMA}): remove it or run with --fresh",
                                        file=str(path))])
        return doc

    # --- measurements ---------------------------------------------------------------------
    def get(self, key: str, level: int) -> Measurement | None:
        d = self.trials.get(key, {}).get(str(level))
        return None if d is None else Measurement.from_dict(d)

    def record(self, key: str, level: int, m: Measurement, overrides: dict, spent_s: float) -> None:
        self.trials.setdefault(key, {})[str(level)] = {**m.to_dict(), "overrides": overrides}
        self.spent_s = spent_s
        self.save()

    def save(self) -> None:
        if self.path is None:
            return
        doc = {"schema": SCHEMA, "profile": self.profile, "method": self.method.to_dict(),
               "spent_s": self.spent_s, "trials": self.trials}
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1, sort_keys=True)
                f.write("\n")
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
