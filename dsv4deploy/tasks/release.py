"""The release store and the deploy lock on the host, and the verification that turns a
pending release into a deployed (or failed) one.

The lock is taken while pyinfra prepares (before any change) and given back when the last
operation ends or one fails, so a run that changes nothing reports no changed operation.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import shlex
import socket
from io import StringIO

from pyinfra import host, state
from pyinfra.context import ctx_host, ctx_state
from pyinfra.api import BaseStateCallback, DeployError, deploy
from pyinfra.operations import python

from .. import releases
from ..facts import JsonFile, Releases
from ..health import HealthError, Observation, identity_problems, wait_healthy
from ..layout import STATE
from ..rollout import Rollout

LOCK = f"{STATE}/deploy.lock"


def sh(h, command: str) -> tuple[bool, str]:
    ok, out = h.run_shell_command(command)
    return ok, out.stdout


def write_json(h, path: str, doc: dict) -> None:
    h.put_file(StringIO(json.dumps(doc, indent=2, sort_keys=True) + "\n"), f"{path}.tmp")
    ok, _ = sh(h, f"mv {shlex.quote(path)}.tmp {shlex.quote(path)}")
    if not ok:
        raise DeployError(f"cannot write {path}")


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

    def __init__(self, h):
        self.host = h
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

    def operation_end(self, st, op_hash):  # noqa: N805 - pyinfra calls these on the instance
        order = st.get_op_order()
        if order and op_hash == order[-1]:
            self._release()

    def operation_host_error(self, st, h, op_hash, retry_count=0, max_retries=0):
        if h is self.host and not st.get_op_data_for_host(h, op_hash).global_arguments.get("_ignore_errors"):
            self._release()


def deploy_lock(r: Rollout) -> None:
    """Take the host's deploy lock now (prepare stage); refuse with the holder's PID and start.

    A dry run (`--dry`, `make plan`) changes nothing, so it takes no lock."""
    if "--dry" in sys.argv:
        return
    me = {"controller": socket.gethostname(), "pid": os.getpid(), "started": releases.now(),
          "profile": r.profile.name}
    for attempt in range(2):
        ok, _ = sh(host, f"mkdir -p {STATE} && mkdir {LOCK} 2>/dev/null")
        if ok:
            write_json(host, f"{LOCK}/owner.json", me)
            ctx_state.get().add_callback_handler(_ReleaseLock(ctx_host.get()))  # the real Host, not the proxy
            return
        holder = host.get_fact(JsonFile, path=f"{LOCK}/owner.json") or {}
        stale = holder.get("controller") == me["controller"] and not _pid_alive(int(holder.get("pid", 0)))
        if (stale or host.data.get("break_lock")) and attempt == 0:
            sh(host, f"rm -rf {LOCK}")
            continue
        raise DeployError(
            f"another deploy holds the lock on this host: PID {holder.get('pid', '?')} on "
            f"{holder.get('controller', '?')} since {holder.get('started', '?')} (profile "
            f"{holder.get('profile', '?')}). If that run is gone, run again with --data break_lock=true.")


# --- releases ---------------------------------------------------------------------------------

def _observe(r: Rollout):
    """One poll: HTTP status of /health (or /ready first) and the unit's state, in one command."""
    unit = f"{r.layout.service}.service"
    path = r.run.get("probe_path", "/health")

    def observe() -> Observation:
        _, out = sh(host, f"curl -s -o /dev/null -w '%{{http_code}}\\n' --max-time 20 {r.base_url}{path}; "
                          f"systemctl show -p ActiveState -p SubState -p MainPID -p NRestarts {unit}")
        lines = out.splitlines()
        info = dict(line.split("=", 1) for line in lines[1:] if "=" in line)
        code = lines[0].strip() if lines else "000"
        return Observation(http=int(code) if code.isdigit() else 0,
                           active_state=info.get("ActiveState", ""), sub_state=info.get("SubState", ""),
                           main_pid=int(info.get("MainPID", 0) or 0), n_restarts=int(info.get("NRestarts", 0) or 0))
    return observe


def journal_tail(r: Rollout, lines: int = 30) -> str:
    _, out = sh(host, f"journalctl -u {r.layout.service}.service -n {lines} --no-pager -o cat 2>&1 || true")
    return out


def settle_interrupted(r: Rollout) -> None:
    """A `pending` release left by a cut-off run is settled before anything else happens."""
    records = host.get_fact(Releases, releases_dir=r.layout.releases_dir)
    if not any(rec["status"] == releases.PENDING for rec in records):
        return

    def settle(state, host):  # noqa: pyinfra passes (state, host) by these names
        host_ = host
        live = host_.get_fact(JsonFile, path=r.layout.manifest)
        import hashlib
        live_sha = hashlib.sha256((json.dumps(live, indent=2, sort_keys=True) + "\n").encode()).hexdigest() if live else None
        healthy = _observe(r)().http == 200
        for doc in releases.settle_interrupted(host_.get_fact(Releases, releases_dir=r.layout.releases_dir),
                                               live_sha, healthy):
            write_json(host_, f"{releases.release_dir(r.layout.releases_dir, doc['release'])}/status.json", doc)

    python.call(name="settle releases left pending by an interrupted run", function=settle)


