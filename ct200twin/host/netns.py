"""A fleet twin's own network: a network namespace (``ip netns``) and a veth pair with a private
/30, so each isolated twin has its own loopback (its server listens on 127.0.0.1:30000 like
every other's) and its sshd listens on the twin's end of the veth.

    this machine                          twin NAME-N (its own network namespace)
    dv<tag><N>  10.213.0.1/30  <--veth-->  host0  10.213.0.2/30   sshd :22
      proxy.py listens here :3128          lo     127.0.0.1       the deploy's server :30000
      (`sim-host` in the twin's /etc/hosts, reached without the proxy: a neighbour on its LAN)

The namespace has no default route: nothing in it reaches the outside except through the HTTP
proxy on this machine's end (``proxy.py``: apt, pip, curl over http/https), and nothing in it
reaches this machine's loopback. The /30 comes from a pool (``DSV4_SIM_FLEET_NET``, default
10.213.0.0/16) and is kept in ``hosts/NAME-N/net.json`` so the twin keeps its address (and its
known_hosts entry) from boot to boot; a /30 that this machine uses by then is given up for a free
one. The names come from that record, are checked against their patterns before they reach
``ip``, and every command is an argv list (no shell).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import subprocess
from pathlib import Path
from typing import Any, Iterable

from ct200twin.host.errors import SimError
from ct200twin.host.files import _write

log = logging.getLogger("ct200twin.host")

DEFAULT_POOL = "10.213.0.0/16"
PEER = "host0"                 # the twin's end, inside its namespace (nspawn's own name for it)
NETNS_RE = r"dsv4-[a-z][a-z0-9]{0,9}-[0-9]{1,3}-[0-9a-f]{6}"
VETH_RE = r"dv[0-9a-f]{6}[0-9]{1,3}"
NETNS_DIR = Path("/run/netns")
# The name an isolated twin knows this machine's end of its veth by (its /etc/hosts), and reaches
# directly (its no_proxy), as a host knows a neighbour on its LAN: e.g. the local hub's CDN name
# (`python -m ct200twin hub --host <host_ip> --cdn-host sim-host`), another name than the hub's.
LAN_NAME = "sim-host"


def pool() -> ipaddress.IPv4Network:
    text = os.environ.get("DSV4_SIM_FLEET_NET", DEFAULT_POOL)
    try:
        net = ipaddress.IPv4Network(text, strict=True)
    except ValueError as exc:
        raise SimError(f"DSV4_SIM_FLEET_NET={text!r}: not an IPv4 network like {DEFAULT_POOL} ({exc})", 2) from None
    if net.prefixlen > 30 or not net.is_private or net.is_loopback or net.is_link_local:
        raise SimError(f"DSV4_SIM_FLEET_NET={text}: a private IPv4 network of /30 or larger, not loopback "
                       "or link-local", 2)
    return net


def names(fleet: str, index: int, tag: str) -> dict[str, str]:
    return {"netns": f"dsv4-{fleet}-{index}-{tag}", "veth": f"dv{tag}{index}", "peer": PEER}


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise SimError(f"`ip {' '.join(args)}` exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


def require_ip() -> None:
    if _ip("netns", "list", check=False).returncode != 0:
        raise SimError("`ip netns` does not work here (iproute2 missing, or no permission to make network "
                       "namespaces): a fleet of isolated twins needs it")


_ROUTE_TYPES = {"local", "broadcast", "unicast", "anycast", "multicast", "blackhole", "unreachable",
                "prohibit", "throw", "nat"}


def used_networks() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network this machine has an address in or a route to (the default route aside)."""
    nets = []
    for line in _ip("-4", "-o", "addr", "show").stdout.splitlines():
        m = re.search(r"\binet (\S+)", line)
        if m:
            nets.append(ipaddress.IPv4Interface(m.group(1)).network)
    for line in _ip("-4", "route", "show", "table", "all").stdout.splitlines():
        words = line.split()
        if not words:
            continue
        dest = words[1] if words[0] in _ROUTE_TYPES and len(words) > 1 else words[0]
        if dest == "default":
            continue
        try:
            nets.append(ipaddress.IPv4Network(dest, strict=False))
        except ValueError:
            continue
    return nets


