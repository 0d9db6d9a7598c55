"""The deploy lock, and the release records around the switch: `pending` before it,
`deployed` after health and identity (and, with issue 5, the gate), or `failed` followed by
an automatic rollback to the last release that passed.

The lock is taken while pyinfra prepares (before any change) and given back when the last
operation ends or one fails, so a run that changes nothing reports no changed operation.
"""

from __future__ import annotations

import atexit
import json
import os
import shlex
import socket
import sys

from pyinfra import host, logger
from pyinfra.api import BaseStateCallback, DeployError, deploy
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.files import Sha256File
from pyinfra.operations import python

from .. import releases, replicas
from ..errors import rerun_with
from ..host.state import LOCK, PIP_FREEZE, HostState
from ..health import HealthError
from ..host.io import json_write_command, read_json, records, save_record, sh
from ..layout import MODELS, OPT, STATE, Layout
from ..rollout import Rollout
from ..host.gate import gate_record, run_release_gate
from .rollback import after_failure
from ..host.checks import confirm, journal_tail, observer



# --- the lock ---------------------------------------------------------------------------------

def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _ReleaseLock(BaseStateCallback):
    """Gives the lock back when the run's last operation ends, or when an operation fails."""

    def __init__(self, h, label: str = ""):
        self.host = h
        self.label = label
        self.held = True
        atexit.register(self._release)  # a run that ends early (declined prompt, ^C) still gives it back

    def _release(self):
        if not self.held:
            return
        try:
            sh(self.host, f"rm -rf {LOCK}")
            self.held = False
        except Exception:  # noqa: BLE001 - the connection may be gone; the stale-lock check copes
            pass

    def operation_end(self, st, op_hash):
        order = st.get_op_order()
        if order and op_hash == order[-1]:
            self._release()

    def operation_host_error(self, st, h, op_hash, retry_count=0, max_retries=0):
        if h is self.host and not st.get_op_data_for_host(h, op_hash).global_arguments.get("_ignore_errors"):
            self._release()
            # what to do next, whatever the step: pyinfra's own error line says only what failed
            step = ", ".join(sorted(st.get_op_meta(op_hash).names)) or "an operation"
            logger.error(f"    [{h.name}] stopped at {step}: fix what the lines above say (disk space, network, "
                         f"the host), then run make {_make_target(self.label)} again; a release this run left "
                         "half done is settled by the next run")


def _make_target(label: str) -> str:
    """The make target that runs what `label` names ('deploy NAME' or 'rollback')."""
    what, _, name = label.partition(" ")
    return f"deploy PROFILE={name}" if what == "deploy" and name else what


def deploy_lock(label: str) -> None:
    """Take the host's deploy lock now (prepare stage), in one command; refuse with the holder's
    PID and start. A dry run (`--dry`, `make plan`) changes nothing, so it takes no lock."""
    if "--dry" in sys.argv:
        return
    me = {"controller": socket.gethostname(), "pid": os.getpid(), "started": releases.now(), "what": label}
    owner = json.dumps(me, sort_keys=True)
    for attempt in range(2):
        ok, _ = sh(host, f"mkdir -p {STATE} && mkdir {LOCK} 2>/dev/null && "
                         f"printf '%s\\n' {shlex.quote(owner)} > {LOCK}/owner.json")
        if ok:
            ctx_state.get().add_callback_handler(_ReleaseLock(ctx_host.get(), label))  # the real Host, not the proxy
            return
        holder = read_json(host, f"{LOCK}/owner.json") or {}
        stale = holder.get("controller") == me["controller"] and not _pid_alive(int(holder.get("pid", 0)))
        if (stale or host.data.get("break_lock")) and attempt == 0:
            sh(host, f"rm -rf {LOCK}")
            continue
        raise DeployError(
            f"another deploy holds the lock on this host: PID {holder.get('pid', '?')} on "
            f"{holder.get('controller', '?')} since {holder.get('started', '?')} ({holder.get('what', '?')}). "
            f"If that run is gone, {rerun_with('break_lock=true', _make_target(label))}.")


