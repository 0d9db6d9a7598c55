"""What a deploy needs to know about the host, read in one command before anything changes.

`queries(rollout)` names every fact the rollout decides from (pure: tested without a host);
`read_state(host, rollout)` runs them as one command (host/snapshot.py) and returns a
`HostState`, from which every step derives its operations. A re-deploy that changes nothing
therefore costs this one read, the lock, and nothing else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pyinfra.facts.server import Command

from dsv4deploy.weights.source import hub_expectation, local_expectation, rsync_folder
from dsv4deploy.render.layout import ETC, FETCH_USER, GATE_USER, MODELS, OPT, STATE
from dsv4deploy.render.keys import has_admin_key
from dsv4deploy.release.rollout import Rollout, Target
from dsv4deploy.release.running_set import SetRead
from dsv4deploy.host import installer, snapshot
from dsv4deploy.host.replicas import gpu_mib, gpus_free_command, instances_command, parse_instances, stale_query
from dsv4deploy.host.nvidia_apt import REBOOT_FLAG, packages_read as driver_packages_read
from dsv4deploy.host.reboot import BOOT_ID
from dsv4deploy.host.facts import (Accounts, ApiKeyState, Checkpoint, DebPackages, DiskRoom, FileStates,
                                   GatewayStale, GatewayWorkers, HostBasics, JsonFile, NvidiaSmi, PatchesApplied,
                                   PortOwners, RecentReleases, UnitInfo, VerifiedCheckpoint)

# What the deploy runs on the host beyond a fresh server install (systemd, sshd, python3, sudo,
# iproute2, procps): the venv (python3-venv: not in a default Ubuntu server), health and identity
# checks (curl), patches (patch), pip and uv over TLS (ca-certificates). Same names on Debian and Ubuntu.
HOST_PACKAGES = ["python3-venv", "curl", "patch", "ca-certificates"]
LOCK = f"{STATE}/deploy.lock"
VENV_MARKER = ".dsv4deploy-venv.json"
PIP_FREEZE = "pip-freeze.txt"                 # what the venv holds, frozen once per fill
STAND_IN_PTH = "dsv4deploy-stand-in.pth"      # puts the twin's stand-in server on the venv's path


def directories(r: Rollout) -> list[tuple[str, str, str, str]]:
    """(path, user, group, mode) of every directory the releases use."""
    user = r.data["service"]["user"]
    return [(OPT, "root", "root", "755"), (f"{OPT}/venvs", "root", "root", "755"), (ETC, "root", "root", "755"),
            (r.layout.config_dir, "root", "root", "755"), (STATE, "root", "root", "755"),
            (r.layout.releases_dir, "root", "root", "755"), (r.layout.state_dir, user, user, "750"),
            (MODELS, "root", "root", "755"), (r.layout.secrets_dir, "root", "root", "700")]


GATE_HOME = "/nonexistent"


def accounts_wanted(r: Rollout) -> list[tuple[str, str, str, str]]:
    """(name, home, what it is for, what to do if it is refused) of the accounts the deploy makes
    or keeps (host/accounts.py judges them, tasks/system.py makes them)."""
    user = r.data["service"]["user"]
    return [(user, r.layout.state_dir, "service.user: runs the server",
             "name an account of its own in service.user that does not exist yet (e.g. sglang): the deploy "
             "makes it as a system account"),
            (GATE_USER, GATE_HOME, "runs the gate's load client",
             f"its name is fixed: remove or rename the host's {GATE_USER} account"),
            (FETCH_USER, GATE_HOME, "downloads and verifies the checkpoints, owns their folders",
             f"its name is fixed: remove or rename the host's {FETCH_USER} account")]


def patch_files(r: Rollout) -> list[tuple[str, int]]:
    return [(f"{r.layout.venv}/patches/{p['name']}.patch", int(p.get("strip", 1)))
            for p in r.data["sglang"].get("patches") or []]


def managed_paths(r: Rollout) -> list[str]:
    """Every path whose content, mode or owner a step compares."""
    L = r.layout
    paths = [d[0] for d in directories(r)]
    paths += [L.unit, L.nccl_env, L.manifest, L.hf_token_file, f"{L.venv}/bin/python",
              f"{L.venv}/dsv4deploy.lock", f"{L.venv}/patches", f"{L.venv}/stand-in/.bundle-sha256",
              f"{L.venv}/dsv4deploy-parser",                       # tasks/venv.py PARSER_DIR
              f"{L.venv}/lib/python3*/site-packages/{STAND_IN_PTH}",
              f"{L.model_dir}"]
    paths += [f for f, _ in patch_files(r)]
    paths += installer.paths()
    paths += list(r.rendered.files)             # replicas: the template unit, each replica's files, the gateway's
    if r.rendered.gateway is not None:
        paths += [f"{r.rendered.gateway.venv}/bin/python", f"{r.rendered.gateway.venv}/dsv4deploy.lock"]
    return list(dict.fromkeys(paths))


def unit_names(r: Rollout) -> list[str]:
    """The units whose state the rollout reads: the release's own (the server; or each replica's
    instance and the gateway) and the other shape's, which a switch between them stops."""
    L = r.layout
    names = [u.removesuffix(".service") for u in r.target.units]
    names.append(L.service if r.target.is_set else L.gateway_service)
    return names


