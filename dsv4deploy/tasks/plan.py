"""The run's plan in words, printed while pyinfra prepares (so `make plan` shows it too): what
restarts and why, the release record, the gate with its floors, and what a failure does."""

from __future__ import annotations

from pyinfra import host

from .. import releases
from ..changes import Changes
from ..gate import GateSpec
from ..host.state import HostState
from ..rollout import Rollout


def plan_lines(r: Rollout, state: HostState, reasons: list[str]) -> list[str]:
    """Pure: the plan for rollout R against STATE with the collector's REASONS."""
    recs = state["releases"] or []
    live = releases.current(recs)
    unit = f"{r.layout.service}.service"
    if not reasons:
        if live and state.unit_active:
            return [f"nothing to change: release {live['release']:04d} ({live['profile']}) is deployed and "
                    f"{unit} is active"]
        return [f"nothing changed, but {unit} is not active: start it, then health, identity and the gate"]
    number = max((rec["release"] for rec in recs), default=0) + 1
    spec = GateSpec.from_profile(r.data)
    floors = ", ".join(f"C={lv.concurrency}" + (f" >= {lv.min_output_throughput:g} tok/s"
                                                 if lv.min_output_throughput is not None else "")
                       for lv in spec.run_order())
    early = (f"; a level stops early {spec.early_pass_margin:.0%} above its floor"
             if spec.early_pass_margin is not None else "; every level runs to the end")
    fallback = (f"roll back to release {live['release']:04d} ({live['profile']}), the last that passed"
                if live else "stop the unit (no earlier release passed) and exit non-zero")
    return [f"restart {unit} because: " + "; ".join(reasons),
            f"record release {number:04d} ({r.profile.name}) as pending before the switch",
            f"after the restart: health within {r.data['service']['health_timeout_s']} s, identity "
            f"(/server_info is this release), smoke gate {floors}{early}",
            f"gate passed: release {number:04d} deployed; failed: {fallback}"]


def show_plan(r: Rollout, state: HostState, changes: Changes) -> list[str]:
    lines = plan_lines(r, state, changes.reasons)
    for line in lines:
        print(f"[{host.name}] plan: {line}")
    return lines
