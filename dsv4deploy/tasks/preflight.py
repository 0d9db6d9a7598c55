"""Preflight: judge the host's state (read once, host/state.py) before changing it, and refuse
clearly. Runs in pyinfra's prepare stage, so a refusal (DeployError) leaves the host untouched.
"""

from __future__ import annotations

from pyinfra.api import DeployError, deploy

from dsv4deploy.profile import catalog
from dsv4deploy.host.accounts import account_problems
from dsv4deploy.host.state import HostState, accounts_wanted
from dsv4deploy.render.layout import MODELS
from dsv4deploy.preflight.gpus import NvidiaSmiError, check_gpus, driver_branch, parse_query, profile_expectations
from dsv4deploy.release.rollout import Rollout

SUPPORTED_OS = ("debian", "ubuntu")


@deploy("Preflight")
def preflight(r: Rollout, state: HostState) -> dict:
    """Refuses (nothing changed) a host whose OS, GPUs, disk, port or accounts (host/accounts.py)
    the deploy cannot use. Returns what later steps need to know: {'driver_needed': bool, 'gpus': [...]}."""
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

    if not state.checkpoint_complete:
        need_gib = float(r.weights_source.get("size_gib") or catalog.model(data["model"]["repo"]).size_gib)
        if problem := disk_problem(state["disk_mib"], need_gib):
            problems.append(problem)

    port = r.target.port
    owners = state["port"] or []
    ours = state.our_pids
    strangers = sorted({pid for _, pid in owners if pid not in ours}, key=lambda p: p or 0)
    if owners and (strangers or not ours):
        who = ", ".join(f"PID {p}" if p else "an unknown process" for p in strangers) or "a process"
        problems.append(f"port {port} is already held by {who}, not by {r.target.unit} "
                        f"(a stale server?): stop it by its PID or its unit, then deploy again")

    problems += account_problems(accounts_wanted(r), state["accounts"] or {})

    if problems:
        raise DeployError("preflight refused the host:\n  - " + "\n  - ".join(problems)
                          + "\nNothing was changed on the host: fix the above, then deploy again.")
    return {"driver_needed": driver_needed, "gpus": gpus}


def disk_problem(free_mib: int | None, need_gib: float) -> str | None:
    """Pure: why NEED_GIB of weights (5% spare) do not fit under MODELS; None: they do. FREE_MIB
    None: `df` told nothing (host/facts.py FreeDiskMib), which is said as such, not as a full disk."""
    need = need_gib * 1.05
    if free_mib is None:
        return (f"could not read the free disk space under {MODELS} (df printed nothing usable); "
                f"{need:.1f} GiB are needed for the weights")
    if free_mib < need * 1024:
        return f"not enough disk for the weights under {MODELS}: {free_mib / 1024:.1f} GiB free, {need:.1f} GiB needed"
    return None
