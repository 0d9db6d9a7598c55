"""`dsv4deploy status`: each host of an inventory, one command each (dsv4deploy/watch/status.py
reads and judges it): what serves, the watch's results and trend, GPU health, drift; for a
replica set two more (release/running_set.py): each instance and the gateway against the release
that serves. Exit 0 healthy, 1 degraded, 2 down (docs/watch.md)."""

from __future__ import annotations

import json

from dsv4deploy.host.connect import on, reachable
from dsv4deploy.host.io import sh
from dsv4deploy.host.release_store import ReleaseStore, RollbackError
from dsv4deploy.host.state import read_set
from dsv4deploy.release import running_set
from dsv4deploy.watch import status


def host_statuses(inventory: str) -> list[dict]:
    """Each host's judged status, in inventory order (unreachable ones: down)."""
    out = []
    with reachable(inventory) as (hosts, errors):
        for h in hosts:
            if h.name in errors:
                out.append(status.unreachable(h.name, errors[h.name]))
                continue
            with on(h):
                _, text = sh(h, status.command(), timeout=60)
                judged = status.judge(h.name, status.parse(text))
                out.append(status.with_set(judged, set_view(h, judged["release"], judged["drift"])))
    return out


def set_view(h, release: int | None, drift: list[str]) -> dict | None:
    """The replica set running on H compared with RELEASE's, as its kept profile and manifest say
    (DRIFT: the release's files that differ on the host); None: no release serves, or a single
    server. Two commands: the kept release, then the set's processes, gateway and GPUs."""
    if release is None:
        return None
    try:
        t, manifest = ReleaseStore(h).kept({"release": release})
    except RollbackError as exc:
        return {"release": release, "error": str(exc)}
    if not t.is_set:
        return None
    view = running_set.compare(t, running_set.kept_argv(manifest), read_set(h, t), frozenset(drift))
    return {"release": release, **view}


def print_status(hosts: list[dict], as_json: bool) -> int:
    if as_json:
        print(json.dumps({"health": max((h["health"] for h in hosts), key=status.EXIT.get, default="healthy"),
                          "hosts": hosts}, indent=2, default=str))
    else:
        for h in hosts:
            print("\n".join(status.lines(h)))
    return status.exit_code(hosts)
