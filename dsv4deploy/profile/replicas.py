"""Replicas on one host: the optional `replicas:` block resolved into GPU sets, loopback ports and
the smg gateway in front, and the checks JSON Schema cannot make (validate.py calls `check`).

Each replica is one SGLang server of `server.tp_size` GPUs, an instance `<service>@<i>` of one
templated unit; every replica has the same settings, so the per-GPU memory budget of the profile
(memory.py, computed once by validate.py) is each replica's budget. The gateway takes the public
endpoint (default server.host:server.port); the replicas bind loopback only.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsv4deploy.gateway import model as gateway
from dsv4deploy.profile.network import is_loopback, public_endpoint

DEFAULT_DRAIN_TIMEOUT_S = 300
DEFAULT_METRICS_PORT = 29000
DEFAULT_POLICY = "round_robin"
# Set in each replica's env file; server.env may not set them (the env file would silently win).
REPLICA_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "DSV4_REPLICA_PORT")
LOWEST_PORT = 1024  # the sandboxed units have no CAP_NET_BIND_SERVICE


@dataclass(frozen=True)
class Replica:
    index: int
    gpus: tuple[int, ...]
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(map(str, self.gpus))


@dataclass(frozen=True)
class GatewaySpec:
    version: str
    host: str
    port: int
    policy: str
    metrics_port: int


@dataclass(frozen=True)
class ReplicaPlan:
    replicas: tuple[Replica, ...]
    gateway: GatewaySpec
    drain_timeout_s: int

    @property
    def worker_urls(self) -> list[str]:
        return [r.url for r in self.replicas]


def roll_problem(old: dict, new: dict) -> str | None:
    """Why a serving replica set of profile data OLD cannot become NEW one replica at a time, or
    None when it can: each replica must keep its address (the gateway's worker) and its GPUs (a
    new replica would start on GPUs an old one still holds). A set that only shrinks (the first
    replicas kept as they were) can: the surplus ones leave (surplus). Pure."""
    po, pn = plan(old), plan(new)
    if po is None or pn is None:
        return None
    keep = len(pn.replicas) if len(pn.replicas) < len(po.replicas) else len(po.replicas)
    before, after = po.worker_urls[:keep], pn.worker_urls
    if before != after:
        return f"its replicas change ({', '.join(po.worker_urls)} -> {', '.join(after)})"
    gpus = lambda rs: " ".join(",".join(map(str, r.gpus)) for r in rs)  # noqa: E731
    if gpus(po.replicas[:keep]) != gpus(pn.replicas):
        return f"their GPU sets change ({gpus(po.replicas)} -> {gpus(pn.replicas)})"
    return None


def surplus(old: dict, new: dict) -> list[int]:
    """The replica indices of a set of profile data OLD that NEW no longer runs (count shrank):
    drained from the gateway and stopped in a roll. Pure."""
    po, pn = plan(old), plan(new)
    if po is None or pn is None:
        return []
    return [r.index for r in po.replicas[len(pn.replicas):]]


def gateway_venv(data: dict) -> str | None:
    """The smg venv a replicas profile runs its gateway from (None without `replicas:`): what
    pruning keeps and a restore needs."""
    from dsv4deploy.render.layout import Layout

    p = plan(data)
    return Layout.gateway_venv(p.gateway.version, gateway.lock_sha256(p.gateway.version)) if p else None


def _gpu_sets(block: dict, tp: int) -> list[list[int]]:
    if block.get("gpus"):
        return [list(s) for s in block["gpus"]]
    return [list(range(i * tp, (i + 1) * tp)) for i in range(block["count"])]


def plan(data: dict) -> ReplicaPlan | None:
    """The resolved replica set of a schema-valid profile (None without `replicas:`), defaults filled."""
    block = data.get("replicas")
    if block is None:
        return None
    server = data["server"]
    base = block.get("base_port", server["port"] + 1)
    gw = block.get("gateway") or {}
    sets = _gpu_sets(block, server["tp_size"])
    return ReplicaPlan(
        replicas=tuple(Replica(i, tuple(s), server["host"], base + i) for i, s in enumerate(sets)),
        gateway=GatewaySpec(version=gw.get("version") or gateway.default_version(),
                            host=gw.get("host", server["host"]), port=gw.get("port", server["port"]),
                            policy=gw.get("policy", DEFAULT_POLICY),
                            metrics_port=gw.get("metrics_port", DEFAULT_METRICS_PORT)),
        drain_timeout_s=block.get("drain_timeout_s", DEFAULT_DRAIN_TIMEOUT_S),
    )


def check(profile, add) -> None:
    """Add a Problem (via `add`) for every replica setting that cannot work on the host."""
    data = profile.data
    block = data.get("replicas")
    if block is None:
        return
    server, hw = data["server"], data["hardware"]
    tp, count = server["tp_size"], block["count"]
    if server["nnodes"] > 1:
        add(profile.problem(("replicas",), "replicas are single-host servers: server.nnodes must be 1"))
    _gpus(profile, block, tp, count, hw["gpus_per_host"], add)
    _ports(profile, block, server, count, add)
    gw = block.get("gateway") or {}
    version = gw.get("version")
    if version is not None and gateway.lock_file(version) is None:
        add(profile.problem(("replicas", "gateway", "version"), f"no lock file for smg {version} "
                            f"(dsv4deploy/data/smg/{version}.lock); shipped: {', '.join(gateway.known_versions())}"))
    if not is_loopback(server["host"]):
        add(profile.problem(("server", "host"), f"{server['host']}: replicas are reached through the gateway "
                            "and listen on loopback only; use 127.0.0.1 and set replicas.gateway.host for the "
                            "public address"))
    public = gw.get("host", server["host"])
    if not server.get("api_key") and is_loopback(public):
        add(profile.problem(("server", "api_key"), "no API key: the gateway's control plane (POST/DELETE "
                            "/workers) is open to every local user", "warning"))
    if "host" in gw or is_loopback(server["host"]):    # else refused above: the endpoint is to be moved
        host_path = ("replicas", "gateway", "host") if "host" in gw else ("server", "host")
        public_endpoint(profile, host_path, public, "the gateway (its control plane, POST/DELETE /workers, shares the "
                    "listener)", add)
    if not server.get("enable_metrics"):
        add(profile.problem(("server", "enable_metrics"), "a rolling update drains a replica by reading its "
                            "/metrics (running and queued requests): set server.enable_metrics: true"))
    for key in server.get("env") or {}:
        if key in REPLICA_ENV:
            add(profile.problem(("server", "env", key), f"{key} is set per replica (from replicas.gpus and "
                                "replicas.base_port, in its env file); remove it"))
    if count == 1:
        add(profile.problem(("replicas", "count"), "one replica: a rolling update still takes the only server "
                            "out of service; use 2 or more for updates without downtime", "warning"))


def _gpus(profile, block, tp, count, per_host, add) -> None:
    explicit = block.get("gpus")
    if explicit is None:
        if count * tp > per_host:
            add(profile.problem(("replicas", "count"), f"{count} replicas x server.tp_size {tp} = {count * tp} "
                                f"GPUs; the host has {per_host} (hardware.gpus_per_host)"))
        return
    if len(explicit) != count:
        add(profile.problem(("replicas", "gpus"), f"{len(explicit)} GPU sets for replicas.count {count}: "
                            "give one set per replica"))
    owner: dict[int, int] = {}
    for i, gpus in enumerate(explicit):
        path = ("replicas", "gpus", i)
        if len(gpus) != tp:
            add(profile.problem(path, f"replica {i} has {len(gpus)} GPUs, server.tp_size is {tp}: each replica "
                                f"runs tensor parallelism over exactly its own set"))
        for j, g in enumerate(gpus):
            if g >= per_host:
                add(profile.problem(path + (j,), f"GPU {g} does not exist: the host has GPUs 0-{per_host - 1} "
                                    "(hardware.gpus_per_host)"))
            elif g in gpus[:j]:
                add(profile.problem(path + (j,), f"GPU {g} is listed twice in replica {i}"))
            elif g in owner and owner[g] != i:
                add(profile.problem(path + (j,), f"GPU {g} is already replica {owner[g]}'s: GPU sets must be "
                                    "disjoint (two servers on one GPU run out of memory)"))
            else:
                owner.setdefault(g, i)


def _ports(profile, block, server, count, add) -> None:
    gw = block.get("gateway") or {}
    base_given = "base_port" in block
    base = block.get("base_port", server["port"] + 1)
    base_path = ("replicas", "base_port") if base_given else ("replicas",)
    base_text = "replicas.base_port" if base_given else f"replicas.base_port (default server.port + 1 = {base})"
    ports = range(base, base + count)
    if base < LOWEST_PORT:
        add(profile.problem(base_path, f"{base_text}: ports below {LOWEST_PORT} need a capability the "
                            "sandboxed unit does not have"))
    if ports[-1] > 65535:
        add(profile.problem(base_path, f"{base_text}: {count} replicas need ports {base}-{ports[-1]}, past 65535"))
    named = {}
    for key, default in (("port", server["port"]), ("metrics_port", DEFAULT_METRICS_PORT)):
        port = gw.get(key, default)
        path = ("replicas", "gateway", key) if key in gw else base_path  # blame what the profile wrote
        what = f"replicas.gateway.{key}" + ("" if key in gw else f" (default {port})")
        if port < LOWEST_PORT:
            add(profile.problem(path, f"{what}: ports below {LOWEST_PORT} need a capability the sandboxed "
                                "unit does not have"))
        if port in ports:
            add(profile.problem(path, f"{what} {port} is replica {port - base}'s port ({base_text} + "
                                f"{port - base}); pick another"))
        for other, other_port in named.items():
            if port == other_port:
                add(profile.problem(path, f"{what} {port} is also replicas.gateway.{other}"))
        named[key] = port
