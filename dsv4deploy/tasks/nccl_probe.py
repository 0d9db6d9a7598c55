"""NCCL all-reduce probe before the restart, with the NCCL settings the new unit will get.

On PCIe-only boxes tensor-parallel NCCL often hangs right after init (IOMMU/ACS); finding
that out after a 10-minute weight load is the expensive way. A failure here stops the rollout
with the old release still serving. The twin has no GPUs: there the probe is skipped, visibly.
"""

from __future__ import annotations

import hashlib
import shlex

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import server

from dsv4deploy.host import ops, sandbox
from dsv4deploy.preflight.cli import PROBE_SCRIPT, probe_argv
from dsv4deploy.release.rollout import Rollout
from dsv4deploy.sglang.flags import home_environment

# The probe's HOME: its own private /tmp (PrivateTmp=yes in its sandbox), empty at start and
# removed by systemd when the probe ends; never the account's home nor a release's (Layout.home).
PROBE_HOME = sandbox.HOME
LAUNCH_ONLY = sandbox.LAUNCH_ONLY     # what the probe does not take from the unit (host/sandbox.py)


def sandbox_properties(unit: str) -> list[str]:
    """The rendered unit's sandbox as `systemd-run --property=` values, plus PrivateTmp=yes (the
    probe's fresh HOME): host/sandbox.py's "nccl probe" use."""
    return sandbox.properties(unit, "nccl probe")


def probe_command(argv: list[str], *, script: str, sha256: str, unit: str) -> str:
    """The probe's shell command: the uploaded program must match its sha256, and it runs as a
    transient unit with the server's own sandbox (sandbox_properties of the rendered UNIT: its
    User=, no new privileges, read-only system, its device and IP rules), HOME and every cache
    in an empty private /tmp, with what the server gets (its venv, its GPUs, `server.env`) and
    no more: root never runs it, nothing of the account's or a release's home is read, and NCCL
    bootstraps under the same IPAddressDeny=any the server does."""
    q = shlex.quote
    check = (f"echo {q(sha256 + '  ' + script)} | sha256sum -c --status - || "
             f"{{ echo {q(f'{script} does not match sha256 {sha256[:16]}: not run')} >&2; exit 1; }}; ")
    home = [a for k, v in home_environment(PROBE_HOME).items() for a in ("--env", f"{k}={v}")]
    run = ["systemd-run", "--quiet", "--wait", "--pipe", "--collect",
           *(f"--property={p}" for p in sandbox_properties(unit)), "--", *argv, *home]
    return check + " ".join(q(a) for a in run)


@deploy("NCCL probe")
def nccl_probe(r: Rollout) -> None:
    if r.stand_ins.get("skip_nccl_probe"):
        logger.warning(f"[{host.name}] NCCL probe skipped: {r.stand_ins['skip_nccl_probe']}")
        return
    script = f"{r.layout.venv}/nccl_probe.py"
    env_file = f"{r.layout.config_dir}/nccl.env.next"
    program = PROBE_SCRIPT.read_bytes()
    ops.file(name="probe program", dest=script, content=program, state=None, mode="644")
    ops.file(name="NCCL env of the new release", dest=env_file, content=r.rendered.nccl_env.encode(), state=None,
             mode="644")
    argv = probe_argv(r.data, script=script, env_file=env_file,
                      timeout_s=float(host.data.get("nccl_probe_timeout_s", 60)))
    where = (f"GPU sets {argv[argv.index('--groups') + 1]} at once and alone" if "--groups" in argv
             else f"{argv[argv.index('--nranks') + 1]} GPUs")
    server.shell(name=f"all-reduce 8 KiB..64 MiB on {where} as {r.data['service']['user']} in the unit's sandbox "
                      "(hard timeout)",
                 commands=[probe_command(argv, script=script, sha256=hashlib.sha256(program).hexdigest(),
                                         unit=r.rendered.unit)])