# --- releases ---------------------------------------------------------------------------------

def _lost_connection() -> tuple[type[BaseException], ...]:
    from paramiko.ssh_exception import SSHException
    from pyinfra.api.exceptions import ConnectError, PyinfraError
    # PyinfraError: a fact the step reads failed on the host ("No hosts remaining!")
    return (EOFError, ConnectionError, TimeoutError, SSHException, ConnectError, PyinfraError)


LOST_CONNECTION = _lost_connection()


def reported(callback):
    """A python.call callback that fails the operation with its message instead of a traceback
    (pyinfra fails an operation whose (state, host) callback returns False)."""

    def wrapper(state, host):  # noqa: pyinfra passes (state, host) by these names
        try:
            return callback(state, host)
        except DeployError as exc:
            for line in str(exc).splitlines():
                logger.error(f"    [{host.name}] {line}")
            return False
        except LOST_CONNECTION as exc:   # the host rebooted or the link dropped mid-step: no traceback
            logger.error(f"    [{host.name}] lost the connection to the host ({type(exc).__name__}: "
                         f"{str(exc) or 'the link closed'}): it rebooted, or the network dropped, or it stopped "
                         "answering")
            return False
    wrapper.__name__ = callback.__name__
    return wrapper


def settle_interrupted(r: Rollout, state: HostState) -> None:
    """A `pending` release left by a cut-off run is settled before anything else happens."""
    if not any(rec["status"] == releases.PENDING for rec in state["releases"] or []):
        return

    def settle(state, host):  # noqa: pyinfra passes (state, host) by these names
        live_sha = host.get_fact(Sha256File, path=r.layout.manifest)
        healthy = observer(host, r.target)().http == 200
        for doc in releases.settle_interrupted(records(host, r.layout.releases_dir), live_sha, healthy):
            save_record(host, r.layout.releases_dir, doc)
            print(f"[{host.name}] release {doc['release']:04d}: {doc['status']} ({doc['reason']})")

    python.call(name="settle releases left pending by an interrupted run", function=reported(settle))


def needs_release(r: Rollout, state: HostState) -> str | None:
    """Why the deployed release is not this one (None: it is): its manifest differs, or none is."""
    live = releases.current(state["releases"] or [])
    if live is None:
        return "no release is deployed"
    if live["manifest_sha256"] != r.manifest_sha256:
        return f"release {live['release']:04d} renders differently"
    return None


def release_write_command(folder: str, venv: str, files: dict[str, str], profile_doc: dict, rec: dict) -> str:
    """One command that writes a release's folder: the rendered files, the resolved profile, the
    venv's `pip freeze` (made once per venv fill, host/ops.py venv) and, last, its status record.
    None of it is secret (the API key and HF token never enter a profile or a rendered file)."""
    q = shlex.quote
    freeze = f"{venv}/{PIP_FREEZE}"
    parts = [f"mkdir -p {' '.join(q(f'{folder}/files{os.path.dirname(p)}') for p in files)}",
             # what the venv really holds (torch, sgl-kernel, flashinfer, ...), kept with the release
             f"{{ [ -s {q(freeze)} ] || {q(venv)}/bin/python -m pip freeze --all --disable-pip-version-check "
             f"> {q(freeze)} 2>&1; }}", f"cp {q(freeze)} {q(folder)}/pip-freeze.txt"]
    parts += [f"printf '%s' {q(text)} > {q(f'{folder}/files{path}')}" for path, text in files.items()]
    parts += [json_write_command(f"{folder}/profile.json", profile_doc),
              json_write_command(f"{folder}/status.json", rec)]
    return " && ".join(parts)