def needs_release(r: Rollout) -> bool:
    """Prepare-time part of the decision: is the deployed release's manifest the one we render?"""
    records = host.get_fact(Releases, releases_dir=r.layout.releases_dir)
    live = releases.current(records)
    return live is None or live["manifest_sha256"] != r.manifest_sha256


@deploy("Release")
def begin_release(r: Rollout, when) -> None:
    """Write release NNNN as pending, with the resolved profile and the rendered files."""

    def begin(state, host):  # noqa: pyinfra passes (state, host) by these names
        host_ = host
        records = host_.get_fact(Releases, releases_dir=r.layout.releases_dir)
        rec = releases.new_record(records, profile=r.profile.name, content_hash=r.profile.content_hash,
                                  manifest_sha256=r.manifest_sha256,
                                  sglang_version=r.data["sglang"]["version"])
        folder = releases.release_dir(r.layout.releases_dir, rec["release"])
        sh(host_, f"mkdir -p {folder}/files")
        write_json(host_, f"{folder}/profile.json", {"name": r.profile.name, "files": list(r.profile.files),
                                                     "data": r.profile.data})
        for path, text in r.rendered.files.items():
            target = f"{folder}/files{path}"
            sh(host_, f"mkdir -p {shlex.quote(os.path.dirname(target))}")
            host_.put_file(StringIO(text), target)
        write_json(host_, f"{folder}/status.json", rec)
        r.run["release"] = rec
        print(f"[{host_.name}] release {rec['release']:04d} pending ({r.profile.name})")

    python.call(name="record release (pending, before the switch)", function=begin, _if=when)


@deploy("Verify")
def verify_and_record(r: Rollout, when) -> None:
    """Wait for health within the profile's budget, prove it is our server, record the verdict."""
    budget = r.data["service"]["health_timeout_s"]

    def verify(state, host):  # noqa: pyinfra passes (state, host) by these names
        host_ = host
        rec = r.run.get("release")
        try:
            wait_healthy(_observe(r), budget_s=budget, poll_s=float(host_.data.get("health_poll_s", 2.0)))
            problems = _identity(r, host_)
            if problems:
                raise HealthError("the server answering is not the one this release started: " + "; ".join(problems))
        except HealthError as exc:
            reason = str(exc)
            tail = journal_tail(r)
            if rec:
                doc = releases.with_status(rec, releases.FAILED, reason)
                write_json(host_, f"{releases.release_dir(r.layout.releases_dir, rec['release'])}/status.json", doc)
            # TODO(issue 5): roll back to the last deployed release here.
            raise DeployError(f"release {rec['release']:04d} failed: {reason}\n--- last journal lines of "
                              f"{r.layout.service}.service ---\n{tail}" if rec else reason) from None
        if rec:
            records = host_.get_fact(Releases, releases_dir=r.layout.releases_dir)
            for doc in releases.mark_deployed(records, rec["release"]):
                write_json(host_, f"{releases.release_dir(r.layout.releases_dir, doc['release'])}/status.json", doc)
            print(f"[{host_.name}] release {rec['release']:04d} deployed: {r.profile.name} is serving on {r.base_url}")

    python.call(name="health, identity, record", function=verify, _if=when)


def _identity(r: Rollout, h) -> list[str]:
    port = r.data["server"]["port"]
    _, out = sh(h, f"ss -Htlnp 'sport = :{port}' | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u; echo ---; "
                   f"systemctl show -p MainPID --value {r.layout.service}.service; echo ---; "
                   f"sed -n 's/^SGLANG_API_KEY=/Authorization: Bearer /p' {r.layout.secrets_env} 2>/dev/null "
                   f"| curl -s --max-time 20 -H @- {r.base_url}/server_info")
    pids_txt, main_txt, info_txt = (out.split("---\n") + ["", "", ""])[:3]
    try:
        info = json.loads(info_txt) if info_txt.strip() else None
    except json.JSONDecodeError:
        info = None
    server = r.data["server"]
    expected = {"model_path": r.layout.model_dir, "tp_size": server["tp_size"],
                "mem_fraction_static": server["mem_fraction_static"]}
    if server.get("context_length"):
        expected["context_length"] = server["context_length"]
    return identity_problems(port_pids=[int(p) for p in pids_txt.split() if p.isdigit()],
                             main_pid=int(main_txt.strip() or 0), server_info=info, expected=expected)
