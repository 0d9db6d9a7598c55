"""The real host's locks (data/sglang/<version>.lock, data/smg/<version>.lock): what the host's uv
installs whole with --require-hashes. A lock without a hash for a package, or one that misses a
Python the hosts run (3.11 on Debian 12, 3.12 on Ubuntu 24.04), fails the first install there."""

from __future__ import annotations

import re

import pytest

from checkout import list_profiles, load_profile
from dsv4deploy.gateway import model as gateway
from dsv4deploy.sglang.versions import lock_file

PIN = re.compile(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)(?: ; (.*?))? \\$")


def requirements(text: str) -> list[tuple[str, str, str, list[str]]]:
    """(name, version, marker, hashes) of each requirement of a `uv export --hashes` file."""
    out = []
    for block in re.split(r"\n(?=\S)", "\n".join(ln for ln in text.splitlines() if not ln.startswith("#"))):
        first, *rest = block.strip().splitlines()
        m = PIN.match(first)
        assert m, f"not a hashed pin: {first!r}"
        out.append((m[1].lower(), m[2], m[3] or "", [h.strip(" \\") for h in rest]))
    return out


def profile_versions() -> set[str]:
    return {load_profile(name).data["sglang"]["version"] for name in list_profiles()}


@pytest.mark.parametrize("path", [lock_file(v) for v in sorted(profile_versions())] + [gateway.lock_file("1.13.0")],
                         ids=lambda p: p.name if p else "missing")
def test_every_shipped_lock_pins_every_package_with_its_hashes_for_both_pythons(path):
    assert path is not None, "a profile's SGLang release has no lock (tests/tools/sglang_lock.py VERSION)"
    reqs = requirements(path.read_text())
    package = path.parent.name                          # sglang or smg: the package itself is locked too
    assert any(name == package for name, *_ in reqs)
    for name, version, marker, hashes in reqs:
        assert hashes and all(re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", h) for h in hashes), name
        assert "sys_platform == 'linux'" in marker and "platform_machine == 'x86_64'" in marker, (name, marker)
    # one pin per package and Python: a package split by Python version names both sides
    split = {name for name, _, marker, _ in reqs if "python_full_version" in marker}
    for name in split:
        sides = [m for n, _, m, _ in reqs if n == name]
        assert any("< '3.12'" in m for m in sides) and any(">= '3.12'" in m for m in sides), (name, sides)


def test_the_023_lock_holds_the_cuda_torch_a_real_host_runs():
    pins = {name: version for name, version, *_ in requirements(lock_file("0.5.23").read_text())}
    assert pins["sglang"] == "0.5.23" and pins["torch"] == "2.14.1" and "+cpu" not in pins["torch"]
    assert pins["sglang-kernel"] == "0.4.10" and pins["flashinfer-python"] == "0.7.2"
    assert any(name.startswith("nvidia-") and name.endswith("cu13") for name in pins)