@deploy("Release")
def begin_release(r: Rollout) -> None:
    """Write release NNNN as pending, with the resolved profile, the rendered files and the venv's
    `pip freeze`."""

    def begin(state, host):  # noqa: pyinfra passes (state, host) by these names
        rec = releases.new_record(records(host, r.layout.releases_dir), profile=r.profile.name,
                                  content_hash=r.profile.content_hash, manifest_sha256=r.manifest_sha256,
                                  sglang_version=r.data["sglang"]["version"])
        folder = releases.release_dir(r.layout.releases_dir, rec["release"])
        profile_doc = {"name": r.profile.name, "files": list(r.profile.files), "data": r.profile.data}
        ok, out = sh(host, release_write_command(folder, r.layout.venv, r.rendered.files, profile_doc, rec))
        if not ok:
            raise DeployError(f"cannot write release {rec['release']:04d} under {folder}: {out.strip()[-300:]}")
        r.run["release"] = rec
        print(f"[{host.name}] release {rec['release']:04d} pending ({r.profile.name})")

    python.call(name="record release (pending, before the switch)", function=reported(begin))


@deploy("Verify")
def verify_and_record(r: Rollout) -> None:
    """Health within the profile's budget, identity, the smoke gate; then deployed, or failed
    and rolled back to the last release that passed."""

    def verify(state, host):  # noqa: pyinfra passes (state, host) by these names
        rec = r.run.get("release")
        poll = float(host.data.get("health_poll_s", 2.0))
        name = f"release {rec['release']:04d}" if rec else "the running release"
        previous = releases.current(records(host, r.layout.releases_dir))
        try:
            confirm(host, r.target, budget_s=r.data["service"]["health_timeout_s"], poll_s=poll)
        except HealthError as exc:
            tail = journal_tail(host, r.target)
            outcome = after_failure(host, rec, r.target, str(exc), poll_s=poll)
            raise DeployError(f"{name} ({r.profile.name}) failed: {exc}\n--- last journal lines of "
                              f"{r.target.unit} ---\n{tail}\n{outcome}") from None
        gate = run_release_gate(host, r.target, rec, previous, r.profile.name)
        if rec:
            rec = {**rec, "gate": gate_record(gate)}
            r.run["release"] = rec
        if not gate.passed:
            outcome = after_failure(host, rec, r.target, f"smoke gate failed: {gate.verdict.message}", poll_s=poll)
            raise DeployError(f"{name} ({r.profile.name}) failed the smoke gate: {gate.verdict.message}\n{outcome}")
        if rec:
            save_record(host, r.layout.releases_dir, rec)
            for doc in releases.mark_deployed(records(host, r.layout.releases_dir), rec["release"]):
                save_record(host, r.layout.releases_dir, doc)
            print(f"[{host.name}] release {rec['release']:04d} deployed: {r.profile.name} is serving on "
                  f"{r.target.base_url} ({gate.summary})")
            prune(host, r.layout.releases_dir)

    python.call(name="health, identity, smoke gate, record", function=reported(verify))


def prune(h, releases_dir: str) -> None:
    """Keep the last releases' files; remove venvs and checkpoints no kept release uses. Two
    commands: one reads every kept release's profile and what is on disk, one removes."""
    recs = records(h, releases_dir)
    dropped = releases.to_prune(recs)
    q = shlex.quote
    kept = " ".join(q(f"{releases.release_dir(releases_dir, rec['release'])}/profile.json")
                    for rec in recs if rec["release"] not in dropped)
    _, out = sh(h, f"for f in {kept}; do [ -f \"$f\" ] && {{ tr -d '\\n' < \"$f\"; echo; }}; done; "
                   f"echo ---; ls -d {OPT}/venvs/* {MODELS}/*/* 2>/dev/null; true")
    docs, _, on_disk = out.partition("---\n")
    used: set[str] = set()
    for line in docs.splitlines():        # one JSON document per line
        if line.strip():
            data = json.loads(line)["data"]
            layout = Layout.of(data)
            used |= {layout.venv, layout.model_dir, replicas.gateway_venv(data)} - {None}
    gone = [f"{releases.release_dir(releases_dir, n)}/files {releases.release_dir(releases_dir, n)}/profile.json"
            for n in dropped]
    unused = releases.unused(on_disk.split(), used)
    if gone or unused:
        sh(h, f"rm -rf {' '.join(gone)} {' '.join(q(p) for p in unused)}")
    for path in unused:
        print(f"[{h.name}] pruned {path} (no kept release uses it)")
