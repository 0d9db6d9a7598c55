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

from dsv4deploy.gate.bench_serving import drop_privileges
from dsv4deploy.host import ops
from dsv4deploy.preflight.cli import PROBE_SCRIPT, probe_argv
from dsv4deploy.release.rollout import Rollout


def probe_command(argv: list[str], *, script: str, sha256: str, user: str, home: str) -> str:
    """The probe's shell command: the uploaded program must match its sha256, and it runs as the
    service's user, with what the server gets (its venv, its GPUs, `server.env`) and no more:
    root never runs it, so a `server.env` such as PYTHONPATH or LD_PRELOAD pointing at a folder
    the server can write reaches nothing the server could not do itself."""
    q = shlex.quote
    check = (f"echo {q(sha256 + '  ' + script)} | sha256sum -c --status - || "
             f"{{ echo {q(f'{script} does not match sha256 {sha256[:16]}: not run')} >&2; exit 1; }}; ")
    return check + " ".join(q(a) for a in [*drop_privileges(user), "env", f"HOME={home}", *argv])


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
    server.shell(name=f"all-reduce 8 KiB..64 MiB on {where} as {r.data['service']['user']} (hard timeout)",
                 commands=[probe_command(argv, script=script, sha256=hashlib.sha256(program).hexdigest(),
                                         user=r.data["service"]["user"], home=r.layout.state_dir)])
