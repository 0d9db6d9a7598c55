"""The smoke-benchmark gate after health, with the campaign's methodology (random 256/256 at
C=1/16/64): it runs on the host, is judged on the control node, and its reports (JSON,
Markdown, PNG) go next to the release on the host and into the run's reports folder here (the
settings the inventory put in the host data: reports/ of the checkout).
"""

from __future__ import annotations

import base64
import contextlib
import io
import shlex
import tarfile
import threading
from functools import partial
from pathlib import Path

from dsv4deploy.gate import GateSpec, run_gate, write_report
from dsv4deploy.gate.inputs import GateHost, GateServer
from dsv4deploy.gate.runner import Prepared, prepare_gate
from dsv4deploy.gate import split
from dsv4deploy.host.io import put, run, sh
from dsv4deploy.render.layout import GATE_USER
from dsv4deploy.cli.settings import settings_of
from dsv4deploy.host.release_store import ReleaseStore

RC_MARK = "__dsv4deploy_rc="


def host_execute(h):
    """`execute(cmd, timeout_s) -> (rc, stdout, stderr)` over the pyinfra connection."""

    def execute(command: str, timeout_s: float):
        ok, out = run(h, f"{command}; printf '\\n{RC_MARK}%s\\n' $? >&2", timeout=int(timeout_s) + 1)
        stderr_lines = out.stderr_lines
        rc = 0 if ok else 1
        if stderr_lines and stderr_lines[-1].startswith(RC_MARK):
            rc = int(stderr_lines[-1][len(RC_MARK):] or 1)
            stderr_lines = stderr_lines[:-1]
        return rc, out.stdout, "\n".join(stderr_lines)
    return execute


def _warm_plotting() -> None:
    with contextlib.suppress(Exception):
        from dsv4deploy.gate.report import warm_figure

        _spare.append(warm_figure())


_warming: list[threading.Thread] = []
_spare: list = []     # the report's figure, made ahead: the first gate's report draws into it


def warm_plotting() -> None:
    """Import the report's plotting library and make and warm the report's figure
    (report.warm_figure; about 0.5 s of CPU that would otherwise come after the gate): called
    when a server starts, so it happens while the host loads the server. Under pyinfra's gevent
    the thread is a greenlet that does not yield, so this returns when it is done (the control
    node had nothing else to do); run elsewhere it overlaps what follows. Once per run."""
    if not _warming:
        _warming.append(threading.Thread(target=_warm_plotting, name="warm-plotting", daemon=True))
        _warming[0].start()


def spare_figure():
    """The figure warm_plotting made, once it is made and not yet used (None: the report makes its own)."""
    if _warming and not _warming[0].is_alive() and _spare:
        return _spare.pop()
    return None


def previous_report(h, target, previous: int | None) -> dict | None:
    """Release PREVIOUS's gate report (its gate.json on the host) for TARGET (a replica: its
    own), which a new gate is compared with; None: no previous release, or it kept none. One
    command (none without PREVIOUS)."""
    if not previous:
        return None
    store = ReleaseStore(h, target.layout.releases_dir)
    return store.read(previous, f"{_gate_dir(gate_part(target))}/gate.json")


def gate_part(target) -> str | None:
    """Which part of a replica set TARGET is, as its gate's reports are named (`replica-0`); None
    for a single server or the whole set."""
    return f"replica-{target.index}" if target.index is not None else None


def _gate_dir(part: str | None) -> str:
    return f"gate-{part}" if part else "gate"


def prepare_release_gate(h, target) -> Prepared:
    """The gate's runner chosen and its client put in place (two commands), before the server
    is up: a deploy calls this while its server starts, so the gate's first request follows
    health and identity at once."""
    return prepare_gate(GateSpec.from_profile(target.data), gate_host(h), target.layout.python)


def gate_host(h) -> GateHost:
    """The gate's commands on H, over the pyinfra connection, its client run as the gate's user;
    bench_serving (which runs the model repository's code with the key in its environment) in a
    scope that reaches the server alone."""
    return GateHost(host_execute(h), upload=lambda src, dst: put(h, src, dst), run_as=GATE_USER, confined=True)


def run_release_gate(h, target, release: int | None, previous_doc: dict | None, profile_name: str,
                     keep=None, prepared: Prepared | None = None):
    """Run the profile's gate against release RELEASE's server (TARGET: a replica of a set is
    gated alone, on its own port, its reports named `replica-N`); write and fetch its reports,
    compared with PREVIOUS_DOC, the previous release's report (previous_report; None: nothing
    to compare with). RELEASE None: an ad-hoc run, kept nowhere on the host. The reports go next
    to the release on the host by KEEP(remote_dir, paths): default keep_reports, now; a caller
    may carry them in its next command instead (reports_command). PREPARED: the gate's runner
    and client made ready ahead (prepare_release_gate), else the gate prepares first."""
    warm_plotting()
    spec = GateSpec.from_profile(target.data)
    # through a replica set's gateway: which replica served the gate, by the replicas' own counters
    urls = [rt.base_url for rt in target.replica_targets] if target.is_set else []
    before = replica_requests(h, urls) if urls else {}
    server = GateServer(target.base_url, target.layout.model_dir, target.layout.python, target.layout.api_key_file)
    outcome = run_gate(spec, gate_host(h), server, prepared=prepared)
    if urls:
        outcome.result.replicas = split.split(urls, before, replica_requests(h, urls))
    store = ReleaseStore(h, target.layout.releases_dir)
    number = f"{release:04d}" if release else "adhoc"
    part = gate_part(target)
    gate_dir = _gate_dir(part)
    settings = settings_of(h.data)
    local = settings.reports / h.name / (f"{number}-{profile_name}" + (f"-{part}" if part else ""))
    title = f"{profile_name} release {number}" + (f" ({part})" if part else "") + f" on {h.name}"
    files = write_report(outcome, local, previous=previous_doc, title=title, figure=spare_figure())
    if release:
        (keep or partial(keep_reports, h))(f"{store.folder(release)}/{gate_dir}",
                                           [Path(p) for p in (files.json, files.markdown, files.png) if p])
    for line in outcome.verdict.lines():
        print(f"[{h.name}] {line}")
    if urls:
        print(f"[{h.name}] through {target.base_url}, {split.describe(outcome.result.replicas)}")
        lines, warns = split.routing_lines(outcome.result.levels, len(urls))
        for line in lines:
            print(f"[{h.name}]   {line}")
        for warning in split.warnings(outcome.result.replicas) + warns:
            print(f"[{h.name}] WARNING: {warning}")
    print(f"[{h.name}] gate report: {settings.shown(local)}")
    return outcome


