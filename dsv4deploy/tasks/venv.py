"""The SGLang venv: a path that names version and patch set, the pinned package, the
sha256-pinned patches, and a launch check (the host's own SGLang parses the rendered argv).
Everything is compared with the host's state (host/state.py): a venv whose marker says it holds
exactly these installs is left alone, so a re-deploy runs no pip at all.

On the CT200 twin the venv is the real host's, from the same lock by the same command (CUDA
torch installs and imports without a GPU), so the launch check is SGLang's own there too; only
the engine that serves is the twin server, put on the venv's path beside it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import urllib.request
from importlib.resources import files as package_files
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import DeployError, deploy
from pyinfra.api.operation import OperationMeta
from pyinfra.operations import server

from dsv4deploy.host import ISOLATED, installer, ops, sandbox, uvpip
from dsv4deploy.release import records as releases
from dsv4deploy.host.state import PIP_FREEZE, STAND_IN_PTH, VENV_MARKER, HostState
from dsv4deploy.render.unit import SGLANG_CONFIG_CREDENTIAL
from dsv4deploy.sglang.versions import facts, lock_file, lock_sha256
from dsv4deploy.release.rollout import Rollout

# SGLang's own parser, as `sglang serve` builds it, run by launch_parser.py (a host program): from
# the table it captured in this venv when it has one (no SGLang import: 0.1 s instead of 3-5 s),
# else imported, which captures the table; on a refusal only argparse's message (its usage lists
# every flag: 500 lines above the one that matters).
LAUNCH_PARSER = (Path(package_files("dsv4deploy")) / "sglang" / "launch_parser.py").read_text()
# The table's folder in the venv: the service account's, since the check that captures it runs as
# that account in the server's sandbox (the venv root's and read-only). Only the launch check's
# unit may write it (ReadWritePaths=; the server's own unit sees it read-only) and only the launch
# check reads it; root makes the folder and never opens what is in it.
PARSER_DIR = "dsv4deploy-parser"
PARSER_TABLE = f"{PARSER_DIR}/table.json"
LOCK = "dsv4deploy.lock"                     # the release's lock (data/sglang/<version>.lock), in the venv


def stand_in_archive(r: Rollout) -> bytes:
    """The stand-in server's archive, as the inventory made it (host data stand_ins.sglang.bundle:
    a file on this machine, checked by rollout_for). Its hash decides whether it is uploaded."""
    path = r.stand_ins["sglang"]["bundle"]
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise DeployError(f"host data stand_ins.sglang.bundle: {path}: {exc.strerror or exc}") from None


def _lock_pins(path: Path) -> set[str]:
    """`name==version` of every package a lock pins, names normalized (PEP 503)."""
    return {f"{re.sub(r'[-_.]+', '-', m[1]).lower()}=={m[2]}"
            for m in re.finditer(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)", path.read_text(), re.M)}


def _normal(requirement: str) -> str:
    name, _, version = requirement.partition("==")
    return f"{re.sub(r'[-_.]+', '-', name).lower()}=={version}"


def twin_keeps_own_parser(r: Rollout) -> bool:
    """A twin whose stand-in says own_parser: false (DSV4_SIM_LAUNCH_CHECK=twin): its venv holds
    the server's packages and the SGLang wheel alone, and the twin's parser checks the argv."""
    stand_in = r.stand_ins.get("sglang")
    return bool(stand_in) and not stand_in.get("own_parser")


def installs(r: Rollout) -> list[str]:
    """The installs that fill the venv, in order, as commands of the host's uv (host/installer.py;
    they are also the venv marker's content)."""
    data, venv = r.data, r.layout.venv
    version = data["sglang"]["version"]
    stand_in = r.stand_ins.get("sglang")
    pinned = ["-c", f"{venv}/{LOCK}"] if lock_file(version) else []
    if twin_keeps_own_parser(r):
        # A twin that tests the rollout's order, not SGLang: the stand-in server's packages
        # (byte-compiled: it runs as the service user, who cannot write __pycache__) and the real
        # SGLang wheel without its dependencies (the files the profile's patches apply to), both
        # under the lock's pins; no torch.
        return [installer.install_command(venv, ["--compile-bytecode", *pinned, *stand_in["requirements"]]),
                installer.install_command(venv, ["--no-deps", *pinned, f"sglang=={version}"])]
    host = [real_host_install(r)]
    if stand_in:
        # The twin: exactly the real host's install, then whatever the stand-in server needs that
        # the lock does not hold (none while its requirements are the lock's own pins)
        lock = lock_file(version)
        extra = [q for q in stand_in["requirements"] if not lock or _normal(q) not in _lock_pins(lock)]
        if extra:
            host.append(installer.install_command(venv, ["--compile-bytecode", *pinned, *extra]))
    return host


