"""The run's plan in words, printed while pyinfra prepares (so `make plan` shows it too): what
restarts and why, the release record, the gate with its floors, and what a failure does."""

from __future__ import annotations

from pyinfra import host

from dsv4deploy.release import records as releases
from dsv4deploy.release.changes import Changes
from dsv4deploy.gate import GateSpec
from dsv4deploy.host.release_store import lock_holder
from dsv4deploy.host.state import HostState
from dsv4deploy.release.rollout import Rollout
from dsv4deploy.tasks.replicas import down_units, out_of_gateway, stale_instances, surplus_units
from dsv4deploy.tasks.venv import launch_check_plan


def plan_lines(r: Rollout, state: HostState, reasons: list[str], downtime: str | None = None,
               gateway_restart: str | None = None) -> list[str]:
    """Pure: the plan for rollout R against STATE with the collector's REASONS (and who held the
    deploy lock when the host was read: `make plan` takes none, and a deploy refuses while it is held).
    DOWNTIME: why the serving replica set cannot take it one replica at a time (tasks.cannot_roll);
    GATEWAY_RESTART: why its gateway restarts (tasks.gateway_restart)."""
    holder = state.lock_holder
    held = [f"the deploy lock was held when the host was read: {lock_holder(holder)}; a deploy refuses "
            "while that run holds it"] if holder else []
    return held + _steps(r, state, reasons, downtime, gateway_restart)


def _steps(r: Rollout, state: HostState, reasons: list[str], downtime: str | None = None,
           gateway_restart: str | None = None) -> list[str]:
    recs = state["releases"] or []
    live = releases.current(recs)
    t = r.target
    unit = ", ".join(t.units)
    if not reasons:
        if live and state.unit_active:
            stale = stale_instances(r, state)
            missing = [rt for rt in out_of_gateway(r, state) if rt not in stale]
            out = [f"nothing to change in release {live['release']:04d} ({live['profile']}), but {u} runs and is "
                   f"not one of its {len(t.replica_targets)} replicas: drain it from {t.unit}, stop and disable it"
                   for u in surplus_units(r, state)]
            out += [f"nothing to change in release {live['release']:04d} ({live['profile']}), but {rt.label} runs "
                    "other files than those in place (its process's argv is not the release's: no gate passed on "
                    "it): out of the gateway, restart it, health, identity and a probe on its own port, back in"
                    for rt in stale]
            if missing:
                out.append(f"nothing to change in release {live['release']:04d} ({live['profile']}), but {t.unit} "
                           f"does not list {', '.join(rt.label for rt in missing)}: health and identity on its own "
                           "port, then add it back (no restart)")
            if gateway_restart:
                out.append(f"nothing to change in release {live['release']:04d} ({live['profile']}), but {t.unit} "
                           f"{gateway_restart}: restart it alone (the replicas keep running; connections to "
                           "the gateway drop while it restarts), then a probe through it")
            return out or [f"nothing to change: release {live['release']:04d} ({live['profile']}) is deployed and "
                    f"{unit} {'is' if len(t.units) == 1 else 'are'} active"]
        if t.is_set and live:
            down = down_units(r, state)
            return [f"nothing changed, but {', '.join(down) or unit} {'is' if len(down) == 1 else 'are'} not "
                    f"active: start {'it' if len(down) == 1 else 'them'} (each replica probed on its own port), "
                    + (f"restart {t.unit} ({gateway_restart}), " if gateway_restart and t.unit.removesuffix(
                       ".service") not in down else "")
                    + f"then a probe through {t.unit}; release {live['release']:04d} passed its gate already"]
        return [f"nothing changed, but {unit} is not active: start it, then health, identity and the gate"]
    number = max((rec["release"] for rec in recs), default=0) + 1
    spec = GateSpec.from_profile(r.data)
    floors = ", ".join(f"C={lv.concurrency}" + (f" >= {lv.min_output_throughput:g} tok/s"
                                                 if lv.min_output_throughput is not None else "")
                       for lv in spec.run_order())
    early = (f"; a level stops early {spec.early_pass_margin:.0%} above its floor"
             if spec.early_pass_margin is not None else "; every level runs to the end")
    fallback = (f"roll back to release {live['release']:04d} ({live['profile']}), the last that passed"
                if live else f"stop {'the units' if r.target.is_set else 'the unit'} (no earlier release passed) and "
                             "exit non-zero")
    if t.is_set:
        # as the run decides (Switch.run): the gateway serves a set, and the change can roll
        # (a rollback's record has no replicas' parts: the gateway running says a set serves)
        rolling = state.front_active and live is not None and not downtime
        units = ", ".join(rt.unit for rt in t.replica_targets)
        if downtime:
            switch = [f"replace the serving replica set at once (allow_downtime=true: {downtime}): restart {units} "
                      f"together and {t.unit} with them; users get errors until the new set is healthy, then the "
                      "smoke gate through it"]
        elif rolling:
            switch = [f"rolling update behind {t.unit}, one replica at a time: take it out of the gateway, wait for "
                      f"its requests (at most {t.plan.drain_timeout_s} s), restart it, health, identity and the smoke "
                      f"gate on its own port, add it back; the others serve throughout; then "
                      + "".join(f"drain {u} from the gateway (this release does not run it), stop and disable it, "
                                "its GPUs checked free; then " for u in surplus_units(r, state))
                      + (f"restart {t.unit} ({gateway_restart}; connections to it drop while it restarts), then "
                         if gateway_restart else "")
                      + f"{2 * len(t.replica_targets)} short probe requests through {t.unit} (users are there: no "
                      "second gate loads them)"]
        else:
            switch = [f"start {units} at once (no replica set serves yet"
                      + (f"; {r.layout.service}.service stops first" if state.unit(r.layout.service).get("ActiveState")
                         == "active" else "") + f"), then {t.unit} on {t.base_url}, then the smoke gate through it"]
        return [f"switch the replica set because: " + "; ".join(reasons), launch_check_plan(r, state, reasons)[1],
                f"record release {number:04d} ({r.profile.name}) as pending before the switch", *switch,
                f"smoke gate {floors}{early}",
                f"gate passed: release {number:04d} deployed; failed: {fallback}"
                + (" (only the replicas it touched, one at a time)" if rolling else "")]
    return [f"restart {unit} because: " + "; ".join(reasons), launch_check_plan(r, state, reasons)[1],
            f"record release {number:04d} ({r.profile.name}) as pending before the switch",
            f"after the restart: health within {r.data['service']['health_timeout_s']} s, identity "
            f"(/server_info is this release), smoke gate {floors}{early}",
            f"gate passed: release {number:04d} deployed; failed: {fallback}"]


def show_plan(r: Rollout, state: HostState, changes: Changes, downtime: str | None = None,
              gateway_restart: str | None = None) -> list[str]:
    lines = plan_lines(r, state, changes.reasons, downtime, gateway_restart)
    for line in lines:
        print(f"[{host.name}] plan: {line}")
    return lines
