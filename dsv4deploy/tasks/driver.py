"""The NVIDIA driver: installed only when nvidia-smi is missing or older than the profile's
branch. Blackwell needs the open kernel modules (nvidia-open) from NVIDIA's CUDA repository.
It never reboots on its own: it records that a reboot is required and stops, unless the run
says `--data allow_reboot=true` (through make: `ARGS="--data allow_reboot=true"`).
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import DeployError, deploy
from pyinfra.facts.server import LinuxDistribution
from pyinfra.operations import apt, files, python, server

from dsv4deploy.profile.errors import rerun_with
from dsv4deploy.host import ops
from dsv4deploy.render.layout import STATE
from dsv4deploy.release.rollout import Rollout

REBOOT_FLAG = f"{STATE}/reboot-required"
CUDA_REPO = "https://developer.download.nvidia.com/compute/cuda/repos/{distro}/x86_64/cuda-keyring_1.1-1_all.deb"


def _repo_distro() -> str:
    dist = host.get_fact(LinuxDistribution)
    name = (dist.get("name") or "").lower()
    major, minor = dist.get("major"), dist.get("minor")
    if name == "ubuntu":
        return f"ubuntu{major}{int(minor or 0):02d}"
    return f"debian{major}"


@deploy("NVIDIA driver")
def driver(r: Rollout, needed: bool) -> None:
    if not needed:
        host.noop(f"nvidia-smi reports a driver of branch >= {r.data['driver']['branch']}")
        return
    branch = r.data["driver"]["branch"]
    if r.stand_ins.get("driver"):
        # A test host that cannot load a kernel module: the inventory's stand-in command makes its
        # nvidia-smi report a driver of the profile's branch. No reboot is needed for it.
        server.shell(name=f"stand-in: driver {branch} (the inventory's command)",
                     commands=[r.stand_ins["driver"]["install"].format(branch=branch)])
        return

    distro = _repo_distro()
    apt.packages(name="prerequisites", packages=["ca-certificates", "curl", "gnupg"], update=True, cache_time=3600)
    apt.deb(name="NVIDIA CUDA repository (cuda-keyring)", src=CUDA_REPO.format(distro=distro))
    ops.file(name=f"pin the driver to branch {branch}",
             content=(f"Package: nvidia-open* nvidia-driver* libnvidia-* nvidia-kernel-* cuda-drivers*\n"
                      f"Pin: version {branch}.*\nPin-Priority: 1001\n").encode(),
             dest="/etc/apt/preferences.d/dsv4deploy-nvidia-driver", state=None, mode="644")
    packages = ["nvidia-open"]
    if r.data["driver"].get("cuda_toolkit"):
        packages.append(r.data["driver"]["cuda_toolkit"])
    install = apt.packages(name=f"nvidia-open (branch {branch}, open kernel modules) and CUDA toolkit",
                           packages=packages, update=True)
    files.file(name="record: reboot required", path=REBOOT_FLAG, touch=True, _if=install.did_change)
    if r.allow_reboot:
        server.reboot(name="reboot to load the new driver (allow_reboot=true)", _if=install.did_change)
        files.file(name="clear reboot flag", path=REBOOT_FLAG, present=False)
    else:
        python.raise_exception(name="stop: reboot required", exception=DeployError,
                               args=[f"the NVIDIA driver {branch} was installed: reboot the host (or "
                                     f"{rerun_with('allow_reboot=true', f'deploy PROFILE={r.profile.name}')}), "
                                     "then deploy again"],
                               _if=install.did_change)