def real_host_install(r: Rollout) -> str:
    """The real host's one install: the release's lock, whole and hash-checked, when one is shipped."""
    data, venv = r.data, r.layout.venv
    version = data["sglang"]["version"]
    extras = data["sglang"].get("extras") or []
    spec = f"sglang[{','.join(extras)}]=={version}" if extras else f"sglang=={version}"
    args = ["--compile-bytecode"]         # the service user cannot write __pycache__: compiled at install
    if lock_file(version) and not extras:
        # every package the venv holds, SGLang included, pinned for this release with the sha256 of
        # each file (torch for CUDA 13, sglang-kernel, flashinfer, ...), installed whole with hash
        # checking: the venv's name hashes the lock, so a new lock is a new venv
        spec_args = ["--require-hashes", "-r", f"{venv}/{LOCK}"]
    elif lock_file(version):
        # extras the lock was not resolved with: its pins hold (-c), the extras' own packages are
        # resolved on the day (tests/tools/sglang_lock.py --extra makes a lock that holds them)
        spec_args = ["-c", f"{venv}/{LOCK}", spec]
    else:
        spec_args = [spec]
    if data["sglang"].get("index_url"):
        args += ["--index-url", data["sglang"]["index_url"]]
    for index in data["sglang"].get("indexes") or []:
        # its packages from it only, and no other package (uvpip.py): never best match across indexes
        args += [uvpip.PINNED_INDEX, f"{index['name']}:{','.join(index['packages'])}={index['url']}"]
    return installer.install_command(venv, [*args, *spec_args])


def venv_marker(r: Rollout) -> dict:
    """What the venv holds, as its marker file says it (ops.venv refills it when the host's differs):
    the installs (the host's uv) and the content of the lock file they install from."""
    return {"installs": installs(r), "lock_sha256": lock_sha256(r.data["sglang"]["version"])}


@deploy("SGLang venv")
def sglang_venv(r: Rollout, state: HostState) -> list[OperationMeta]:
    """Returns the operations whose change means the server must restart."""
    venv = r.layout.venv
    lock = lock_file(r.data["sglang"]["version"])
    changed: list[OperationMeta] = []
    if lock:
        changed.append(ops.file(name=f"lock file {lock.name}", dest=f"{venv}/{LOCK}",
                                content=lock.read_bytes(), state=state.file(f"{venv}/{LOCK}")))
    marker = venv_marker(r)
    holds = [lock.name if c.endswith(f"/{LOCK}") and lock else shlex.split(c)[-1] for c in marker["installs"]]
    changed.append(ops.venv(name=f"venv {venv}: {', '.join(holds)}",
                            path=venv, marker=marker, marker_file=f"{venv}/{VENV_MARKER}",
                            marker_state=state["venv"], exists=bool(state.file(f"{venv}/bin/python")),
                            freeze_file=f"{venv}/{PIP_FREEZE}"))
    if not twin_keeps_own_parser(r):
        user = r.data["service"]["user"]
        ops.directory(name=f"{PARSER_DIR}: where the launch check keeps SGLang's parser table ({user}'s)",
                      path=parser_dir(r), state=state.file(parser_dir(r)), user=user, group=user, mode="755")
    site = f"{venv}/lib/python{(state['basics'] or {}).get('python') or '3'}/site-packages"
    if r.stand_ins.get("sglang"):
        changed.append(ops.bundle(name="stand-in: the server (one archive)", archive=stand_in_archive(r),
                                  dest=f"{venv}/stand-in", marker_state=state.file(f"{venv}/stand-in/.bundle-sha256")))
        pth = f"{site}/{STAND_IN_PTH}"
        changed.append(ops.file(name="stand-in: put it on the venv's path", dest=pth,
                                content=f"{venv}/stand-in\n".encode(), state=state.file(pth)))

    patches = r.data["sglang"].get("patches") or []
    if patches:
        pdir = f"{venv}/patches"
        ops.directory(name="patch dir", path=pdir, state=state.file(pdir))
        for patch in patches:
            dest = f"{pdir}/{patch['name']}.patch"
            have = state.file(dest)
            same_file = bool(have) and have["sha256"] == patch["sha256"]
            if patch.get("url"):
                if not same_file:       # the host's file is the pinned one: no fetch, no upload
                    ops.file(name=f"patch {patch['name']} (fetched here, sha256 verified)", dest=dest,
                             content=url_patch(patch, r.settings.cache), state=have)
            else:
                local = r.settings.checkout / patch["file"]      # a profile's patch file is the checkout's
                content = local.read_bytes() if local.is_file() else b""
                digest = hashlib.sha256(content).hexdigest() if local.is_file() else None
                if digest != patch["sha256"]:
                    raise DeployError(f"patch {patch['name']}: {local} has sha256 {digest}, the profile pins "
                                      f"{patch['sha256']}")
                ops.file(name=f"patch {patch['name']} (sha256 verified)", dest=dest, content=content, state=have)
            # the host's verdict is about the patch file it holds: a new file is not in yet
            applied = same_file and state.patch_applied(dest)
            changed.append(ops.patch_applied(name=f"apply {patch['name']}", directory=site, patch_file=dest,
                                             applied=applied, strip=int(patch.get("strip", 1)), sha256=patch["sha256"]))
    return changed


