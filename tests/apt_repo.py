"""A stand-in of NVIDIA's CUDA apt repository, built in the tests (no network) and served over HTTP
to an isolated twin: dummy packages with NVIDIA's names at branches 580 and 590, a dummy
`nvidia-driver-pinning-<branch>` (a stand-in of NVIDIA's: it ships an apt preferences file that
holds the driver packages at its branch), a `cuda-keyring` that installs this repository's test key
and source list, a CUDA toolkit, and the headers of the twin's running kernel. The flat layout of
NVIDIA's (`<url>/<distro>/x86_64/`, `deb [signed-by=...] <that> /`), signed InRelease (gpg).

The kernel module package refuses to configure without the running kernel's headers, as DKMS
would; the driver's configure makes the twin's nvidia-smi report its version (the stand-in of
loading the module at the next boot).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import os
import subprocess
import threading
from pathlib import Path

BRANCHES = {580: "580.95.05", 590: "590.44.01"}
TOOLKITS = {"cuda-toolkit-13-0": ("13.0.2-1", "13.0"), "cuda-toolkit-13-1": ("13.1.0-1", "13.1")}
DRIVER_PACKAGES = ["nvidia-open", "nvidia-driver", "nvidia-kernel-open-dkms", "libnvidia-ml1", "libcuda1",
                   "cuda-drivers"]
KEYRING = "/usr/share/keyrings/cuda-archive-keyring.gpg"


def _deb(out: Path, name: str, version: str, *, depends: str = "", files: dict[str, str | bytes] | None = None,
         postinst: str = "", arch: str = "amd64") -> Path:
    root = out / f"build-{name}-{version}"
    (root / "DEBIAN").mkdir(parents=True)
    control = [f"Package: {name}", f"Version: {version}", f"Architecture: {arch}",
               "Maintainer: dsv4deploy tests <tests@invalid>", f"Description: stand-in of {name} (tests/apt_repo.py)"]
    if depends:
        control.append(f"Depends: {depends}")
    (root / "DEBIAN/control").write_text("\n".join(control) + "\n")
    if postinst:
        p = root / "DEBIAN/postinst"
        p.write_text("#!/bin/sh\nset -e\n" + postinst + "\n")
        p.chmod(0o755)
    for path, text in (files or {}).items():
        f = root / path.lstrip("/")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(text if isinstance(text, bytes) else text.encode())
        if "/bin/" in path:
            f.chmod(0o755)
    deb = out / f"{name}_{version}_{arch}.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(root), str(deb)],
                   check=True, capture_output=True)
    return deb


def _packages(repo: Path, kernel_release: str, base_url: str, key: bytes, distro: str) -> None:
    for branch, upstream in BRANCHES.items():
        v = f"{upstream}-1"
        _deb(repo, "nvidia-open", v, depends=f"nvidia-driver (= {v}), nvidia-kernel-open-dkms (= {v})")
        _deb(repo, "nvidia-driver", v, depends=f"libnvidia-ml1 (= {v}), libcuda1 (= {v})",
             postinst=f"tool=/usr/local/sbin/dsv4deploy-twin-driver; if [ -x $tool ]; then $tool install {upstream}; fi")
        _deb(repo, "nvidia-kernel-open-dkms", v, files={f"/usr/src/nvidia-{upstream}/dkms.conf": "stand-in\n"},
             postinst='[ -e "/usr/src/linux-headers-$(uname -r)/Makefile" ] || { echo "DKMS: no headers for '
                      'kernel $(uname -r)" >&2; exit 1; }')
        _deb(repo, "libnvidia-ml1", v)
        _deb(repo, "libcuda1", v)
        _deb(repo, "cuda-drivers", v, depends="nvidia-driver (>= 580.65.06)")   # loose, as NVIDIA's is
        names = " ".join(DRIVER_PACKAGES)
        _deb(repo, f"nvidia-driver-pinning-{branch}", f"{branch}-1", arch="all",
             files={f"/etc/apt/preferences.d/nvidia-driver-pinning-{branch}":
                    f"Package: {names}\nPin: version {branch}.*\nPin-Priority: 1000\n"})
    for name, (version, short) in TOOLKITS.items():
        _deb(repo, name, version,
             files={f"/usr/local/cuda-{short}/bin/nvcc": f"#!/bin/sh\necho 'stand-in nvcc {short}'\n",
                    f"/usr/local/cuda-{short}/lib64/stubs/libcuda.so": ""},
             postinst=f"update-alternatives --install /usr/local/cuda cuda /usr/local/cuda-{short} "
                      f"{short.replace('.', '')}")
    _deb(repo, f"linux-headers-{kernel_release}", "1", files={f"/usr/src/linux-headers-{kernel_release}/Makefile": ""})
    _deb(repo, "cuda-keyring", "1.1-1", arch="all",
         files={f"/etc/apt/sources.list.d/cuda-{distro}-x86_64.list":
                f"deb [signed-by={KEYRING}] {base_url}/{distro}/x86_64/ /\n", KEYRING: key})


def _index(repo: Path, gpg_env: dict) -> None:
    entries = []
    for deb in sorted(repo.glob("*.deb")):
        control = subprocess.run(["dpkg-deb", "-f", str(deb)], check=True, capture_output=True, text=True).stdout
        data = deb.read_bytes()
        entries.append(control.rstrip("\n") + f"\nFilename: ./{deb.name}\nSize: {len(data)}\n"
                       f"SHA256: {hashlib.sha256(data).hexdigest()}\n")
    packages = "\n".join(entries).encode()
    (repo / "Packages").write_bytes(packages)
    (repo / "Packages.gz").write_bytes(gzip.compress(packages, mtime=0))
    sums = "".join(f" {hashlib.sha256((repo / n).read_bytes()).hexdigest()} {(repo / n).stat().st_size} {n}\n"
                   for n in ("Packages", "Packages.gz"))
    (repo / "Release").write_text("Origin: dsv4deploy tests\nLabel: stand-in of NVIDIA CUDA\nArchitectures: amd64 all\n"
                                  "Date: Sat, 05 Dec 2026 00:00:00 UTC\nSHA256:\n" + sums)
    subprocess.run(["gpg", "--batch", "--yes", "--clearsign", "-o", str(repo / "InRelease"), str(repo / "Release")],
                   check=True, capture_output=True, env=gpg_env)


def build(root: Path, base_url: str, kernel_release: str, distro: str = "debian12") -> tuple[Path, str]:
    """The repository under ROOT (served as BASE_URL = http://.../compute/cuda/repos); returns
    (its folder, the sha256 of its cuda-keyring .deb)."""
    gnupg = root / "gnupg"
    gnupg.mkdir(mode=0o700, parents=True)
    env = {**os.environ, "GNUPGHOME": str(gnupg)}
    subprocess.run(["gpg", "--batch", "--passphrase", "", "--quick-gen-key", "dsv4deploy test repository",
                    "ed25519", "sign", "never"], check=True, capture_output=True, env=env)
    key = subprocess.run(["gpg", "--batch", "--export"], check=True, capture_output=True, env=env).stdout
    repo = root / "compute/cuda/repos" / distro / "x86_64"
    repo.mkdir(parents=True)
    _packages(repo, kernel_release, base_url, key, distro)
    for build_dir in repo.glob("build-*"):
        subprocess.run(["rm", "-rf", str(build_dir)], check=True)
    _index(repo, env)
    return repo, hashlib.sha256((repo / "cuda-keyring_1.1-1_all.deb").read_bytes()).hexdigest()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):       # one line per request on stderr would drown pytest's output
        self.server.requests.append(self.path)


def serve(root: Path, address: str) -> tuple[http.server.ThreadingHTTPServer, int]:
    """Serve ROOT over HTTP on ADDRESS (an ephemeral port), in a daemon thread; (server, port)."""
    httpd = http.server.ThreadingHTTPServer((address, 0), functools.partial(_Quiet, directory=str(root)))
    httpd.requests = []
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, httpd.server_address[1]
