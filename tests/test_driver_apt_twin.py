"""The driver step's real apt commands on an isolated twin (fleet `apt`, DSV4_SIM_APT_FLEET to
rename it), against a stand-in of NVIDIA's CUDA repository served from this machine
(tests/apt_repo.py: branches 580 and 590 both offered). The twin runs without the driver's
stand-in (DSV4_SIM_DRIVER=apt), so the deploy fetches the keyring, checks its sha256 and
installs it, then installs the headers, NVIDIA's pinning package and nvidia-open with the toolkit.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import apt_repo  # noqa: E402
from sim_fixtures import _isolated_twin  # noqa: E402

from ct200twin.host import machines as simhost  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.fleet]   # an isolated twin of its own: make test's fleet processes
REPO = Path(__file__).resolve().parents[1]
FLEET = os.environ.get("DSV4_SIM_APT_FLEET", "apt")
ENV = {"DSV4_SIM_FLEET": FLEET, "DSV4_SIM_LAUNCH_CHECK": "twin", "DSV4_SIM_DRIVER": "apt"}
DRIVER_STATE = ["nvidia-open", "nvidia-driver", "nvidia-kernel-open-dkms", "libnvidia-ml1", "libcuda1",
                "nvidia-driver-pinning-580", "cuda-keyring", "cuda-toolkit-13-0"]
DPKG_LOG = "/var/log/dpkg.log"


@pytest.fixture(scope="module")
def apt_twin():
    yield from _isolated_twin(FLEET)


@pytest.fixture(scope="module")
def repo(apt_twin, tmp_path_factory):
    """The repository, served on this machine's end of the twin's veth (the twin's only neighbour;
    its apt reaches it directly, not through the twin's proxy, which refuses the fleet's addresses)."""
    address = apt_twin.net()["host_ip"]
    root = tmp_path_factory.mktemp("cuda-repo")
    httpd, port = apt_repo.serve(root, address)
    base = f"http://{address}:{port}/compute/cuda/repos"
    kernel = apt_twin.run("uname -r").stdout.strip()
    _, keyring_sha256 = apt_repo.build(root, base, kernel)
    apt_twin.write_file("/etc/apt/apt.conf.d/61dsv4deploy-test-repo", f'Acquire::http::Proxy::{address} "DIRECT";\n')
    _fresh(apt_twin)
    yield {"url": base, "sha256": keyring_sha256, "httpd": httpd}
    httpd.shutdown()
    _fresh(apt_twin)
    apt_twin.run("rm -f /etc/apt/apt.conf.d/61dsv4deploy-test-repo /etc/apt/sources.list.d/cuda-debian12-x86_64.list; "
                 "dsv4deploy-twin-driver install 580.95.05", check=False)


def _fresh(twin) -> None:
    """The twin as a host without NVIDIA's driver: nothing of the repository installed, no nvidia-smi."""
    twin.run(f"dpkg --purge {' '.join(DRIVER_STATE)} linux-headers-$(uname -r) >/dev/null 2>&1; "
             "rm -f /etc/apt/sources.list.d/cuda-debian12-x86_64.list /var/lib/dsv4deploy/reboot-required; "
             f": > {DPKG_LOG}; dsv4deploy-twin-driver remove", check=False)


def _deploy(repo, *data: str, timeout: int = 600) -> subprocess.CompletedProcess:
    args = ["--data", "profile=nvfp4-ctx8k", "--data", f"cuda_repo_url={repo['url']}",
            "--data", f"cuda_keyring_sha256={repo['sha256']}"]
    for d in data:
        args += ["--data", d]
    return subprocess.run([str(REPO / ".venv/bin/pyinfra"), "-y", "inventory/fleet-sim.py", "deploy/serve.py", *args],
                          cwd=REPO, env={**os.environ, **ENV}, capture_output=True, text=True, timeout=timeout)


def _installed(twin) -> dict[str, str]:
    out = twin.run("dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}\\n' 2>/dev/null", check=False).stdout
    return {p: v for p, v, s in (line.split(" ", 2) for line in out.splitlines() if line.count(" ") >= 2)
            if s.startswith("ii")}