def url_patch(patch: dict, cache: Path, timeout: float = 60) -> bytes:
    """A profile patch's `url:`, fetched on the control node and kept under CACHE/patches/ by its
    sha256 (a later deploy, or another host, fetches nothing), refused unless its sha256 is the
    profile's pin: the host never downloads (root would write pyinfra's predictable temp name)."""
    name, pinned, url = patch["name"], patch["sha256"], patch["url"]
    kept = cache / "patches" / f"{pinned}.patch"
    if kept.is_file() and hashlib.sha256(body := kept.read_bytes()).hexdigest() == pinned:
        return body
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:    # noqa: S310 (URL: boundary-checked)
            body = answer.read(PATCH_MAX + 1)
    except (OSError, ValueError) as exc:
        raise DeployError(f"patch {name}: cannot fetch {url}: {exc}") from None
    got = hashlib.sha256(body).hexdigest()
    if len(body) > PATCH_MAX or got != pinned:
        size = f"more than {PATCH_MAX >> 20} MiB" if len(body) > PATCH_MAX else f"sha256 {got}"
        raise DeployError(f"patch {name}: {url} has {size}, the profile pins sha256 {pinned}: nothing uploaded")
    kept.parent.mkdir(parents=True, exist_ok=True)
    tmp = kept.with_name(f"{kept.name}.{os.getpid()}.tmp")
    tmp.write_bytes(body)
    tmp.replace(kept)
    return body


PATCH_MAX = 16 << 20      # a diff of SGLang's Python sources; anything larger is not one


def parser_dir(r: Rollout) -> str:
    return f"{r.layout.venv}/{PARSER_DIR}"


def launch_argv(r: Rollout) -> list[str]:
    """The argv the check parses: the unit's (replica 0's), the API key's credential where the
    check's own transient unit gets it (the server's exists only while the server runs)."""
    credentials = {r.layout.credential_path(SGLANG_CONFIG_CREDENTIAL),
                   r.layout.instance_credential_path(0, SGLANG_CONFIG_CREDENTIAL)}   # replica 0's argv
    own = f"{sandbox.CREDENTIALS}/{SGLANG_CONFIG_CREDENTIAL}"
    return [own if a in credentials else a for a in r.rendered.argv[3:]]


def parser_argv(r: Rollout) -> tuple[list[str], str]:
    """(the argv that parses, what it is): SGLang's own parser in the venv, or on a twin that
    keeps it (DSV4_SIM_LAUNCH_CHECK=twin), the twin's."""
    version = r.data["sglang"]["version"]
    if twin_keeps_own_parser(r):
        module = r.stand_ins["launch_check_module"]        # required with a stand-in (rollout_for)
        return ([r.layout.python, ISOLATED, "-m", module],
                f"the twin's parser (stand-in: SGLang {version}'s flags and their arity, no value checks)")
    table = f"{r.layout.venv}/{PARSER_TABLE}"
    known = facts(version)
    if known and known.prepare_without_gpu:
        # and SGLang's own start checks that need no GPU (launch_parser.prepare): an argv that
        # parses but that ServerArgs refuses never stops the old server
        return ([r.layout.python, ISOLATED, "-c", LAUNCH_PARSER, "check", "--prepare", table, parser_key(r)],
                f"SGLang {version}'s own parser with its ServerArgs checks")
    return ([r.layout.python, ISOLATED, "-c", LAUNCH_PARSER, "check", table, parser_key(r)],
            f"SGLang {version}'s own parser")


