"""The smg gateway (Shepherd Model Gateway) in front of the replicas: its pinned release, its
command line, and its worker API as plain functions of an HTTP callable.

Measured on smg 1.13.0 (docs/replicas.md, "smg, as measured"): the data plane and the control
plane (`/workers`) share one listener; with control-plane keys set (`control_plane_api_keys`)
`/workers` takes only those and the data plane only `--api-key` (which smg also sends to the
workers); `/health`, `/v1/models` and the Prometheus listener need none. `DELETE /workers/{id}`
answers 202, marks the worker `draining` (no new requests) for a fixed settle time (5 s), then
drops it; it never waits for the worker's in-flight requests, which keep streaming from the
replica. So the drain below waits on the replica's own counters before it may be stopped.
`POST /workers` must carry the key in its body, or smg registers the worker without it (every
call to a keyed replica then fails 401 and the pending job blocks a correct add with 409).

The HTTP callable is `http(method, url, headers, body, timeout) -> (status, body bytes)` and
raises OSError when nothing answers. The key is in headers and bodies, never in a URL: a callable
that runs curl over SSH must feed both on stdin (`--header @-`, `--data-binary @-`), not argv.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Callable

from dsv4deploy import PACKAGE_DATA
from dsv4deploy.gate.prometheus import summed

Http = Callable[[str, str, dict, "bytes | None", float], "tuple[int, bytes]"]

SMG_DATA = PACKAGE_DATA / "smg"
KEY_CREDENTIAL = "gateway-api-key"       # LoadCredential= names; the launcher reads them
CONTROL_CREDENTIAL = "gateway-control-key"
LAUNCHER_FILE = "dsv4deploy-gateway-launch.py"
POLICIES = ("cache_aware", "round_robin", "power_of_two", "least_load", "prefix_hash", "random")
# Policies that route by the load smg reads from each worker's metrics every 10 s: a worker
# just (re)registered has no report yet and gets nothing meanwhile (docs/replicas.md)
LOAD_AWARE = ("cache_aware", "power_of_two", "least_load")
METRICS_HOST = "127.0.0.1"               # smg's default is 0.0.0.0 (every interface, no auth)
SHUTDOWN_GRACE_S = 60                    # smg waits this long for in-flight requests on stop
_VERSION = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+(\.post[0-9]+)?")
_WORKER_ID = re.compile(r"[0-9A-Za-z][0-9A-Za-z-]{0,63}")
_METRIC = re.compile(r"(sglang:num_running_reqs|sglang:num_queue_reqs)(\{[^}]*\})?\s+(\S+)")


class GatewayError(Exception):
    """The gateway answered something else than its API promises, or nothing at all."""

    def __init__(self, message: str, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.code = status, code


# --- the pinned release ------------------------------------------------------------------------

def known_versions() -> list[str]:
    """Releases with a lock file in data/smg/ (every package of the gateway's venv, pinned)."""
    return sorted((p.name[:-5] for p in SMG_DATA.iterdir() if p.name.endswith(".lock")
                   and _VERSION.fullmatch(p.name[:-5])), key=lambda v: tuple(map(int, re.findall(r"\d+", v))))


def default_version() -> str:
    return known_versions()[-1]


def lock_file(version: str) -> Path | None:
    path = Path(str(SMG_DATA / f"{version}.lock"))
    return path if _VERSION.fullmatch(version) and path.is_file() else None


@cache
def lock_sha256(version: str) -> str | None:
    import hashlib

    path = lock_file(version)
    return hashlib.sha256(path.read_bytes()).hexdigest() if path else None


@dataclass(frozen=True)
class VenvInstall:
    """How the host's smg venv is made, as tasks/venv.py makes SGLang's: the lock file put into
    the venv, then `uv pip install --require-hashes -r <lock_dest>` (host/installer.py: every
    package, smg included, hash-checked); the venv's name hashes the lock."""

    venv: str
    spec: str
    lock_src: Path
    lock_dest: str

    @property
    def pip_args(self) -> list[str]:
        return ["--require-hashes", "-r", self.lock_dest]


def venv_install(version: str) -> VenvInstall:
    from dsv4deploy.render.layout import Layout

    lock = lock_file(version)
    if lock is None:
        raise GatewayError(f"no lock file for smg {version} (dsv4deploy/data/smg/); shipped: "
                           f"{', '.join(known_versions())}")
    venv = Layout.gateway_venv(version, lock_sha256(version))
    return VenvInstall(venv=venv, spec=f"smg=={version}", lock_src=lock, lock_dest=f"{venv}/dsv4deploy.lock")


# --- the command line --------------------------------------------------------------------------

def launch_flags(worker_urls: list[str], host: str, port: int, policy: str, metrics_port: int,
                 health_endpoint: str, health_interval_s: int) -> list[str]:
    """The flags after `smg launch` (smg's own parser reads them): workers and policy, the
    public listener, the metrics listener on loopback, cheap health probes, no tokenizer (HTTP
    workers get text; loading one would read the model folder the gateway has no need for)."""
    return ["--worker-urls", *worker_urls, "--policy", policy, "--host", host, "--port", str(port),
            "--prometheus-host", METRICS_HOST, "--prometheus-port", str(metrics_port),
            "--health-check-endpoint", health_endpoint, "--health-check-interval-secs", str(health_interval_s),
            "--shutdown-grace-period-secs", str(SHUTDOWN_GRACE_S), "--disable-tokenizer-autoload",
            "--log-level", "info"]


def launcher_argv(python: str, launcher: str, flags: list[str], keyed: bool) -> list[str]:
    """`python launcher [--key-credential NAME --control-credential NAME] -- flags`: no key
    reaches argv."""
    head = ["--key-credential", KEY_CREDENTIAL, "--control-credential", CONTROL_CREDENTIAL] if keyed else []
    return [python, launcher, *head, "--", *flags]


@dataclass(frozen=True)
class Keys:
    """The two keys a call to the worker API may carry: CONTROL authenticates it to /workers, and
    WORKER is the inference key a worker it adds is called with. Where a plain string is given
    instead, it is both (a gateway with one key for everything)."""

    control: str | None
    worker: str | None


def _control(key: "str | Keys | None") -> str | None:
    return key.control if isinstance(key, Keys) else key


def _worker_key(key: "str | Keys | None") -> str | None:
    return key.worker if isinstance(key, Keys) else key


# --- the worker API ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Worker:
    """One entry of GET /workers."""

    id: str
    url: str
    status: str          # pending | ready | not_ready | draining | failed
    healthy: bool
    load: int            # requests the gateway has in flight on it

    @property
    def routable(self) -> bool:
        return self.status == "ready" and self.healthy


def _headers(key: "str | Keys | None", body: bool = False) -> dict:
    h = {"Accept": "application/json"}
    if _control(key):
        h["Authorization"] = f"Bearer {_control(key)}"
    if body:
        h["Content-Type"] = "application/json"
    return h


def _json(body: bytes, what: str):
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise GatewayError(f"{what}: not JSON: {body[:120]!r}") from None


def error_text(body: bytes) -> tuple[str, str | None]:
    """(message, code) of an smg error body: `{"error": "...", "code": "..."}` (worker API) or
    `{"error": {"message": ..., "code": ...}}` (authentication); the raw start otherwise."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body[:200].decode("utf-8", "replace"), None
    err = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(err, dict):
        return str(err.get("message", "")), err.get("code")
    if isinstance(err, str):
        return err, doc.get("code")
    return json.dumps(doc)[:200], None


def _worker(item, where: str) -> Worker:
    if not isinstance(item, dict):
        raise GatewayError(f"{where}: a worker entry is not an object")
    wid, url, status = item.get("id"), item.get("url"), item.get("status")
    if not (isinstance(wid, str) and _WORKER_ID.fullmatch(wid)):
        raise GatewayError(f"{where}: worker id {wid!r} is not an id")
    if not (isinstance(url, str) and url.startswith(("http://", "https://"))):
        raise GatewayError(f"{where}: worker url {url!r} is not an http URL")
    if not isinstance(status, str):
        raise GatewayError(f"{where}: worker {url} has no status")
    load = item.get("load", 0)
    return Worker(id=wid, url=url, status=status, healthy=item.get("is_healthy") is True,
                  load=load if isinstance(load, int) and not isinstance(load, bool) else 0)


def parse_workers(body: bytes) -> list[Worker]:
    """GET /workers: `{"workers": [...], "total": N, "stats": {...}}`."""
    doc = _json(body, "GET /workers")
    if not isinstance(doc, dict) or not isinstance(doc.get("workers"), list):
        raise GatewayError("GET /workers: no 'workers' list")
    return [_worker(item, "GET /workers") for item in doc["workers"]]


def parse_accepted(body: bytes, what: str) -> str:
    """The worker id of a 202 answer to POST or DELETE /workers."""
    doc = _json(body, what)
    wid = doc.get("worker_id") if isinstance(doc, dict) else None
    if not (isinstance(wid, str) and _WORKER_ID.fullmatch(wid)) or doc.get("status") != "accepted":
        raise GatewayError(f"{what}: 202 without an accepted worker id")
    return wid


def _call(http: Http, method: str, url: str, headers: dict, body: bytes | None, timeout: float):
    try:
        return http(method, url, headers, body, timeout)
    except OSError as exc:
        raise GatewayError(f"{method} {url}: no answer ({exc})") from None


def _fail(method: str, url: str, status: int, body: bytes) -> GatewayError:
    message, code = error_text(body)
    return GatewayError(f"{method} {url}: HTTP {status}: {message}", status=status, code=code)


def list_workers(http: Http, gateway: str, key: "str | Keys | None", timeout: float = 10) -> list[Worker]:
    url = f"{gateway}/workers"
    status, body = _call(http, "GET", url, _headers(key), None, timeout)
    if status != 200:
        raise _fail("GET", url, status, body)
    return parse_workers(body)


def find(workers: list[Worker], url: str) -> Worker | None:
    return next((w for w in workers if w.url == url.rstrip("/")), None)


def strays(workers: list[Worker], urls: list[str]) -> list[Worker]:
    """The workers a gateway lists that are none of URLS (a set whose replicas moved: what a
    restore across that change leaves behind, dead)."""
    wanted = {u.rstrip("/") for u in urls}
    return [w for w in workers if w.url not in wanted]


def add_worker(http: Http, gateway: str, key: "str | Keys | None", worker_url: str,
               drain_settle_s: int | None = None, timeout: float = 10) -> str:
    """POST /workers; returns the worker id. The worker's (inference) key travels in the body
    as smg requires; the control-plane key in the header."""
    spec: dict = {"url": worker_url}
    if _worker_key(key):
        spec["api_key"] = _worker_key(key)
    if drain_settle_s is not None:
        spec["health"] = {"drain_settle_secs": int(drain_settle_s)}
    url = f"{gateway}/workers"
    status, body = _call(http, "POST", url, _headers(key, body=True), json.dumps(spec).encode(), timeout)
    if status != 202:
        raise _fail("POST", url, status, body)
    return parse_accepted(body, "POST /workers")


def remove_worker(http: Http, gateway: str, key: "str | Keys | None", worker_id: str, timeout: float = 10) -> None:
    """DELETE /workers/{id}: accepted (202); smg drains in the background."""
    if not _WORKER_ID.fullmatch(worker_id):
        raise GatewayError(f"{worker_id!r} is not a worker id")
    url = f"{gateway}/workers/{worker_id}"
    status, body = _call(http, "DELETE", url, _headers(key), None, timeout)
    if status != 202:
        raise _fail("DELETE", url, status, body)


def replica_in_flight(metrics: str) -> int | None:
    """Running plus queued requests in an SGLang /metrics text (every label set summed), or
    None when it has neither gauge (metrics off, or not SGLang)."""
    return summed(metrics, _METRIC, 3)


def load_reported(metrics: str, worker_url: str) -> bool:
    """Whether smg's own Prometheus text (its metrics port) holds a load report of WORKER_URL:
    its load monitor polls each worker's /metrics every 10 s and keeps `smg_engine_gen_throughput`
    (with token usage and queue) per worker; a worker added or re-added since has none yet.
    Until it has one, smg's load-aware routing (cache_aware's fallback for a request that matches
    no cached prefix, least_load, power_of_two) scores it as the best reporting peer plus its own
    requests in flight, so it gets nothing while it has anything in flight (docs/replicas.md)."""
    mark = f'smg_engine_gen_throughput{{worker="{worker_url.rstrip("/")}"'
    return any(line.startswith(mark) for line in metrics.splitlines())


@dataclass(frozen=True)
class Drained:
    """How a replica left the gateway: seconds until smg dropped it and until its last request
    ended (None: still busy when the budget ran out, with `in_flight` left)."""

    removed_s: float
    idle_s: float | None
    in_flight: int
    unanswered: str | None = None     # its /metrics did not answer at the end (timeout, no link): why


def refused(exc: OSError) -> bool:
    """A connection refused: nothing listens there (a timeout or a lost link says nothing)."""
    reason = getattr(exc, "reason", None)
    return (isinstance(exc, ConnectionRefusedError) or isinstance(reason, ConnectionRefusedError)
            or "Connection refused" in str(exc))


@dataclass(frozen=True)
class Clock:
    """Where drain and readmit read the time and sleep between polls (tests: a fake that
    advances itself as it sleeps)."""

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def wait_for(check: Callable[[], object], timeout_s: float, poll_s: float = 0.5,
             clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
    """Call `check` until it returns something truthy (returned) or `timeout_s` passes (None)."""
    start = clock()
    while True:
        got = check()
        if got:
            return got
        if clock() - start >= timeout_s:
            return None
        sleep(poll_s)


def drain(http: Http, gateway: str, key: "str | Keys | None", replica_url: str, timeout_s: float,
          poll_s: float = 0.5, clock: Clock = Clock()) -> Drained:
    """Take a replica out of the gateway and wait (bounded) for its in-flight requests: remove
    it, wait until smg lists it no more, then until the replica's own /metrics show nothing
    running or queued. Raises GatewayError when smg does not let go of it in time."""
    start = clock.now()
    worker = find(list_workers(http, gateway, key), replica_url)
    if worker is not None:
        remove_worker(http, gateway, key, worker.id)
        gone = wait_for(lambda: find(list_workers(http, gateway, key), replica_url) is None,
                        timeout_s, poll_s, clock.now, clock.sleep)
        if gone is None:
            raise GatewayError(f"{replica_url} is still listed by the gateway {timeout_s:g} s after "
                               "DELETE /workers")
    removed = clock.now() - start
    left, unanswered = [0], [None]

    def idle() -> bool:
        try:
            status, body = http("GET", f"{replica_url}/metrics", {}, None, 10)
        except OSError as exc:
            if refused(exc):
                # nothing listens (the replica crashed or is restarting): no request can be running on it
                left[0], unanswered[0] = 0, None
                return True
            unanswered[0] = str(exc)[:200]      # a timeout or no link: requests may still run; ask again
            return False
        unanswered[0] = None
        n = replica_in_flight(body.decode("utf-8", "replace")) if status == 200 else None
        if n is None:
            raise GatewayError(f"{replica_url}/metrics gives no running/queued counts (HTTP {status}): "
                               "the drain needs server.enable_metrics")
        left[0] = n
        return n == 0

    done = wait_for(idle, max(0.0, timeout_s - removed), poll_s, clock.now, clock.sleep)
    return Drained(removed_s=removed, idle_s=(clock.now() - start) if done else None, in_flight=left[0],
                   unanswered=None if done else unanswered[0])


def readmit(http: Http, gateway: str, key: "str | Keys | None", replica_url: str, timeout_s: float,
            poll_s: float = 0.5, clock: Clock = Clock()) -> Worker:
    """Add a replica back (its health and gate already passed) and wait until smg routes to it.
    A replica still draining from an earlier removal is waited out first (adding it then is a
    409); an add already in progress (409 WORKER_CREATE_IN_PROGRESS) is waited on, not repeated."""
    start = clock.now()
    listed = find(list_workers(http, gateway, key), replica_url)
    if listed is not None and listed.status == "draining":
        gone = wait_for(lambda: find(list_workers(http, gateway, key), replica_url) is None,
                        timeout_s, poll_s, clock.now, clock.sleep)
        if gone is None:
            raise GatewayError(f"{replica_url} is still draining in the gateway after {timeout_s:g} s")
        listed = None
    if listed is None:
        try:
            add_worker(http, gateway, key, replica_url)
        except GatewayError as exc:
            if exc.code != "WORKER_CREATE_IN_PROGRESS":
                raise
    left = max(0.0, timeout_s - (clock.now() - start))
    worker = wait_for(lambda: _routable(http, gateway, key, replica_url), left, poll_s, clock.now, clock.sleep)
    if worker is None:
        raise GatewayError(f"{replica_url} is not routable through the gateway {timeout_s:g} s after POST /workers")
    return worker


def _routable(http, gateway, key, replica_url) -> Worker | None:
    w = find(list_workers(http, gateway, key), replica_url)
    return w if w is not None and w.routable else None