# One argv word may hold 128 KiB on Linux: reports up to this much base64 go inside one command
INLINE_REPORTS_MAX = 96 << 10


def _archive(paths: list[Path]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in paths:
            tar.add(str(path), arcname=path.name)
    return buf.getvalue()


def _unpack(remote: str, src: str) -> str:
    q = shlex.quote
    return f"mkdir -p {q(remote)} && tar -xzf {src} -C {q(remote)} --no-same-owner"


def reports_command(remote: str, paths: list[Path]) -> str | None:
    """One command that puts the reports under REMOTE, carrying them inline; None when they are
    too large for one argv word (keep_reports uploads those)."""
    text = base64.b64encode(_archive(paths)).decode()
    if len(text) > INLINE_REPORTS_MAX:
        return None
    return f"printf '%s' {shlex.quote(text)} | base64 -d | {{ {_unpack(remote, '-')}; }}"


def carry_reports(h, reports: list[tuple[str, list[Path]]]) -> str:
    """The command that keeps REPORTS ((remote dir, paths) as run_release_gate's KEEP got them)
    when another command carries it (the release record's): the small ones inline, any too
    large for that uploaded now, on their own."""
    inline: list[str] = []
    for remote, paths in reports:
        command = reports_command(remote, paths)
        if command and sum(map(len, inline)) + len(command) <= INLINE_REPORTS_MAX + (8 << 10):
            inline.append(command)
        else:                 # too large alone, or with those before it, for the carrying command
            keep_reports(h, remote, paths)
    return " && ".join(inline)


def keep_reports(h, remote: str, paths: list[Path]) -> None:
    """The gate's reports next to the release on the host: one archive, in one command when it
    is small (it is: JSON, Markdown and a palette PNG, about 30 KB), else uploaded. They hold
    no secret."""
    command = reports_command(remote, paths)
    if command:
        ok = sh(h, command)[0]
    else:
        tmp = f"{remote}.tar.gz.dsv4deploy-tmp"
        ok = put(h, io.BytesIO(_archive(paths)), tmp) and sh(h, f"{_unpack(remote, shlex.quote(tmp))} && rm -f {shlex.quote(tmp)}")[0]
    if not ok:
        print(f"[{h.name}] warning: could not keep the gate's reports under {remote}")


def replica_requests(h, urls: list[str]) -> dict[str, int | None]:
    """Each replica's requests served so far (its sglang:num_requests_total), in one command."""
    _, out = sh(h, split.counters_command(urls), timeout=60)
    return split.parse_counters(out, urls)


def gate_record(outcome) -> dict:
    """What the release record keeps of a gate: pass/fail, headline, summary, and through a
    gateway the requests each replica served (`split`, in replica order; None: unknown)."""
    doc = {"passed": outcome.passed, "summary": outcome.summary, **outcome.verdict.headline}
    if outcome.result.replicas:
        doc["split"] = [p["requests"] for p in outcome.result.replicas]
        shares = [lv.routed["busiest_share"] for lv in outcome.result.levels
                  if lv.routed and lv.routed.get("busiest_share") is not None]
        if shares:
            doc["busiest_share"] = max(shares)
    return doc


def rolling_gate_record(per_replica: dict[int, dict], through_gateway: str) -> dict:
    """A rolling update's gate, for the release record (pure). Each replica passed the profile's
    gate alone, on its own port while out of the gateway, so no user's request is in its figures;
    the headline is the weakest replica's. THROUGH_GATEWAY: what the probe through the gateway
    found (the set as users reach it is checked, not loaded: docs/replicas.md)."""
    index, weakest = min(per_replica.items(), key=lambda kv: (kv[1].get("output_throughput") or 0.0, kv[0]))
    head = {k: weakest[k] for k in ("level", "concurrency", "floor", "output_throughput", "status", "passed_early",
                                    "completed", "num_prompts") if k in weakest}
    return {**head, "passed": all(r.get("passed") for r in per_replica.values()),
            "summary": "; ".join(f"replica {i}: {r.get('summary', '?')}" for i, r in sorted(per_replica.items())),
            "scope": f"replica {index}, the weakest of {len(per_replica)} gated one at a time",
            "through_gateway": through_gateway}
