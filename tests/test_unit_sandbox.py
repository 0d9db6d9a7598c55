"""The rendered unit is a sandbox an operator would let run model code: systemd's own
`systemd-analyze security` rates every shipped profile's unit at 2.0 or less, and
`systemd-analyze verify` accepts it without a warning."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from checkout import list_profiles, load_profile
from dsv4deploy.render.unit import render
from dsv4deploy.profile.validate import validate

ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed (make bootstrap installs systemd)")
EXPOSURE_MAX = 2.0


def _unit(tmp_path: Path, name: str, **service) -> tuple[Path, str]:
    profile = load_profile(name)
    if service:
        data = {**profile.data, "service": {**profile.data["service"], **service}}
        profile = type(profile)(name=profile.name, data=data, origins=profile.origins, files=profile.files)
    rendered = render(profile)
    path = tmp_path / f"{profile.data['service']['name']}.service"
    path.write_text(rendered.unit)
    return path, rendered.unit


def exposure(unit: Path) -> float:
    out = subprocess.run([ANALYZE, "security", "--offline=true", str(unit)], capture_output=True, text=True,
                         check=True).stdout
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", out)
    assert match, out[-500:]
    return float(match.group(1))


@needs_analyze
@pytest.mark.parametrize("name", list_profiles())
def test_shipped_units_are_sandboxed(tmp_path, name):
    unit, _ = _unit(tmp_path, name)
    assert exposure(unit) <= EXPOSURE_MAX


@needs_analyze
def test_the_gateway_unit_is_sandboxed_tighter_than_the_servers(tmp_path):
    """The gateway needs no GPU and owns no file: it rates below the server's unit."""
    rendered = render(load_profile("nvfp4-ctx8k-dp2"))
    gateway = tmp_path / f"{rendered.gateway.service}.service"
    gateway.write_text(rendered.gateway.unit)
    server, _ = _unit(tmp_path, "nvfp4-ctx8k-dp2")
    assert exposure(gateway) < exposure(server) <= EXPOSURE_MAX


@needs_analyze
def test_turning_the_sandbox_off_shows_in_the_rating(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    strict, _ = _unit(tmp_path / "a", "nvfp4-ctx8k")
    off, text = _unit(tmp_path / "b", "nvfp4-ctx8k", hardening="off")
    assert "NoNewPrivileges" not in text
    assert exposure(off) > 9.0 > EXPOSURE_MAX >= exposure(strict)


@needs_analyze
@pytest.mark.parametrize("name", list_profiles())
def test_systemd_verify_accepts_the_unit(tmp_path, name):
    """verify needs the unit's ExecStart to exist and the system's targets: a scratch root holds both."""
    root = tmp_path / "root"
    shutil.copytree("/usr/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    profile = load_profile(name)
    rendered = render(profile)
    for path, text in rendered.files.items():
        dest = root / path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)
    for argv in [rendered.argv] + ([rendered.gateway.argv] if rendered.gateway else []):
        python = root / argv[0].lstrip("/")
        python.parent.mkdir(parents=True, exist_ok=True)
        python.write_text("#!/bin/sh\n")
        python.chmod(0o755)
    units = ([f"{r.instance}.service" for r in rendered.replicas] + [f"{rendered.gateway.service}.service"]
             if rendered.replicas else [f"{profile.data['service']['name']}.service"])
    for unit in units:
        proc = subprocess.run([ANALYZE, "verify", f"--root={root}", unit], capture_output=True, text=True)
        assert proc.returncode == 0 and not (proc.stdout + proc.stderr).strip(), (unit, proc.stdout + proc.stderr)


def test_strict_is_the_default_and_keeps_what_cuda_needs():
    unit = render(load_profile("nvfp4-ctx8k")).unit
    lines = set(unit.splitlines())
    for directive in ("NoNewPrivileges=yes", "CapabilityBoundingSet=", "ProtectSystem=strict", "PrivateTmp=yes",
                      "DevicePolicy=closed", "DeviceAllow=char-nvidia rw", "DeviceAllow=char-nvidia-uvm rw",
                      "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK", "UMask=0027",
                      "SystemCallArchitectures=native"):
        assert directive in lines, directive
    for breaks_cuda in ("PrivateDevices=", "MemoryDenyWriteExecute=", "ProcSubset=", "PrivateNetwork="):
        assert not any(line.startswith(breaks_cuda) for line in lines), breaks_cuda


def test_hardening_off_without_a_reason_is_refused(profile_dir):
    profile_dir.write("open", """
        extends: nvfp4-ctx8k
        service: {hardening: "off"}
    """)
    report = validate(load_profile("open"))
    assert [(p.path, p.line) for p in report.errors] == [("service.hardening", 2)]
    assert "service.hardening_off_reason" in report.errors[0].message


def test_hardening_off_with_a_reason_is_a_warning_naming_it(profile_dir):
    profile_dir.write("open", """
        extends: nvfp4-ctx8k
        service: {hardening: "off", hardening_off_reason: "kernel 5.4 on the lab box kills the seccomp filter"}
    """)
    report = validate(load_profile("open"))
    assert report.ok
    assert any(p.path == "service.hardening" and "sandbox" in p.message and "kernel 5.4" in p.message
               for p in report.warnings)


def test_a_blank_reason_is_no_reason(profile_dir):
    profile_dir.write("open", """
        extends: nvfp4-ctx8k
        service: {hardening: "off", hardening_off_reason: "   "}
    """)
    assert [p.path for p in validate(load_profile("open")).errors] == ["service.hardening"]


def test_a_reason_without_hardening_off_is_a_warning(profile_dir):
    profile_dir.write("open", """
        extends: nvfp4-ctx8k
        service: {hardening_off_reason: "left over"}
    """)
    report = validate(load_profile("open"))
    assert report.ok and [p.path for p in report.warnings if "reason" in p.message] == ["service.hardening_off_reason"]