def launch_parser(r: Rollout) -> tuple[str, str]:
    """(the command that parses, as a shell line: what the launch check's key holds, what it is)."""
    argv, what = parser_argv(r)
    return " ".join(shlex.quote(a) for a in argv), what


def launch_check_command(r: Rollout) -> str:
    """The check as the server's account in the server's sandbox with no network and an empty HOME
    (host/sandbox.py "launch check"): root never imports the venv's packages. SGLang's --config
    (the API key) reaches it as the server's does, a credential from the root-only file."""
    credentials = ({SGLANG_CONFIG_CREDENTIAL: r.layout.sglang_config_secret}
                   if r.data["server"].get("api_key") else {})
    writable = () if twin_keeps_own_parser(r) else (parser_dir(r),)     # the parser table's folder
    return sandbox.command([*parser_argv(r)[0], *launch_argv(r)], r.rendered.unit, "launch check",
                           writable=writable, credentials=credentials)


def parser_key(r: Rollout) -> str:
    """What SGLang's parser in the venv depends on (the venv, what it holds as its marker says, its
    patches) and the program that captures it: a table captured under another key is not used."""
    doc = {"venv": r.layout.venv, "holds": venv_marker(r), "program": hashlib.sha256(LAUNCH_PARSER.encode()).hexdigest(),
           "patches": sorted(p["sha256"] for p in r.data["sglang"].get("patches") or [])}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def launch_check_key(r: Rollout) -> str:
    """What a passed launch check proves: this argv parsed by this venv's parser (its path, what
    it holds as its marker says, its patches). Kept in the release record (releases.new_record)."""
    doc = {"argv": launch_argv(r), "parser": launch_parser(r)[0], "venv": r.layout.venv, "holds": venv_marker(r),
           "patches": sorted(p["sha256"] for p in r.data["sglang"].get("patches") or [])}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


VENV_CHANGED = "venv changed"      # the reason deploy/serve.py's collector gives (changes.Changes)


def launch_check_plan(r: Rollout, state: HostState, reasons: list[str]) -> tuple[bool, str]:
    """Pure: (run it?, what the plan says). Not again when a release on this host passed this
    very check (same argv, same venv: the key every record keeps; a record exists only for an argv
    that passed, and a rollback's carries the key of what it restores) and this run does not
    touch the venv (REASONS: a refill, a repair, a patch or the stand-in may change what the key
    cannot see): importing SGLang costs seconds. The release that serves is named first."""
    recs = state["releases"] or []
    live = releases.current(recs)
    what = launch_parser(r)[1]
    key = launch_check_key(r)
    if VENV_CHANGED not in reasons:
        if live and live.get("launch_check") == key:
            return False, (f"launch check: release {live['release']:04d}, the last deployed, passed it with this argv "
                           f"and venv ({what}); not run again")
        passed = [rec for rec in recs if rec.get("launch_check") == key]
        if passed:
            return False, (f"launch check: release {passed[-1]['release']:04d} ({passed[-1]['status']}) passed it with "
                           f"this argv and venv ({what}); not run again")
    table = " (from the table it captured in this venv, when it has one)" if PARSER_TABLE in launch_parser(r)[0] else ""
    return True, f"launch check before the switch: {what} parses the rendered argv{table}"


@deploy("Launch check")
def launch_check(r: Rollout, state: HostState, reasons: list[str]) -> None:
    """The host's SGLang parses the rendered argv before anything restarts (see launch_check_plan)."""
    run, said = launch_check_plan(r, state, reasons)
    if not run:
        logger.info(f"{host.print_prefix}{said}")
        return
    what = launch_parser(r)[1]
    server.shell(name=f"{what} parses the rendered argv (as {r.data['service']['user']}, in the unit's sandbox)",
                 commands=[launch_check_command(r)])
