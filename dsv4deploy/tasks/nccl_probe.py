"""NCCL all-reduce probe before the restart, with the NCCL settings the new unit will get.

On PCIe-only boxes tensor-parallel NCCL often hangs right after init (IOMMU/ACS); finding
that out after a 10-minute weight load is the expensive way. A failure here stops the rollout
with the old release still serving. The twin has no GPUs: there the probe is skipped, visibly.
"""

from __future__ import annotations

import shlex
from io import StringIO

from pyinfra import host, logger
from pyinfra.api import deploy
from pyinfra.operations import files, server

from ..preflight.cli import PROBE_SCRIPT, probe_argv
from ..rollout import Rollout


@deploy("NCCL probe")
def nccl_probe(r: Rollout) -> None:
    if r.stand_ins.get("skip_nccl_probe"):
        logger.warning(f"[{host.name}] NCCL probe skipped: {r.stand_ins['skip_nccl_probe']}")
        return
    script = f"{r.layout.venv}/nccl_probe.py"
    env_file = f"{r.layout.config_dir}/nccl.env.next"
    files.put(name="probe program", src=str(PROBE_SCRIPT), dest=script, mode="644")
    files.put(name="NCCL env of the new release", src=StringIO(r.rendered.nccl_env), dest=env_file, mode="644")
    argv = probe_argv(r.data, script=script, env_file=env_file,
                      timeout_s=float(host.data.get("nccl_probe_timeout_s", 60)))
    where = (f"GPU sets {argv[argv.index('--groups') + 1]} at once and alone" if "--groups" in argv
             else f"{argv[argv.index('--nranks') + 1]} GPUs")
    server.shell(name=f"all-reduce 8 KiB..64 MiB on {where} (hard timeout)",
                 commands=[" ".join(shlex.quote(a) for a in argv)])
