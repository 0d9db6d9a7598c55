"""NVIDIA's CUDA repository as the driver step uses it (tasks/driver.py says why each step): the
keyring's pinned sha256 and where to fetch it, the names of the packages the step installs and
reads, and the reboot flag's path. Pure but for fetch_checked (this machine's network).
"""

from __future__ import annotations

import hashlib
import re
import urllib.request

from pyinfra.api import DeployError

from dsv4deploy.profile.boundary import URL
from dsv4deploy.render.layout import STATE

REBOOT_FLAG = f"{STATE}/reboot-required"
KEYRING_PACKAGE = "cuda-keyring"
KEYRING_DEB = f"{STATE}/cuda-keyring.deb"           # root's, 0600: uploaded through the private staging path
CUDA_REPOS = "https://developer.download.nvidia.com/compute/cuda/repos"
KEYRING_FILE = "cuda-keyring_1.1-1_all.deb"
# sha256 of cuda-keyring_1.1-1_all.deb per repository (the same digests are pinned by several public
# projects; a new keyring release changes them: check with `curl -fsSL URL | sha256sum`)
KEYRING_SHA256 = {
    "ubuntu2204": "d93190d50b98ad4699ff40f4f7af50f16a76dac3bb8da1eaaf366d47898ff8df",
    "ubuntu2404": "d2a6b11c096396d868758b86dab1823b25e14d70333f1dfa74da5ddaf6a06dba",
    "debian12": "e7f219eab6fe4819cdb5c15b98233dc3420302d9c00883219cd3d896857cf48d",
    "debian13": "dd28f1f6ba0038180d6b23f846cefca1e3de4c9327751665241370bacea452a1",
}
_SHA256 = re.compile(r"[0-9a-f]{64}")
_KERNEL_RELEASE = re.compile(r"[0-9][A-Za-z0-9.+_~-]{0,100}")
_DEBIAN_FLAVOUR = re.compile(r"[0-9]+\.[0-9]+(\.[0-9]+)?-[0-9]+-([a-z0-9-]+)")   # 6.1.0-18-amd64 -> amd64


def packages_read(data: dict) -> list[str]:
    """The Debian packages whose state the driver step decides from (host/state.py reads them)."""
    names = [KEYRING_PACKAGE, pinning_package(data["driver"]["branch"])]
    return names + ([data["driver"]["cuda_toolkit"]] if data["driver"].get("cuda_toolkit") else [])


def pinning_package(branch: int) -> str:
    return f"nvidia-driver-pinning-{branch}"


def repo_distro(dist: dict) -> str:
    """NVIDIA's repository name for a LinuxDistribution fact: ubuntu2404, debian12."""
    name = (dist.get("name") or "").lower()
    major, minor = dist.get("major"), dist.get("minor")
    if name == "ubuntu":
        return f"ubuntu{major}{int(minor or 0):02d}"
    return f"debian{major}"


def header_packages(dist: dict, kernel_release: str) -> list[str]:
    """The running kernel's headers (same name on Ubuntu and Debian), and on Debian the flavour's
    metapackage (linux-headers-amd64) so DKMS also builds for the next kernel; Ubuntu's server
    kernel metapackage (linux-generic) already brings linux-headers-generic."""
    if not _KERNEL_RELEASE.fullmatch(kernel_release):
        raise DeployError(f"the host's kernel release {kernel_release!r} (uname -r) is not a kernel version")
    names = [f"linux-headers-{kernel_release}"]
    flavour = _DEBIAN_FLAVOUR.fullmatch(kernel_release)
    if (dist.get("name") or "").lower() == "debian" and flavour:
        names.append(f"linux-headers-{flavour.group(2)}")
    return names


def repository(host_data, distro: str) -> tuple[str, str]:
    """(URL of the keyring .deb, its sha256): NVIDIA's, or host data `cuda_repo_url` (a mirror of
    the same layout: URL/<distro>/x86_64/) with `cuda_keyring_sha256`, checked here."""
    base = host_data.get("cuda_repo_url") or CUDA_REPOS
    digest = host_data.get("cuda_keyring_sha256") or KEYRING_SHA256.get(distro)
    if problem := URL.check(str(base)):
        raise DeployError(f"host data cuda_repo_url: {problem}")
    if host_data.get("cuda_repo_url") and host_data.get("cuda_keyring_sha256") is None:
        raise DeployError("host data cuda_repo_url needs cuda_keyring_sha256 (the sha256 of its keyring .deb)")
    if digest is None:
        raise DeployError(f"no pinned sha256 for NVIDIA's {distro} keyring (known: {', '.join(KEYRING_SHA256)}): "
                          "set host data cuda_keyring_sha256")
    if not _SHA256.fullmatch(str(digest)):
        raise DeployError("host data cuda_keyring_sha256: 64 lower-case hex digits expected")
    return f"{str(base).rstrip('/')}/{distro}/x86_64/{KEYRING_FILE}", str(digest)


def fetch_checked(url: str, sha256: str, timeout: float = 60) -> bytes:
    """URL's bytes, fetched on this machine, refused unless their sha256 is SHA256."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:   # noqa: S310 (URL: boundary-checked)
            body = answer.read(4 << 20)
    except OSError as exc:
        raise DeployError(f"cannot fetch the CUDA keyring {url}: {exc}") from None
    got = hashlib.sha256(body).hexdigest()
    if got != sha256:
        raise DeployError(f"the CUDA keyring {url} has sha256 {got}, not the pinned {sha256}: not installed")
    return body