def test_the_driver_step_holds_580_while_590_is_offered_headers_first(apt_twin, repo):
    first = _deploy(repo)
    out = first.stdout + first.stderr
    assert first.returncode != 0 and "the NVIDIA driver 580 was installed: reboot the host" in out, out[-3000:]
    have = _installed(apt_twin)
    assert have["nvidia-open"] == have["nvidia-driver"] == have["nvidia-kernel-open-dkms"] == "580.95.05-1"
    assert have["libnvidia-ml1"] == have["libcuda1"] == "580.95.05-1"
    assert "nvidia-driver-pinning-580" in have and "nvidia-driver-pinning-590" not in have
    policy = apt_twin.run("apt-cache policy nvidia-open").stdout
    assert "590.44.01-1" in policy, policy                 # offered, and not taken
    assert have["cuda-toolkit-13-0"] == "13.0.2-1" and "cuda-toolkit-13-1" not in have
    assert apt_twin.run("test -x /usr/local/cuda/bin/nvcc && test -e /usr/local/cuda/lib64/stubs/libcuda.so",
                        check=False).returncode == 0  # what the unit's PATH names
    # the headers were configured before the kernel module package was unpacked
    log = apt_twin.run(f"cat {DPKG_LOG}").stdout
    order = [m.group(1) for m in re.finditer(r" status installed (\S+?):", log)]
    assert order.index(f"linux-headers-{apt_twin.run('uname -r').stdout.strip()}") < \
        order.index("nvidia-kernel-open-dkms"), order
    # the keyring came from the repository and was checked by its sha256 (one fetch, on this machine)
    assert any(p.endswith("/cuda-keyring_1.1-1_all.deb") for p in repo["httpd"].requests)
    flag = json.loads(apt_twin.run("cat /var/lib/dsv4deploy/reboot-required").stdout)
    assert flag["driver"] == 580 and flag["boot_id"] == apt_twin.run("cat /proc/sys/kernel/random/boot_id").stdout.strip()

    again = _deploy(repo)
    out = again.stdout + again.stderr
    assert again.returncode != 0 and "a reboot is pending: the NVIDIA driver 580 was installed" in out, out[-3000:]
    assert "Nothing was changed on the host" in out


def test_a_keyring_of_another_sha256_is_refused_before_it_reaches_the_host(apt_twin, repo):
    _fresh(apt_twin)
    bad = {**repo, "sha256": "f" * 64}
    run = _deploy(bad)
    out = run.stdout + run.stderr
    assert run.returncode != 0 and f"not the pinned {'f' * 64}: not installed" in out, out[-3000:]
    assert "cuda-keyring" not in _installed(apt_twin)
    assert apt_twin.run("ls /var/lib/dsv4deploy/cuda-keyring.deb", check=False).returncode != 0


def test_allow_reboot_reboots_waits_for_the_new_boot_and_the_deploy_goes_on(apt_twin, repo):
    """A pending driver install with allow_reboot=true: the host reboots (the twin's container halts;
    a thread here boots it again, as the firmware would), the wait ends on the new boot id, the flag
    is gone and the same run deploys to the end (a whole deploy with its gate: 28 s on a twin that
    holds the venv, about 100 s on a fresh one)."""
    _fresh(apt_twin)
    assert _deploy(repo).returncode != 0                    # installed, the reboot pending
    boot = apt_twin.run("cat /proc/sys/kernel/random/boot_id").stdout.strip()
    downs: list[float] = []

    def firmware():
        deadline = time.monotonic() + 300
        while apt_twin.running() and time.monotonic() < deadline:
            time.sleep(0.5)
        downs.append(time.monotonic())
        simhost.up(1, fleet=FLEET)

    threading.Thread(target=firmware, daemon=True).start()
    run = _deploy(repo, "allow_reboot=true")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert "reboot to load the new driver (allow_reboot=true; waits up to 900 s)" in out
    assert downs and apt_twin.run("cat /proc/sys/kernel/random/boot_id").stdout.strip() != boot
    assert apt_twin.run("test -e /var/lib/dsv4deploy/reboot-required", check=False).returncode != 0
    assert _installed(apt_twin)["nvidia-open"] == "580.95.05-1"
