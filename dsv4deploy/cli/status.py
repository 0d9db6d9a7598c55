"""`dsv4deploy status`: each host of an inventory, one command each (dsv4deploy/watch/status.py
reads and judges it): what serves, the watch's results and trend, GPU health, drift. Exit 0
healthy, 1 degraded, 2 down (docs/watch.md)."""

from __future__ import annotations

import json

from dsv4deploy.host.connect import on, reachable
from dsv4deploy.host.io import sh
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
            out.append(status.judge(h.name, status.parse(text)))
    return out


def print_status(hosts: list[dict], as_json: bool) -> int:
    if as_json:
        print(json.dumps({"health": max((h["health"] for h in hosts), key=status.EXIT.get, default="healthy"),
                          "hosts": hosts}, indent=2, default=str))
    else:
        for h in hosts:
            print("\n".join(status.lines(h)))
    return status.exit_code(hosts)
