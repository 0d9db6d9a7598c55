"""The SGLang venv: a path that names version and patch set, the pinned package, the
sha256-pinned patches, and a launch check (the host's own SGLang parses the rendered argv).
"""

from __future__ import annotations

import hashlib
import shlex
from importlib.resources import files as package_files
from io import StringIO
from pathlib import Path

from pyinfra import host
from pyinfra.api import DeployError, FactBase, StringCommand, deploy, operation
from pyinfra.api.operation import OperationMeta
from pyinfra.facts.files import Directory
from pyinfra.operations import files, pip, server

from .. import patching
from ..facts import HostBasics
from ..profiles import REPO_ROOT
from ..render import SGLANG_CONFIG_CREDENTIAL
from ..sglang_versions import lock_file
from ..rollout import Rollout

SGLANG_PARSE = ("import argparse, sys; from sglang.srt.server_args import ServerArgs; "
                "p = argparse.ArgumentParser(prog='sglang serve'); ServerArgs.add_cli_args(p); "
                "p.parse_args(sys.argv[1:])")


class PatchApplied(FactBase):
    """True when the patch file is on the host and its reverse dry-run succeeds in `directory`
    (dsv4deploy.patching.state_command)."""

    def command(self, directory: str, patch_file: str, strip: int):
        return patching.state_command(directory, patch_file, strip)

    def process(self, output):
        return patching.parse_state(output)


@operation()
def patch_applied(directory: str, patch_file: str, strip: int = 1, sha256: str | None = None):
    """Apply a patch once, all or nothing (dsv4deploy.patching.apply_command): sha256 check,
    forward dry-run, apply, reverse dry-run. Already in (reverse dry-run succeeds): no change.
    A patch that does not apply fails the operation before any file is written."""
    if host.get_fact(PatchApplied, directory=directory, patch_file=patch_file, strip=strip):
        host.noop(f"{patch_file} already applied")
        return
    yield StringCommand(patching.apply_command(directory, patch_file, strip, sha256=sha256))


def _site_packages(r: Rollout) -> str:
    py = host.get_fact(HostBasics).get("python", "3")
    return f"{r.layout.venv}/lib/python{py}/site-packages"


@deploy("SGLang venv")
def sglang_venv(r: Rollout) -> list[OperationMeta]:
    """Returns the operations whose change means the server must restart."""
    data, venv = r.data, r.layout.venv
    changed: list[OperationMeta] = [pip.venv(name=f"venv {venv}", path=venv, python="python3")]
    site = _site_packages(r)
    stand_in = r.stand_ins.get("sglang")
    if stand_in:
        # The twin cannot hold SGLang with CUDA torch: its stand-in is this project's twin server
        # (dsv4deploy.twin.server, same argv and HTTP API), put on the venv's path.
        # Only what the twin server needs (its module and the flag data), so an unrelated change
        # in the project does not restart the twin.
        pkg = Path(package_files("dsv4deploy"))
        dest = f"{venv}/stand-in/dsv4deploy"
        files.directory(name="stand-in: package dir", path=dest)
        for module in ("__init__.py", "patches.py"):
            changed.append(files.put(name=f"stand-in: dsv4deploy/{module}", src=str(pkg / module),
                                     dest=f"{dest}/{module}", mode="644"))
        for part in ("twin", "data"):
            changed.append(files.sync(name=f"stand-in: dsv4deploy/{part} (the twin server)", src=str(pkg / part),
                                      dest=f"{dest}/{part}", delete=True, exclude=["*.pyc"],
                                      exclude_dir=["__pycache__", "*/__pycache__"]))
        changed.append(files.put(name="stand-in: put it on the venv's path", src=StringIO(f"{venv}/stand-in\n"),
                                 dest=f"{site}/dsv4deploy-stand-in.pth", mode="644"))
        changed.append(pip.packages(name="stand-in: its requirements", packages=list(stand_in["requirements"]),
                                    pip=f"{venv}/bin/pip"))
        # The real SGLang wheel without its dependencies: its files are what the profile's patches
        # apply to (the twin server shows secrets masked only when the mask patch is really in).
        changed.append(pip.packages(name=f"sglang=={data['sglang']['version']} (files only, --no-deps)",
                                    packages=[f"sglang=={data['sglang']['version']}"], pip=f"{venv}/bin/pip",
                                    extra_install_args="--no-deps"))
    else:
        extras = data["sglang"].get("extras") or []
        spec = f"sglang[{','.join(extras)}]=={data['sglang']['version']}" if extras else \
            f"sglang=={data['sglang']['version']}"
        args = []
        lock = lock_file(data["sglang"]["version"])
        if lock:
            # every package the venv holds, pinned for this release (torch for CUDA 13, sgl-kernel,
            # flashinfer, ...): the venv's name hashes it, so a new lock is a new venv
            files.put(name=f"lock file {lock.name}", src=str(lock), dest=f"{venv}/dsv4deploy.lock", mode="644")
            args += ["-c", f"{venv}/dsv4deploy.lock"]
        if data["sglang"].get("index_url"):
            args += ["--index-url", data["sglang"]["index_url"]]
        for url in data["sglang"].get("extra_index_urls") or []:
            args += ["--extra-index-url", url]
        changed.append(pip.packages(name=f"{spec}", packages=[spec], pip=f"{venv}/bin/pip",
                                    extra_install_args=" ".join(shlex.quote(a) for a in args) or None))

    patches = data["sglang"].get("patches") or []
    if patches:
        pdir = f"{venv}/patches"
        files.directory(name="patch dir", path=pdir)
        for patch in patches:
            dest = f"{pdir}/{patch['name']}.patch"
            if patch.get("url"):
                files.download(name=f"patch {patch['name']} (sha256-pinned)", src=patch["url"], dest=dest,
                               sha256sum=patch["sha256"])
            else:
                local = REPO_ROOT / patch["file"]
                digest = hashlib.sha256(local.read_bytes()).hexdigest() if local.is_file() else None
                if digest != patch["sha256"]:
                    raise DeployError(f"patch {patch['name']}: {local} has sha256 {digest}, the profile pins "
                                      f"{patch['sha256']}")
                files.put(name=f"patch {patch['name']} (sha256 verified)", src=str(local), dest=dest, mode="644")
            changed.append(patch_applied(name=f"apply {patch['name']}", directory=site, patch_file=dest,
                                         strip=int(patch.get("strip", 1)), sha256=patch["sha256"]))
    return changed


@deploy("Launch check")
def launch_check(r: Rollout, when) -> None:
    """The host's own server module parses the rendered argv before anything restarts. The API
    key's credential exists only while the unit runs: the check reads its source file (as root)."""
    credential = r.layout.credential_path(SGLANG_CONFIG_CREDENTIAL)
    argv = [r.layout.sglang_config_secret if a == credential else a for a in r.rendered.argv[3:]]
    args = " ".join(shlex.quote(a) for a in argv)
    check = r.stand_ins.get("launch_check_module")
    cmd = (f"{r.layout.python} -m {check} {args}" if check
           else f"{r.layout.python} -c {shlex.quote(SGLANG_PARSE)} {args}")
    server.shell(name=f"{r.module} parses the rendered argv", commands=[cmd], _if=when)
