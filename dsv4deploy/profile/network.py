"""Who may exchange packets with the server's units: loopback, and only what the profile names.

The server runs code shipped with a checkpoint (trust_remote_code, JIT kernels); with AF_INET open
to anywhere it could send what it reads (the API key, prompts) out. So every server, replica and
gateway unit gets `IPAddressDeny=any` and an `IPAddressAllow=` list from here (systemd.resource-
control(5): a cgroup BPF filter on the peer address of every packet, in and out):

- `localhost` (systemd's keyword: 127.0.0.0/8 and ::1) always: SGLang's own processes, NCCL's
  bootstrap and torch's rendezvous on one host, the gate and the gateway's workers;
- `service.allow_clients`: the networks whose clients may reach the public endpoint (the single
  server, or the gateway in front of replicas). Required when that endpoint binds beyond loopback.
  systemd cannot tell direction, so a listed client network can also be connected to: the list
  goes to the unit that listens (never to the replicas, which listen on loopback only);
- `service.allow_egress`: networks the server (and each replica) must reach itself; none by default;
- a multi-node server's peers: the host of `--dist-init-addr` (the only peer the profile names),
  allowed automatically.

Pure: profile data in, lists and problems out; render/ and validate.py both read it.
"""

from __future__ import annotations

import ipaddress

LOOPBACK = "localhost"
ANY_NETWORK = ("0.0.0.0/0", "::/0")
_DIST_INIT = "--dist-init-addr"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def network(value: str) -> str:
    """The normalized spelling systemd reads back ('10.0.0.0/8', 'fd00::/8'); a bare address is
    its /32 or /128. ValueError for anything else, host bits set included (ambiguous)."""
    return str(ipaddress.ip_network(value, strict=True))


def _networks(values) -> list[str]:
    return [network(v) for v in values or []]


def dist_init_host(data: dict) -> str | None:
    """The host of `--dist-init-addr HOST:PORT` in server.extra_args, if any (brackets of an
    IPv6 address removed)."""
    words = data["server"].get("extra_args") or []
    for i, word in enumerate(words):
        value = None
        if word == _DIST_INIT and i + 1 < len(words):
            value = words[i + 1]
        elif word.startswith(_DIST_INIT + "="):
            value = word.partition("=")[2]
        if value is not None:
            host = value.rpartition(":")[0] or value
            return host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return None


def single_host(data: dict) -> bool:
    """One host, so NCCL's bootstrap and torch's sockets belong on loopback (render/nccl.py)."""
    return data["server"]["nnodes"] == 1 and dist_init_host(data) is None


def peers(data: dict) -> list[str]:
    """The multi-node peers the profile names, as networks (empty on one host)."""
    host = dist_init_host(data)
    if host is None or is_loopback(host):
        return []
    return [network(host)]


def _dedup(items: list[str]) -> list[str]:
    return list(dict.fromkeys(items))


def server_allow(data: dict) -> list[str] | None:
    """IPAddressAllow= of the single server's unit (None: hardening off, no IP rules)."""
    if data["service"].get("hardening") == "off":
        return None
    service = data["service"]
    return _dedup([LOOPBACK, *_networks(service.get("allow_clients")), *_networks(service.get("allow_egress")),
                   *peers(data)])


def replica_allow(data: dict) -> list[str] | None:
    """IPAddressAllow= of each replica's unit: its clients are the gateway's, on loopback."""
    if data["service"].get("hardening") == "off":
        return None
    return _dedup([LOOPBACK, *_networks(data["service"].get("allow_egress"))])


def gateway_allow(data: dict) -> list[str]:
    """IPAddressAllow= of the gateway's unit: its workers are on loopback, its clients listed."""
    return _dedup([LOOPBACK, *_networks(data["service"].get("allow_clients"))])


# --- validation --------------------------------------------------------------------------------

def public_endpoint(profile, host_path: tuple, host: str, what: str, add) -> None:
    """The one rule for a listener beyond loopback (the single server, or the gateway in front of
    replicas): it needs an API key, and its clients' networks in service.allow_clients (the unit
    drops every other peer). HOST_PATH: the key that sets HOST, blamed when no list is given."""
    data = profile.data
    if is_loopback(host):
        if data["service"].get("allow_clients"):
            add(profile.problem(("service", "allow_clients"), f"{what} listens on {host} only: no client beyond "
                                "loopback can reach it, but the listed networks are still allowed for the "
                                "unit's own connections; remove the key or bind an address", "warning"))
        return
    if not data["server"].get("api_key"):
        add(profile.problem(("server", "api_key"), f"{what} listens on {host}, beyond loopback: set "
                            "server.api_key: true (every client that can reach it could use it)"))
    if not data["service"].get("allow_clients"):
        add(profile.problem(("service", "allow_clients") if "allow_clients" in data["service"] else host_path,
                            f"{what} listens on {host}, but its unit allows only loopback peers "
                            "(IPAddressDeny=any): name the client networks in service.allow_clients, "
                            "e.g. [10.0.0.0/8]"))


def check(profile, add) -> None:
    """Every listed network parses; an any-network is named; a multi-node peer is an address;
    the single server's public endpoint obeys `public_endpoint` (replicas.check does the gateway's)."""
    data = profile.data
    for key in ("allow_clients", "allow_egress"):
        for i, value in enumerate(data["service"].get(key) or []):
            path = ("service", key, i)
            try:
                normalized = network(value)
            except ValueError as exc:
                add(profile.problem(path, f"{value!r} is not an IP network: {exc} (e.g. 10.0.0.0/8, "
                                    "192.0.2.7 or fd00::/8)"))
                continue
            if normalized in ANY_NETWORK:
                add(profile.problem(path, f"{value} is every address: the server's model code can then "
                                    "reach the whole network", "warning"))
    host = dist_init_host(data)
    if host is not None and not is_loopback(host):
        try:
            network(host)
        except ValueError:
            add(profile.problem(("server", "extra_args"), f"--dist-init-addr {host}: give the peer as an IP "
                                "address (the unit allows it by address, IPAddressAllow= resolves no names)"))
    if single_host(data) and "GLOO_SOCKET_IFNAME" in (data["server"].get("env") or {}):
        add(profile.problem(("server", "env", "GLOO_SOCKET_IFNAME"), "GLOO_SOCKET_IFNAME is set to lo by the NCCL "
                            "env file on one host (it is read after Environment= and would silently win); "
                            "remove it: the unit's peers are loopback only"))
    if data.get("replicas") is None:
        public_endpoint(profile, ("server", "host"), data["server"]["host"], "the server", add)

