"""`dsv4deploy report`: read what the page is made of and write it. The hosts' release records
and kept profiles (over SSH, like `history`) and the watch's status and journal (one command,
release/report/watch.py), the gate reports under reports/<host>/ (each replica's own too), the
tune reports under reports/tune-*/; then reports/index.html and one page per host. Each host's
records and watch results are kept beside its gate reports (reports/<host>/records.json,
watch.json) when read, so a host that cannot be reached later is shown from that copy, with the
time it was read; the hosts of other inventories with such copies here are on the index too, as
last read."""

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
from dsv4deploy.release.report import watch

RECORDS_FILE = "records.json"


def _json(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def local_gates(reports: Path, host: str) -> dict[str, GateFile]:
    """reports/<host>/<NNNN>-<profile>[-replica-N]/gate.json by folder name."""
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


def read_host(h, reports: Path, inventory: str) -> HostInput:
    """A connected host's records and kept profiles, and the watch's status and journal lines
    since the last read (three commands), kept in reports/<host>/."""
    from dsv4deploy.host.connect import on
    from dsv4deploy.host.io import sh
    from dsv4deploy.host.release_store import ReleaseStore

    keep = HOST_FILE.check(h.name) is None
    kept_watch = _json(reports / h.name / watch.WATCH_FILE) if keep else None
    with on(h):
        store = ReleaseStore(h)
        recs, profiles = store.records(), store.profiles()
        _, answer = sh(h, watch.command(watch.last_t(kept_watch)), timeout=60)
    read_at = now()
    if keep:
        write_atomic(reports / h.name / RECORDS_FILE, json.dumps(
            {"host": h.name, "inventory": inventory, "read_at": read_at, "records": recs,
             "profiles": {str(k): v for k, v in profiles.items()}}, indent=1) + "\n")
    if keep and watch.answered(answer):
        write_atomic(reports / h.name / watch.WATCH_FILE,
                     json.dumps(watch.merged(kept_watch, answer, h.name, read_at), indent=1) + "\n")
    return HostInput(name=h.name, records=recs, profiles=profiles, gates={}, read_at=read_at, inventory=inventory)


def cached_host(name: str, reports: Path, error: str | None) -> HostInput:
    """A host as last read (no records if it never was): an unreachable one (ERROR says why), or
    one of another inventory (ERROR None)."""
    doc = _json(reports / name / RECORDS_FILE) if HOST_FILE.check(name) is None else None
    doc = doc or {}
    profiles = {int(k): v for k, v in (doc.get("profiles") or {}).items() if str(k).isdigit()}
    return HostInput(name=name, records=list(doc.get("records") or []), profiles=profiles, gates={},
                     read_at=doc.get("read_at"), error=error, inventory=doc.get("inventory"))


def other_hosts(reports: Path, names: set[str]) -> list[HostInput]:
    """The hosts not in NAMES whose records were kept here (reports/<host>/records.json) through
    another inventory: shown as last read, by name."""
    out = []
    for path in sorted(reports.glob(f"*/{RECORDS_FILE}")):
        name = path.parent.name
        if name not in names and HOST_FILE.check(name) is None:
            out.append(dataclasses.replace(cached_host(name, reports, None), read_now=False))
    return out


def gather(inventory: str, reports: Path) -> list[HostInput]:
    """Every host of INVENTORY, read now or (unreachable) from its last copy, then every other
    host with a copy here; RemoteError when the inventory itself does not load."""
    from dsv4deploy.host.connect import reachable

    with reachable(inventory) as (hosts, errors):
        mine = [cached_host(h.name, reports, errors[h.name]) if h.name in errors
                else read_host(h, reports, inventory) for h in hosts]
    mine = [dataclasses.replace(h, inventory=inventory) for h in mine]
    return [gather_local(h, reports) for h in mine + other_hosts(reports, {h.name for h in mine})]


def gather_local(host: HostInput, reports: Path) -> HostInput:
    """HOST with what the control node holds of it: its gate reports and the watch's results."""
    if HOST_FILE.check(host.name) is not None:
        return host
    return dataclasses.replace(host, gates=local_gates(reports, host.name),
                               watch=watch.watch_view(_json(reports / host.name / watch.WATCH_FILE)))


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
        if h.error and h.read_now:
            print(f"{h.name}: unreachable ({h.error}); shown as last read"
                  + (f" at {h.read_at}" if h.read_at else " (never)"))
    print(args.settings.shown(written[0]))
    return 0


def register(sub) -> None:
    p = sub.add_parser("report", help="write reports/index.html: releases, gates, watch and tune runs of every host",
                       description="A static page (reports/index.html) and one per host, made from the release "
                                   "records and the watch's results on the inventory's hosts and the gate and tune "
                                   "reports under reports/ (hosts of other inventories as last read); it opens "
                                   "from file:// with no network. See docs/report.md.")
    p.add_argument("--inventory", default="inventory/sim.py")
    p.set_defaults(func=cmd_report)
