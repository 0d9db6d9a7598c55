"""`dsv4deploy report`: read what the page is made of and write it. The hosts' release records
and kept profiles (over SSH, like `history`), the gate reports under reports/<host>/, the tune
reports under reports/tune-*/ and the watch's state (release/report/watch.py); then
reports/index.html and one page per host. Each host's records are kept beside its gate reports
(reports/<host>/records.json) when read, so a host that cannot be reached later is shown from
that copy, with the time it was read."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import tempfile
from pathlib import Path

from dsv4deploy.release.records import now
from dsv4deploy.release.report.model import GateFile, HostInput, host_view, tune_view
from dsv4deploy.release.report.page import HOST_FILE, render_site
from dsv4deploy.release.report.watch import WATCH_FILE, watch_view

RECORDS_FILE = "records.json"


def _json(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def local_gates(reports: Path, host: str) -> dict[str, GateFile]:
    """reports/<host>/<NNNN>-<profile>/gate.json by folder name."""
    found = {}
    for path in sorted((reports / host).glob("[0-9]*/gate.json")):
        doc = _json(path)
        if doc is not None:
            found[path.parent.name] = GateFile(folder=f"{host}/{path.parent.name}", doc=doc)
    return found


def tune_runs(reports: Path) -> list:
    """Every reports/tune-*/tune.json, newest first."""
    runs = []
    for path in sorted(reports.glob("tune-*/tune.json")):
        doc = _json(path)
        if doc is not None and isinstance(doc.get("candidates"), list):
            runs.append(tune_view(path.parent.name, doc))
    return sorted(runs, key=lambda t: t.written_at, reverse=True)


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def read_host(h, reports: Path) -> HostInput:
    """A connected host's records and kept profiles (two commands), kept in reports/<host>/."""
    from dsv4deploy.host.connect import on
    from dsv4deploy.host.release_store import ReleaseStore

    with on(h):
        store = ReleaseStore(h)
        recs, profiles = store.records(), store.profiles()
    read_at = now()
    if HOST_FILE.check(h.name) is None:
        write_atomic(reports / h.name / RECORDS_FILE, json.dumps(
            {"host": h.name, "read_at": read_at, "records": recs,
             "profiles": {str(k): v for k, v in profiles.items()}}, indent=1) + "\n")
    return HostInput(name=h.name, records=recs, profiles=profiles, gates={}, read_at=read_at)


def cached_host(name: str, reports: Path, error: str) -> HostInput:
    """An unreachable host as last read (no records if it never was)."""
    doc = _json(reports / name / RECORDS_FILE) if HOST_FILE.check(name) is None else None
    doc = doc or {}
    profiles = {int(k): v for k, v in (doc.get("profiles") or {}).items() if str(k).isdigit()}
    return HostInput(name=name, records=list(doc.get("records") or []), profiles=profiles, gates={},
                     read_at=doc.get("read_at"), error=error)


def gather(inventory: str, reports: Path) -> list[HostInput]:
    """Every host of INVENTORY, read now or (unreachable) from its last copy; RemoteError when
    the inventory itself does not load."""
    from dsv4deploy.host.connect import reachable

    with reachable(inventory) as (hosts, errors):
        return [gather_local(cached_host(h.name, reports, errors[h.name]) if h.name in errors
                             else read_host(h, reports), reports) for h in hosts]


def gather_local(host: HostInput, reports: Path) -> HostInput:
    """HOST with what the control node holds of it: its gate reports and the watch's state."""
    if HOST_FILE.check(host.name) is not None:
        return host
    return dataclasses.replace(host, gates=local_gates(reports, host.name),
                               watch=watch_view(_json(reports / host.name / WATCH_FILE)))


def write_site(host_inputs: list[HostInput], reports: Path, inventory: str) -> list[Path]:
    """The pages, written whole each (a reader never sees half a page)."""
    pages = render_site([host_view(h) for h in host_inputs], tune_runs(reports), now(), inventory)
    written = []
    for name, text in pages.items():
        write_atomic(reports / name, text)
        written.append(reports / name)
    return written


def cmd_report(args) -> int:
    from dsv4deploy.host.connect import RemoteError
    from dsv4deploy.profile.errors import EXIT_FAILED

    reports = args.settings.reports
    # a host that does not answer is a line on the page and below; paramiko's transport thread
    # would also print its traceback
    logging.getLogger("paramiko").setLevel(logging.CRITICAL)
    try:
        host_inputs = gather(args.inventory, reports)
    except RemoteError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_FAILED
    written = write_site(host_inputs, reports, args.inventory)
    for h in host_inputs:
        if h.error:
            print(f"{h.name}: unreachable ({h.error}); shown as last read"
                  + (f" at {h.read_at}" if h.read_at else " (never)"))
    print(args.settings.shown(written[0]))
    return 0


def register(sub) -> None:
    p = sub.add_parser("report", help="write reports/index.html: releases, gates and tune runs of every host",
                       description="A static page per inventory (reports/index.html) and one per host, made from "
                                   "the release records on the hosts and the gate and tune reports under reports/; "
                                   "it opens from file:// with no network. See docs/report.md.")
    p.add_argument("--inventory", default="inventory/sim.py")
    p.set_defaults(func=cmd_report)
