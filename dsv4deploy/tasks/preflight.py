"""Preflight: judge the host's state (read once, host/state.py) before changing it, and refuse
clearly. Runs in pyinfra's prepare stage, so a refusal (DeployError) leaves the host untouched.
"""

from __future__ import annotations

from pyinfra.api import DeployError, deploy

from dsv4deploy.profile import catalog
from dsv4deploy.host.accounts import account_problems, login_problem
from dsv4deploy.host.state import HostState, accounts_wanted
from dsv4deploy.render.layout import MODELS, OPT
from dsv4deploy.preflight.disk import GIB, Need, Room, disk_problems, venv_need, weights_need
from dsv4deploy.preflight.gpus import NvidiaSmiError, check_gpus, driver_branch, parse_query, profile_expectations
from dsv4deploy.release.rollout import Rollout
from dsv4deploy.sglang.versions import venv_gib
from dsv4deploy.tasks.driver import reboot_pending
from dsv4deploy.tasks.venv import venv_marker

SUPPORTED_OS = ("debian", "ubuntu")


@deploy("Preflight")
def preflight(r: Rollout, state: HostState) -> dict:
    """Refuses (nothing changed) a host whose OS, GPUs, disk, port or accounts (host/accounts.py)
    the deploy cannot use. Returns what later steps need to know: {'driver_needed': bool, 'gpus': [...]}."""
    accounts = state["accounts"] or {}
    if "uid" in accounts and (login := login_problem(accounts.get("ssh_user", "?"), accounts["uid"], sudo=False,
                                                     sudo_usable=accounts.get("sudo_usable"))):
        # a dry run's read (a real one stops at the lock: release_store.py); what else it read
        # without root (the port's owners, ...) is no ground for more lines
        raise DeployError(f"preflight refused the host: {login}. Nothing was changed on the host.")
    problems: list[str] = []
    data = r.data
    basics = state["basics"] or {}
    os_id = basics.get("os", "").split(" ")[0]
    if os_id not in SUPPORTED_OS:
        problems.append(f"unsupported OS {basics.get('os')!r} (supported: Debian, Ubuntu)")
    py = basics.get("python", "")
    if not py or tuple(int(x) for x in py.split(".")) < (3, 10):
        problems.append(f"python3 >= 3.10 is needed on the host (found {py or 'none'})")

    branch = data["driver"]["branch"]
    smi = state["gpus"]
    driver_needed = smi is None
    gpus = []
    if smi is not None:
        try:
            gpus = parse_query(smi)
        except NvidiaSmiError as exc:
            problems.append(str(exc))
        if gpus and driver_branch(gpus[0].driver_version) < branch:
            driver_needed = True
        expect = profile_expectations(data, compute_cap=r.expect_compute_cap)
        if state.unit_active or state.our_pids:
            expect["min_free_mib"] = None  # our running server holds that memory until the restart
        if driver_needed:
            expect["min_driver_branch"] = None  # the driver step upgrades it
        problems += check_gpus(gpus, **expect)

    problems += disk_problems(disk_needs(r, state), rooms(state))

    port = r.target.port
    owners = state["port"] or []
    ours = state.our_pids
    strangers = sorted({pid for _, pid in owners if pid not in ours}, key=lambda p: p or 0)
    if owners and (strangers or not ours):
        who = ", ".join(f"PID {p}" if p else "an unknown process" for p in strangers) or "a process"
        problems.append(f"port {port} is already held by {who}, not by {r.target.unit} "
                        f"(a stale server?): stop it by its PID or its unit, then deploy again")

    problems += account_problems(accounts_wanted(r), state["accounts"] or {})
    if pending := reboot_pending(r, state):          # a driver install waits for its reboot
        problems.append(pending)

    if problems:
        raise DeployError("preflight refused the host:\n  - " + "\n  - ".join(problems)
                          + "\nNothing was changed on the host: fix the above, then deploy again.")
    return {"driver_needed": driver_needed, "gpus": gpus}


def disk_needs(r: Rollout, state: HostState) -> list[Need]:
    """What this deploy still writes: the checkpoint's bytes not on disk yet under MODELS (none
    when it is complete), and the SGLang venv under OPT unless the host holds it already."""
    size_gib = float(r.weights_source.get("size_gib") or catalog.model(r.data["model"]["repo"]).size_gib)
    present = size_gib * GIB if state.checkpoint_complete else (state["disk"] or {}).get("present_bytes")
    version = r.data["sglang"]["version"]
    installed = bool(state.file(f"{r.layout.venv}/bin/python")) and state["venv"] == venv_marker(r)
    stand_in = (r.stand_ins.get("sglang") or {}).get("venv_gib")     # a host whose venv holds a stand-in
    return [weights_need(MODELS, size_gib, present),
            venv_need(OPT, float(stand_in or venv_gib(version)), installed, f"SGLang {version} venv")]


def rooms(state: HostState) -> dict[str, Room]:
    """The file systems the host's read found, by path (a path `df` said nothing of is absent)."""
    found = (state["disk"] or {}).get("rooms") or {}
    return {path: Room(device=room["device"], mount=room["mount"], free_bytes=room["free_bytes"])
            for path, room in found.items()}