def queries(r: Rollout, hub_expected: str | None = None) -> dict[str, snapshot.Query]:
    """The facts one deploy decides from, by name (see HostState)."""
    L = r.layout
    user = r.data["service"]["user"]
    q: dict[str, snapshot.Query] = {
        "basics": (HostBasics, {}),
        "gpus": (NvidiaSmi, {}),
        "unit": (UnitInfo, {"service": r.target.unit.removesuffix(".service")}),
        "port": (PortOwners, {"port": r.target.port}),
        "releases": (RecentReleases, {"releases_dir": L.releases_dir}),
        "lock": (JsonFile, {"path": f"{LOCK}/owner.json"}),
        "files": (FileStates, {"paths": managed_paths(r)}),
        "packages": (DebPackages, {"names": HOST_PACKAGES + driver_packages_read(r.data)}),
        "boot_id": (Command, {"command": BOOT_ID}),         # tasks/driver.py: a reboot pending or done
        "reboot": (JsonFile, {"path": REBOOT_FLAG}),
        "accounts": (Accounts, {"users": [user, GATE_USER, FETCH_USER], "groups": [user, GATE_USER, FETCH_USER]}),
        "venv": (JsonFile, {"path": f"{L.venv}/{VENV_MARKER}"}),
        "disk": (DiskRoom, {"paths": [MODELS, OPT], "present": L.model_dir}),
    }
    q |= {f"unit:{name}": (UnitInfo, {"service": name}) for name in unit_names(r)}
    if r.target.is_set:
        q["gateway_venv"] = (JsonFile, {"path": f"{r.rendered.gateway.venv}/{VENV_MARKER}"})
        q |= set_queries(r.target)
    if r.data["server"].get("api_key"):
        q["api_key"] = (ApiKeyState, {"key_file": L.api_key_file, "config_file": L.sglang_config_secret,
                                      "admin_file": L.admin_key_file if has_admin_key(r.data) else None,
                                      "others": [L.admin_key_file, L.gateway_control_key_file]})
    if patch_files(r):
        q["patches"] = (PatchesApplied, {"venv": L.venv, "patches": patch_files(r)})
    if hub_expected is not None:
        q["checkpoint"] = (VerifiedCheckpoint, {"path": L.model_dir, "expected": hub_expected})
    else:
        q["checkpoint"] = (Checkpoint, {"path": L.model_dir})
    return q


def set_queries(t: Target) -> dict[str, snapshot.Query]:
    """What a replica set T runs, as release/running_set.py compares it with its release: the
    gateway's workers, whether it runs older files than those in place, each instance's process."""
    L = t.layout
    keyed = bool(t.data["server"].get("api_key"))
    return {"gateway_workers": (GatewayWorkers, {"url": t.base_url,
                                                 "key_file": L.gateway_control_key_file if keyed else None,
                                                 "fallback_key_file": L.api_key_file if keyed else None}),
            "gateway_stale": (GatewayStale, stale_query(t)),
            "instances": (Command, {"command": instances_command(t)})}