def _overlaps(net: ipaddress.IPv4Network, others: Iterable[ipaddress.IPv4Network]) -> bool:
    return any(net.overlaps(o) for o in others)


def read_record(path: Path) -> dict[str, Any]:
    """The twin's network record, its names and addresses checked (SimError if it is not ours)."""
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    try:
        ok = (re.fullmatch(NETNS_RE, rec["netns"]) and re.fullmatch(VETH_RE, rec["veth"]) and rec["peer"] == PEER
              and ipaddress.IPv4Address(rec["host_ip"]) and ipaddress.IPv4Address(rec["twin_ip"])
              and rec["prefix"] == 30)
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise SimError(f"{path}: not a network record this tool wrote; remove it (`sim down --purge`)")
    return rec


def subnet_of(rec: dict[str, Any]) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(f"{rec['host_ip']}/{rec['prefix']}", strict=False)


def present(rec: dict[str, Any]) -> bool:
    """Whether the twin's veth is on this machine (its network is set up)."""
    return (Path("/sys/class/net") / rec["veth"]).exists()


def allocate(path: Path, fleet: str, index: int, tag: str, taken: Iterable[ipaddress.IPv4Network]) -> dict[str, Any]:
    """The twin's network record: the one kept in PATH while its /30 is still free on this machine
    (or is its own), else a free /30 of the pool, written to PATH. TAKEN: what this machine's
    other fleet twins keep. Run under the sim lock."""
    want = names(fleet, index, tag)
    rec = read_record(path)
    used = used_networks()
    taken = list(taken)
    if rec and {k: rec[k] for k in want} == want:
        mine = subnet_of(rec)
        if present(rec) or not _overlaps(mine, used + [t for t in taken if t != mine]):
            return rec
        log.warning("%s-%d: %s is in use on this machine now; taking another /30", fleet, index, mine)
    for net in pool().subnets(new_prefix=30):
        if _overlaps(net, used) or _overlaps(net, taken):
            continue
        hosts = list(net.hosts())
        rec = {**want, "host_ip": str(hosts[0]), "twin_ip": str(hosts[1]), "prefix": 30}
        _write(path, json.dumps(rec, indent=1) + "\n", 0o644)
        return rec
    raise SimError(f"no free /30 left in {pool()} on this machine: set DSV4_SIM_FLEET_NET to another private "
                   "network (e.g. 10.214.0.0/16)")


def teardown(rec: dict[str, Any]) -> bool:
    """Remove the twin's veth and namespace (those of its record only). True if anything was there."""
    found = False
    if present(rec):
        _ip("link", "del", rec["veth"])          # the peer in the namespace goes with it
        found = True
    if (NETNS_DIR / rec["netns"]).exists():
        _ip("netns", "del", rec["netns"])
        found = True
    return found


def setup(rec: dict[str, Any]) -> str:
    """A fresh namespace and veth pair for the twin (leftovers of an earlier boot removed first);
    returns the namespace's path for systemd-nspawn --network-namespace-path."""
    teardown(rec)
    ns, veth, peer = rec["netns"], rec["veth"], rec["peer"]
    try:
        _ip("netns", "add", ns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", peer, "netns", ns)
        _ip("addr", "add", f"{rec['host_ip']}/{rec['prefix']}", "dev", veth)
        _ip("link", "set", veth, "up")
        _ip("-n", ns, "addr", "add", f"{rec['twin_ip']}/{rec['prefix']}", "dev", peer)
        _ip("-n", ns, "link", "set", peer, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
    except SimError:
        teardown(rec)
        raise
    return str(NETNS_DIR / ns)
