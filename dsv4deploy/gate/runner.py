"""Run the gate on the host and judge it: ``run_gate(spec, host, server, options) -> GateOutcome``
(gate/inputs.py: where it runs, the server it measures, how its levels run).

The gate runs ON THE HOST (the server listens on 127.0.0.1 there): ``host.execute(cmd, timeout_s)
-> (exit_code, stdout, stderr)`` runs one shell command on it (the deploy passes a pyinfra
wrapper, tests a local subprocess) and ``host.upload(local_path, remote_path)`` puts the built-in
client there: into a root-owned 0700 directory, checked against its sha256 before each run, and
run as an unprivileged user (the service user runs model code and must not be able to swap it).
Runner ``auto``: bench_serving when the server's venv has SGLang's benchmark client, else the
built-in client.  One probe (one execute) finds the module without importing SGLang (whose
``__init__`` pulls in torch): ``sglang.benchmark.serving``, else the older
``sglang.bench_serving`` (a deprecated shim from 0.5.17 on, the client itself in 0.5.14 and
before).  Every execute carries a timeout a little above what is left of the budget, so
nothing hangs.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dsv4deploy.gate import bench_serving as bs
from dsv4deploy.gate.inputs import Execute, GateHost, GateOptions, GateServer, Upload
from dsv4deploy.gate.result import FAILED, GateResult, LevelResult
from dsv4deploy.gate.spec import GateSpec
from dsv4deploy.gate.verdict import GateVerdict, judge

CLIENT_PATH = Path(__file__).with_name("client.py")
CLIENT_MISMATCH_RC = 96
PROBE_TIMEOUT_S = 60.0         # the probe imports nothing (no torch): python starts and looks at files
SSH_SLACK_S = 30.0
HEARTBEAT_S = 1.0              # the client's heartbeat on stderr: it exits when its session is gone


@dataclass
class GateOutcome:
    spec: GateSpec
    result: GateResult
    verdict: GateVerdict

    @property
    def passed(self) -> bool:
        return self.verdict.passed

    @property
    def summary(self) -> str:
        return self.verdict.summary

    def to_dict(self) -> dict:
        return {"spec": self.spec.to_dict(), "result": self.result.to_dict(), "verdict": self.verdict.to_dict()}


# The client's own imports, none of which `pip install --no-deps sglang` brings: torch (SGLang's
# __init__), transformers (the tokenizer), aiohttp, numpy, requests, tqdm.
PROBE_DEPENDENCIES = ("torch", "transformers", "aiohttp", "numpy", "requests", "tqdm")

# Prints the first of bs.MODULES the venv has and exits 0; "<module> missing <names>" (exit 3)
# when that module's imports are absent; an empty line (exit 3) when it has neither.  find_spec
# on a top-level name locates it without running it: sglang's __init__ (which imports torch)
# never runs; its submodules are looked up in its directories with PathFinder, which imports
# nothing either (importlib.util.find_spec('sglang.x') would import the package first).
PROBE_CODE = (
    "import sys, importlib.util as u, importlib.machinery as m; "
    "s = u.find_spec('sglang'); p = list(s.submodule_search_locations or []) if s else []; "
    "b = m.PathFinder.find_spec('benchmark', p) if p else None; "
    "q = list(b.submodule_search_locations or []) if b else []; "
    f"n = {bs.MODULE!r} if q and m.PathFinder.find_spec('serving', q) "
    f"else {bs.LEGACY_MODULE!r} if p and m.PathFinder.find_spec('bench_serving', p) else ''; "
    f"d = [x for x in {PROBE_DEPENDENCIES!r} if u.find_spec(x) is None] if n else []; "
    "print(n + (' missing ' + ' '.join(d) if d else '')); sys.exit(0 if n and not d else 3)")


def probe_command(venv_python: str, run_as: str | None = None) -> str:
    """One command that prints which bench_serving module `venv_python` can run (see PROBE_CODE),
    as RUN_AS (the gate's account) when given: the venv's python runs its site-packages' .pth
    files at start, and root never runs what it installed (issue 37)."""
    argv = [*bs.drop_privileges(run_as), venv_python, "-I", "-c", PROBE_CODE]       # -I: host/__init__.py
    return " ".join(shlex.quote(a) for a in argv) + " 2>/dev/null"


def probe_module(execute: Execute, venv_python: str, run_as: str | None = None) -> tuple[str | None, bool, str]:
    """(the module the venv has or None, whether its imports are there too, what the probe found)."""
    try:
        rc, out, _ = execute(probe_command(venv_python, run_as), PROBE_TIMEOUT_S)
    except Exception as e:  # noqa: BLE001 - any failure to probe means: no module known
        return None, False, f"probing {venv_python} failed ({type(e).__name__}: {e})"
    lines = [ln.split() for ln in (out or "").splitlines() if ln.strip()]
    words = lines[-1] if lines else []
    module = words[0] if words and words[0] in bs.MODULES else None
    if module is None:
        return None, False, f"{venv_python} has neither {' nor '.join(bs.MODULES)} (exit {rc})"
    old = " (sglang.benchmark.serving is absent)" if module == bs.LEGACY_MODULE else ""
    if rc == 0 and len(words) == 1:
        return module, True, f"{venv_python} has {module}{old}"
    missing = ", ".join(words[2:]) if words[1:2] == ["missing"] else f"exit {rc}"
    return module, False, f"{venv_python} has {module}{old} but not what it imports ({missing})"


def choose_runner(requested: str, execute: Execute, venv_python: str,
                  run_as: str | None = None) -> tuple[str, str, str | None]:
    """(runner, why, bench_serving module or None).  ``auto``: bench_serving if the server venv
    has it and what it imports, else builtin.  ``bench_serving`` probes only to pick the module
    (the new one when the probe finds neither: the level then fails with its import error)."""
    if requested == "builtin":
        return "builtin", "runner builtin (profile)", None
    module, runnable, found = probe_module(execute, venv_python, run_as)
    if requested == "bench_serving":
        if module is None:
            return "bench_serving", f"runner bench_serving (profile); {found}: trying {bs.MODULE}", bs.MODULE
        return "bench_serving", f"runner bench_serving (profile); {found}", module
    if module is None or not runnable:
        return "builtin", f"auto: {found}; built-in client", None
    return "bench_serving", f"auto: {found}", module


def client_levels(spec: GateSpec, order: str) -> list[dict]:
    return [lv.to_dict() for lv in spec.run_order(order)]


def client_sha256() -> str:
    return hashlib.sha256(CLIENT_PATH.read_bytes()).hexdigest()


def prepare_command(client_dir: str, *, as_root: bool) -> str:
    """Make the client's directory (0700; root-owned when the gate drops privileges) and print the
    installed client's sha256, so an unchanged client is not uploaded again."""
    q = shlex.quote
    owner = (f'[ "$(stat -c %u:%a {q(client_dir)})" = 0:700 ] || {{ echo "{client_dir} is not root-owned 0700" >&2; '
             f"exit {CLIENT_MISMATCH_RC}; }}; " if as_root else "")
    return (f"mkdir -p {q(client_dir)} && chmod 700 {q(client_dir)} && {owner}"
            f"{{ sha256sum {q(client_dir + '/client.py')} 2>/dev/null || true; }}")


def builtin_command(spec: GateSpec, host: GateHost, server: GateServer, options: GateOptions = GateOptions(), *,
                    budget_s: float | None = None, sha256: str | None = None, seed: int = 42) -> str:
    """The remote shell command. The client (HOST.client_dir/client.py) must match its sha256, is
    fed to python on stdin (so the unprivileged user never needs to read the 0700 directory), and
    gets the API key on fd 3, opened by the shell before privileges are dropped: never argv, never
    environment."""
    q = shlex.quote
    client_path, api_key_file = f"{host.client_dir}/client.py", server.api_key_file
    digest = sha256 or client_sha256()
    budget = float(spec.budget_s if budget_s is None else budget_s)
    argv = bs.drop_privileges(host.run_as) + [
        host.host_python, "-I", "-S", "-", "--base-url", server.base_url,     # isolated, stdlib only: host/__init__.py
        "--levels", json.dumps(client_levels(spec, options.order), separators=(",", ":")),
        "--warmup-requests", str(spec.warmup_requests),
        "--max-failed", str(spec.max_failed_requests), "--budget-s", f"{budget:.3f}",
        "--gate-budget-s", f"{float(spec.budget_s):g}", "--seed", str(seed),
        "--heartbeat-s", f"{HEARTBEAT_S:g}"]
    if options.fail_fast:
        argv.append("--fail-fast")
    if not options.early_stop:
        argv.append("--no-early-stop")
    if options.early_pass and spec.early_pass_margin is not None:
        argv += ["--early-pass-margin", f"{spec.early_pass_margin:g}"]
        if spec.early_pass_min_requests:
            argv += ["--early-pass-min", str(spec.early_pass_min_requests)]
    check = (f"echo {q(digest + '  ' + client_path)} | sha256sum -c --status - || "
             f"{{ echo {q(f'gate client {client_path} does not match sha256 {digest[:16]}: not run')} >&2; "
             f"exit {CLIENT_MISMATCH_RC}; }}; ")
    key = (f"if [ -s {q(api_key_file)} ]; then exec 3<{q(api_key_file)}; set -- --api-key-fd 3; else set --; fi; "
           if api_key_file else "set --; ")
    return check + key + " ".join(q(a) for a in argv) + f' "$@" <{q(client_path)}'


def _failed_levels(spec: GateSpec, order: str, reason: str) -> list[LevelResult]:
    return [LevelResult(concurrency=lv.concurrency, num_prompts=lv.num_prompts, input_len=lv.input_len,
                        output_len=lv.output_len, status=FAILED, reason=reason, failed=lv.num_prompts)
            for lv in spec.run_order(order)]


def parse_client_output(rc: int | None, stdout: str, stderr: str, spec: GateSpec, *, order: str = "desc",
                        base_url: str | None = None, budget_s: float | None = None) -> GateResult:
    """The built-in client's stdout (one JSON document) as a GateResult; a crash or garbage is
    a GateResult with ``error`` set and every level failed."""
    doc = None
    text = (stdout or "").strip()
    if text:
        for cand in (text, text.splitlines()[-1]):
            try:
                doc = json.loads(cand)
                break
            except ValueError:
                continue
    if isinstance(doc, dict):
        try:
            res = GateResult.from_dict(doc)
            if rc not in (0, None):
                res.error = f"client exited {rc} after writing its result"
            return res
        except (ValueError, TypeError, KeyError) as e:
            why = f"client output is not a gate result ({type(e).__name__}: {e})"
    else:
        why = "client wrote no JSON result"
    tail = (stderr or "").strip().splitlines()[-3:]
    err = f"{why}; exit {rc}" + (f"; stderr: {' | '.join(tail)[-400:]}" if tail else "")
    return GateResult(runner="builtin", levels=_failed_levels(spec, order, err), base_url=base_url,
                      started_at=time.time(), budget_s=budget_s, error=err)


@dataclass
class Prepared:
    """What a gate run needs before its first request, found with the server not up yet (a
    deploy prepares while its server starts): the runner chosen and why, and for the built-in
    client, whether it is in place (ERROR: why not; the gate then fails with it)."""
    runner: str
    why: str
    module: str | None = None
    error: str | None = None


def prepare_gate(spec: GateSpec, host: GateHost, venv_python: str, runner: str | None = None) -> Prepared:
    """Choose the runner (one probe of VENV_PYTHON; RUNNER None: the spec's) and put the built-in
    client in place (its 0700 directory, uploaded only when its sha256 differs). Neither needs
    the server."""
    chosen, why, module = choose_runner(runner or spec.runner, host.execute, venv_python, host.run_as)
    if chosen != "builtin":
        return Prepared(chosen, why, module)
    if host.upload is None:
        raise ValueError("the built-in runner needs upload(local_path, remote_path)")
    try:
        install_client(host.execute, host.upload, host.client_dir, as_root=bool(host.run_as))
    except Exception as e:  # noqa: BLE001 - upload failed, the SSH call broke: a failed gate
        return Prepared(chosen, why, error=f"{type(e).__name__}: {e}")
    return Prepared(chosen, why)


def run_gate(spec: GateSpec, host: GateHost, server: GateServer, options: GateOptions = GateOptions(), *,
             log: Callable[[str], None] | None = None, prepared: Prepared | None = None) -> GateOutcome:
    """Run the gate on the host against SERVER and judge it. PREPARED: prepare_gate's answer when
    the caller prepared already (else prepared here)."""
    t0 = time.monotonic()
    say = log or (lambda _m: None)
    ready = prepared or prepare_gate(spec, host, server.venv_python, options.runner)
    say(f"gate: {ready.why}")
    remaining = max(1.0, spec.budget_s - (time.monotonic() - t0))
    base_url, order = server.base_url, options.order
    if ready.runner == "bench_serving":
        result = bs.run(spec, host, server, options, budget_s=remaining, module=ready.module or bs.MODULE, log=log)
    else:
        if ready.error:
            rc, out, err = None, "", ready.error
        else:
            try:
                cmd = builtin_command(spec, host, server, options, budget_s=remaining)
                rc, out, err = host.execute(cmd, remaining + SSH_SLACK_S)
                err = "\n".join(line for line in (err or "").splitlines() if line.strip())   # heartbeats
            except Exception as e:  # noqa: BLE001 - the SSH call timed out or broke: a failed gate
                rc, out, err = None, "", f"{type(e).__name__}: {e}"
        result = parse_client_output(rc, out, err, spec, order=order, base_url=base_url, budget_s=remaining)
        if err and log:
            for line in err.strip().splitlines()[-12:]:
                say(line)
    result.client["runner_choice"] = ready.why
    result.client["controller_wall_s"] = round(time.monotonic() - t0, 3)
    verdict = judge(spec, result)
    say(verdict.summary)
    return GateOutcome(spec, result, verdict)


class ClientInstallError(RuntimeError):
    """The gate client could not be put in place on the host: the gate fails (and rolls back)."""


def install_client(execute: Execute, upload: Upload, client_dir: str, *, as_root: bool) -> None:
    """The client in its 0700 directory, uploaded only when its sha256 differs; raises on failure."""
    digest = client_sha256()
    rc, out, err = execute(prepare_command(client_dir, as_root=as_root), 60)
    if rc != 0:
        raise ClientInstallError(f"cannot prepare {client_dir} (exit {rc}): {err.strip()[-300:]}")
    if out.split()[:1] == [digest]:
        return
    if upload(str(CLIENT_PATH), f"{client_dir}/client.py") is False:
        raise ClientInstallError(f"uploading the gate client to {client_dir} failed")


def local_execute(cmd: str, timeout_s: float) -> tuple[int, str, str]:
    """execute() for a gate run on this machine (tests, `bench/`): bash -c with a hard timeout;
    on timeout the process group is killed and 124 returned."""
    import os
    import signal
    import subprocess

    p = subprocess.Popen(["bash", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout_s)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return 124, out, err + f"\n(local_execute: killed after {timeout_s:.0f} s)"


def local_upload(local_path: str, remote_path: str) -> bool:
    import shutil

    Path(remote_path).parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(local_path, remote_path)
    return True