def read_set(h, t: Target) -> SetRead:
    """Replica set T on host H as `dsv4deploy status` compares it with its release (one command):
    set_queries, the gateway's unit and the memory in use on the set's GPUs."""
    gpus = sorted({g for rep in t.plan.replicas for g in rep.gpus})
    snap = snapshot.read(h, {**set_queries(t), "gateway": (UnitInfo, {"service": t.unit.removesuffix(".service")}),
                             "gpu_mib": (Command, {"command": gpus_free_command(gpus)})}, timeout=60)
    return SetRead(instances=parse_instances(snap["instances"]), workers=snap["gateway_workers"],
                   gateway=snap["gateway"] or {}, gateway_stale=bool(snap["gateway_stale"]),
                   gpu_mib=gpu_mib(snap["gpu_mib"]))


@dataclass
class HostState:
    """The host as one read saw it. Read-only: steps compare against it, never update it."""

    values: dict[str, Any]
    commands: int = 1
    units: tuple[str, ...] = ()     # a replica set's units (instances and gateway): all must be active
    first: tuple[list[str], int] | None = None   # what the command run before the read printed (the lock)

    def __getitem__(self, key: str) -> Any:
        return self.values.get(key)

    @property
    def lock_holder(self) -> dict | None:
        """The owner of the deploy lock as the read saw it, when that is another run (None: free, or
        this run's own: the read that takes the lock sees its own owner)."""
        took = self.first is not None and self.first[1] == 0
        return None if took else self.values.get("lock")

    def file(self, path: str) -> dict | None:
        """FileStates' entry for PATH (None: it does not exist)."""
        return (self.values.get("files") or {}).get(path)

    def unit(self, name: str) -> dict:
        """UnitInfo of NAME (without .service), read for a replica set."""
        return self.values.get(f"unit:{name}") or {}

    @property
    def front_active(self) -> bool:
        """The unit users reach is active: the server, or a replica set's gateway (a set with a
        replica down still serves through it)."""
        return (self.values.get("unit") or {}).get("ActiveState") == "active"

    @property
    def unit_active(self) -> bool:
        if self.units:
            return all(self.unit(name).get("ActiveState") == "active" for name in self.units)
        return (self.values.get("unit") or {}).get("ActiveState") == "active"

    @property
    def checkpoint_complete(self) -> bool:
        c = self.values.get("checkpoint") or {}
        return bool(c.get("complete")) and c.get("marker", True) is not False

    @property
    def our_pids(self) -> set[int]:
        """Main PIDs of our running units (the server, or a replica set's instances and gateway)."""
        infos = [self.values.get("unit") or {}] + [v or {} for k, v in self.values.items() if k.startswith("unit:")]
        return {i["MainPID"] for i in infos if isinstance(i.get("MainPID"), int) and i["MainPID"] > 0}

    def patch_applied(self, patch_file: str) -> bool:
        return bool((self.values.get("patches") or {}).get(patch_file))


def read_state(h, r: Rollout, first: str = "") -> HostState:
    """Read everything with one command (the inventory's privileges apply), after FIRST (the
    deploy lock's command: the host is then read under the lock)."""
    hub = None      # what every file must be, by size and sha256: the hub's metadata, or the rsync source's
    if r.weights_source.get("type") == "hf":
        hub = json.dumps(hub_expectation(r.weights_source, r.data["model"]["repo"], r.data["model"]["revision"],
                                         r.settings))
    elif r.weights_source.get("type") == "rsync":
        hub = json.dumps(local_expectation(rsync_folder(r.weights_source, r.settings.checkout), r.settings.cache))
    snap = snapshot.read(h, queries(r, hub), first=first)
    units = tuple(u.removesuffix(".service") for u in r.target.units) if r.target.is_set else ()
    return HostState(values=snap.values, commands=snap.commands, units=units, first=snap.first)
