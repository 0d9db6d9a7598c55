"""Fault and timing knobs for one twin, read once at start from a JSON file the test harness
writes (never from the profile): ``/etc/dsv4deploy-twin/faults.json``, or the path in env
``DSV4_TWIN_FAULTS``.  A missing file means no faults and default timings.

Keys (all optional):

``load_seconds`` (float, 3.0)     simulated weight load + graph capture: the port refuses
                                  connections meanwhile.
``warmup_seconds`` (float, 1.5)   after bind, before SGLang's warmup request; /health is 503
                                  until warmup ends.
``health_poll_seconds`` (1.0)     SGLang's /health polls for the 1-token generation every 1 s.
``crash_on_start`` (bool/str)     exit 1 after the load with an error line (a string is the message).
``never_healthy`` (bool)          bind, but warmup never finishes: /health and /ready stay 503.
``error_rate`` (0..1)             fraction of user generations that fail (HTTP 500, or an error
                                  chunk mid-stream); deterministic, seeded by ``error_seed``.
``error_seed`` (int, 0)
``crash_after_requests`` (int)    exit 1 after N user generation requests have completed.
``stale_model_path`` (str)        stale old process: binds at once, /health 200 at once,
                                  /model_info and /server_info report this model path.
``kv_bytes_per_token`` (float)    memory-model override (measured calibration).
``weights_gib`` (float)           memory-model override of the checkpoint's total weights.
``connect_probe`` (list of str)   once bound, try a TCP connect to each ``host:port`` (2 s) and log
                                  ``twin: connect_probe HOST:PORT: connected`` or the error: from
                                  inside the unit, what its IPAddressDeny=/IPAddressAllow= let out.
``match_argv`` (str)              the faults apply only to a server whose argv (joined by spaces)
                                  contains this text, e.g. "--context-length 16384": so a fault
                                  hits the new release and not the one a rollback restores.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, fields
from pathlib import Path

DEFAULT_PATH = "/etc/dsv4deploy-twin/faults.json"
ENV = "DSV4_TWIN_FAULTS"


class FaultFileError(Exception):
    pass


@dataclass(frozen=True)
class Faults:
    load_seconds: float = 3.0
    warmup_seconds: float = 1.5
    health_poll_seconds: float = 1.0
    crash_on_start: bool | str = False
    never_healthy: bool = False
    error_rate: float = 0.0
    error_seed: int = 0
    crash_after_requests: int | None = None
    stale_model_path: str | None = None
    kv_bytes_per_token: float | None = None
    weights_gib: float | None = None
    match_argv: str | None = None
    connect_probe: tuple[str, ...] = ()
    source: str | None = None

    def fails(self, n: int) -> bool:
        """Deterministic: does the n-th user generation (0-based) fail?"""
        if self.error_rate <= 0:
            return False
        if self.error_rate >= 1:
            return True
        h = hashlib.sha256(f"{self.error_seed}:{n}".encode()).digest()
        return int.from_bytes(h[:8], "big") / 2**64 < self.error_rate


def faults_path() -> Path:
    return Path(os.environ.get(ENV) or DEFAULT_PATH)


def load_faults(path: str | Path | None = None, argv: list[str] | None = None) -> Faults:
    p = Path(path) if path is not None else faults_path()
    if not p.is_file():
        return Faults()
    try:
        data = json.loads(p.read_text() or "{}")
    except json.JSONDecodeError as e:
        raise FaultFileError(f"{p}: not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise FaultFileError(f"{p}: must hold a JSON object")
    known = {f.name for f in fields(Faults)} - {"source"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise FaultFileError(f"{p}: unknown keys {unknown}; known: {sorted(known)}")
    kw = {}
    for f in fields(Faults):
        if f.name in data and data[f.name] is not None:
            v = data[f.name]
            if f.name in ("load_seconds", "warmup_seconds", "health_poll_seconds", "error_rate",
                          "kv_bytes_per_token", "weights_gib"):
                v = float(v)
            elif f.name in ("error_seed", "crash_after_requests"):
                v = int(v)
            elif f.name == "never_healthy":
                v = bool(v)
            elif f.name == "connect_probe":
                v = tuple(str(a) for a in v)
            kw[f.name] = v
    if not 0.0 <= kw.get("error_rate", 0.0) <= 1.0:
        raise FaultFileError(f"{p}: error_rate must be within 0..1")
    if kw.get("match_argv") and argv is not None and kw["match_argv"] not in " ".join(argv):
        return Faults(source=f"{p} (match_argv not matched: no faults)")
    return Faults(source=str(p), **kw)
