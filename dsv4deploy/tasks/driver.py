"""The NVIDIA driver and the CUDA toolkit, from NVIDIA's CUDA repository, the way NVIDIA's driver
installation guide says for Ubuntu and Debian
(https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/): the `cuda-keyring` package
adds the repository; the running kernel's headers come first (DKMS builds the open kernel modules
against them); the branch is held by NVIDIA's own pinning package, installed before the driver
(`apt install nvidia-driver-pinning-<branch>`: the guide's "Version locking" page, APT section,
https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/version-locking.html), never by
a hand-written pin: from 590 the Ubuntu packages drop the branch from their names, and a list of
name patterns misses whatever a later branch adds. Then `nvidia-open` (the open modules, which
Blackwell needs).

The toolkit (`driver.cuda_toolkit`, e.g. cuda-toolkit-13-0) is installed even when the driver is
already right: SGLang's JIT kernels and flashinfer's JIT find nvcc and the driver stubs
(lib64/stubs/libcuda.so, which the nvcc pip wheel lacks) under CUDA_HOME, else /usr/local/cuda,
which is why the unit names /usr/local/cuda/bin on its PATH.

It never reboots on its own: it records that a reboot is required (the flag holds the boot's id)
and stops; while the flag's boot is the running one, preflight refuses every deploy with one
line. `--data allow_reboot=true` reboots instead and waits `driver.reboot_wait_s` (900 s by
default: an 8-GPU server's firmware takes minutes) for the host to come back on a new boot.
"""

from __future__ import annotations

import json
import shlex
import time

from pyinfra import host
from pyinfra.api import DeployError, deploy
from pyinfra.facts.server import KernelVersion, LinuxDistribution
from pyinfra.operations import python, server

from dsv4deploy.host import ops
from dsv4deploy.host.nvidia_apt import (KEYRING_DEB, KEYRING_PACKAGE, REBOOT_FLAG, fetch_checked, header_packages,
                                       pinning_package, repo_distro, repository)
from dsv4deploy.host.reboot import REBOOT_WAIT_S, reboot_and_wait
from dsv4deploy.profile.errors import rerun_with
from dsv4deploy.release.rollout import Rollout
from dsv4deploy.tasks.release import reported

APT_INSTALL = "DEBIAN_FRONTEND=noninteractive apt-get install -y -q"

def reboot_pending(r: Rollout, state) -> str | None:
    """Preflight's line while a driver install waits for its reboot (the flag's boot is the running
    one), unless this run may reboot; None otherwise (a flag from an earlier boot is cleared below)."""
    flag, boot = state["reboot"], (state["boot_id"] or "").strip()
    if not flag or flag.get("boot_id") != boot or r.allow_reboot:
        return None
    return (f"a reboot is pending: the NVIDIA driver {flag.get('driver', '?')} was installed at {flag.get('at', '?')}; "
            f"reboot the host (or {rerun_with('allow_reboot=true', f'deploy PROFILE={r.profile.name}')}), "
            "then deploy again")


def _apt(names: list[str]) -> str:
    return f"{APT_INSTALL} {' '.join(shlex.quote(n) for n in names)}"


@deploy("NVIDIA driver and CUDA toolkit")
def driver(r: Rollout, needed: bool, state) -> None:
    branch = r.data["driver"]["branch"]
    flag, boot = state["reboot"], (state["boot_id"] or "").strip()
    if flag and flag.get("boot_id") != boot:
        server.shell(name="clear the reboot flag: the host booted since the driver install",
                     commands=[f"rm -f {REBOOT_FLAG}"])
    if r.stand_ins.get("driver"):
        # A test host that cannot load a kernel module or reach NVIDIA's repository: the inventory's
        # stand-in command makes its nvidia-smi report a driver of the profile's branch (no reboot).
        if needed:
            server.shell(name=f"stand-in: driver {branch} (the inventory's command)",
                         commands=[r.stand_ins["driver"]["install"].format(branch=branch)])
        else:
            host.noop(f"nvidia-smi reports a driver of branch >= {branch}")
        return
    installed = state["packages"] or {}
    toolkit = r.data["driver"].get("cuda_toolkit")
    wanted = [toolkit] if toolkit and not installed.get(toolkit) else []
    pending = bool(flag) and flag.get("boot_id") == boot
    if not needed and not wanted:
        host.noop(f"nvidia-smi reports a driver of branch >= {branch}; {toolkit or 'no toolkit'} installed")
    if needed or wanted:
        dist = host.get_fact(LinuxDistribution)
        if not installed.get(KEYRING_PACKAGE):
            url, digest = repository(host.data, repo_distro(dist))
            ops.file(name=f"NVIDIA CUDA repository key package, sha256 {digest[:12]} ({url})",
                     dest=KEYRING_DEB, content=fetch_checked(url, digest), state=None, mode="600")
            server.shell(name="install cuda-keyring (NVIDIA's repository and its signing key)",
                         commands=[f"dpkg -i {KEYRING_DEB} && rm -f {KEYRING_DEB}"])
        server.shell(name="apt-get update (NVIDIA's repository and the distribution's)",
                     commands=["apt-get update -q"])
    if needed:
        headers = header_packages(dist, host.get_fact(KernelVersion))
        server.shell(name=f"the running kernel's headers first, for DKMS ({', '.join(headers)})",
                     commands=[_apt(headers)])
        server.shell(name=f"hold the driver at branch {branch} ({pinning_package(branch)}, NVIDIA's pin)",
                     commands=[_apt([pinning_package(branch)])])
        server.shell(name=f"nvidia-open (branch {branch}, open kernel modules){' and ' + toolkit if wanted else ''}",
                     commands=[_apt(["nvidia-open", *wanted])])
        ops.file(name="record: reboot required", dest=REBOOT_FLAG, state=None, mode="644",
                 content=_flag(branch, boot).encode())
    elif wanted:
        server.shell(name=f"{toolkit} (the unit's PATH names /usr/local/cuda/bin)", commands=[_apt(wanted)])
    if not (needed or pending):
        return
    if r.allow_reboot:
        wait = int(r.data["driver"].get("reboot_wait_s", REBOOT_WAIT_S))
        reboot_and_wait(name=f"reboot to load the new driver (allow_reboot=true; waits up to {wait} s)",
                        wait_s=wait, before=f"rm -f {REBOOT_FLAG}")
    else:
        line = (f"the NVIDIA driver {branch} was installed: reboot the host (or "
                f"{rerun_with('allow_reboot=true', f'deploy PROFILE={r.profile.name}')}), then deploy again")

        def stop(state, host):
            raise DeployError(line)

        python.call(name="stop: reboot required", function=reported(stop))


def _flag(branch: int, boot: str) -> str:
    """The flag: the branch installed, when, and the boot it was installed in (this run's)."""
    return json.dumps({"driver": branch, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                       "boot_id": boot}) + "\n"
