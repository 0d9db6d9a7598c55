# dsv4deploy host program: runs on the GPU host with its own python3; standard library only.
"""The watch's decisions, pure: one interval's measurement in, each target's verdict and the
actions out. The semantics are Argo Rollouts' analysis: every interval is `passed`, `failed` or
`inconclusive`; a failure limit of consecutive failed intervals triggers an action; an
inconclusive interval never does (it neither counts nor clears the failures before it).

Why a failure is the hardware's or the release's decides the action:
- hardware (a fatal XID, uncorrectable ECC, a pending row remap, a hardware or thermal slowdown,
  a PCIe link below what the preflight recorded, a GPU gone, memory held by a foreign process):
  no restart and no config rollback (neither mends a GPU); the target is marked degraded with
  the GPU and the evidence, and a replica on the sick GPUs leaves the gateway while another one
  serves, and comes back once its GPUs and its own probe are healthy again;
- the release (slower than its own gate, a hang behind a healthy /health, wrong answers, errors)
  with healthy GPUs: restart it (docs/watch.md says why not a rollback), at most once per
  cooldown; a regression that comes back within the cooldown is marked degraded for the operator.

Used by agent.py on the host (loaded by path: no package there) and by the tests and the bench
on the control node, from recorded measurements.
"""

from __future__ import annotations

import copy

PASSED, FAILED, INCONCLUSIVE = "passed", "failed", "inconclusive"
HARDWARE, REGRESSION, DOWN, PAUSED = "hardware", "regression", "down", "paused"

# XIDs that mean the GPU or its memory, not the program (NVIDIA's XID catalogue): 79 fallen off
# the bus, 48/63/64/94/95 memory and ECC, 74 NVLink, 92 high single-bit ECC rate, 119/120 GSP,
# 61/62 internal micro-controller. 13/31/43/45 are usually the application's.
XID_HARDWARE = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})
# Clock-event reasons that slow a GPU for a reason outside the program (the power cap and idle
# are normal); nvidia-smi's --query-gpu clocks_event_reasons.* names, without the prefix.
SLOWDOWNS = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown")

DEFAULTS = {
    "interval_s": 60,             # one measurement a minute (Flagger's default)
    "failure_limit": 3,           # consecutive failed intervals before an action
    "slower_than_gate": 0.3,      # the probe's time per token this much above the gate's: failed
    "busy_requests": 0,           # users' running requests above this: speed is not compared
    "on_regression": "restart",   # restart | none (only mark it degraded)
    "restart_cooldown_s": 3600,   # a second regression within this after a restart: degraded
    "foreign_mib": 1024,          # memory a process that is not the release's may hold on its GPUs
    "probe": {"requests": 3, "input_len": 32, "output_len": 32, "timeout_s": 30},
}
KEEP = 20                         # intervals kept per target in the state (the trend status shows)


def settings(block: dict | None) -> dict:
    """The profile's `watch:` block over DEFAULTS (probe merged key by key)."""
    out = copy.deepcopy(DEFAULTS)
    for key, value in (block or {}).items():
        if key == "probe" and isinstance(value, dict):
            out["probe"].update(value)
        else:
            out[key] = value
    return out


# --- the GPUs ---------------------------------------------------------------------------------

def gpu_faults(gpu: dict, foreign_mib: int) -> list[str]:
    """What is wrong with one GPU as the agent read it (agent.read_gpus), one phrase each."""
    i = gpu.get("index")
    if not gpu.get("present", True):
        return [f"GPU {i} is gone (nvidia-smi no longer lists {gpu.get('uuid') or 'it'})"]
    out = []
    fatal = sorted({x for x in gpu.get("xid", []) if x in XID_HARDWARE})
    if fatal:
        out.append(f"GPU {i} XID {', '.join(map(str, fatal))} in the kernel log")
    if (gpu.get("ecc_uncorrectable") or 0) > 0:
        out.append(f"GPU {i} {gpu['ecc_uncorrectable']} uncorrectable ECC errors")
    if gpu.get("remap_pending"):
        out.append(f"GPU {i} row remap pending (reset needed)")
    slow = [r for r in gpu.get("clock_events", []) if r in SLOWDOWNS]
    if slow:
        out.append(f"GPU {i} clock events: {', '.join(slow)}")
    link, want = gpu.get("pcie"), gpu.get("pcie_recorded")
    if link and want and (link[0] < want[0] or link[1] < want[1]):
        out.append(f"GPU {i} PCIe gen{link[0]} x{link[1]}, recorded at deploy gen{want[0]} x{want[1]}")
    if (gpu.get("foreign_mib") or 0) > foreign_mib:
        out.append(f"GPU {i} {gpu['foreign_mib']} MiB held by a process that is not the release's")
    return out


def application_xids(gpus: list[dict]) -> list[str]:
    """XIDs that are usually the program's (13, 31, 43...): evidence, not a hardware fault."""
    return [f"GPU {g.get('index')} XID {x} (usually the application's)"
            for g in gpus for x in sorted(set(g.get("xid", []))) if x not in XID_HARDWARE]


# --- one interval -----------------------------------------------------------------------------

def verdict(target: dict, gpus: list[dict], cfg: dict, baseline: dict | None, paused: str | None = None) -> dict:
    """One target's interval: {verdict, cause, reasons}. TARGET: the agent's reading of one
    server or replica (unit, health, probe, users' running requests); GPUS: its GPUs' readings;
    BASELINE: the release's gate figures at one request ({tpot_ms, ttft_ms}); PAUSED: why the watch
    must not judge now (a deploy holds the lock)."""
    if paused:
        return {"verdict": INCONCLUSIVE, "cause": PAUSED, "reasons": [paused]}
    hw = [f for g in gpus for f in gpu_faults(g, cfg["foreign_mib"])]
    if hw:
        return {"verdict": FAILED, "cause": HARDWARE, "reasons": hw}
    notes = application_xids(gpus)
    if target.get("starting"):
        return {"verdict": INCONCLUSIVE, "cause": None, "reasons": ["the server is starting"] + notes}
    health = target.get("health") or {}
    if not target.get("unit_active", True) or not health.get("ok"):
        why = "unit not active" if not target.get("unit_active", True) else f"/health: {health.get('error') or health.get('status')}"
        return {"verdict": FAILED, "cause": DOWN, "reasons": [why] + notes}
    probe = target.get("probe") or {}
    if probe.get("error"):
        return {"verdict": FAILED, "cause": REGRESSION, "reasons": [f"probe: {probe['error']} while /health answers"] + notes}
    asked, got = probe.get("asked"), probe.get("tokens")
    if asked is not None and got != asked:
        return {"verdict": FAILED, "cause": REGRESSION, "reasons": [f"probe asked {asked} tokens, got {got}"] + notes}
    tpot, base = probe.get("tpot_ms"), (baseline or {}).get("tpot_ms")
    if tpot is None or not base:
        return {"verdict": INCONCLUSIVE, "cause": None,
                "reasons": ["no gate figure to compare the probe with" if not base else "probe measured no time per token"] + notes}
    limit = base * (1 + cfg["slower_than_gate"])
    if tpot > limit:
        busy = target.get("running")
        if busy is None or busy > cfg["busy_requests"]:
            return {"verdict": INCONCLUSIVE, "cause": None,
                    "reasons": [f"probe TPOT {tpot:.1f} ms > {limit:.1f} ms, but users' load ({busy if busy is not None else 'unknown'} "
                                "running) makes it not comparable"] + notes}
        over = baseline.get("requests")
        return {"verdict": FAILED, "cause": REGRESSION,
                "reasons": [f"probe TPOT {tpot:.1f} ms, {tpot / base - 1:.0%} above the gate's {base:.1f} ms "
                            + (f"over {over} of {baseline.get('num_prompts')} requests " if over else "")
                            + f"(limit {cfg['slower_than_gate']:.0%})"] + notes}
    return {"verdict": PASSED, "cause": None, "reasons": notes}


# --- the decision -----------------------------------------------------------------------------

def new_target_state() -> dict:
    return {"consecutive": 0, "history": [], "evicted": False, "degraded": None, "restarts": [],
            "passes": 0, "last_action": None}


def step(state: dict, reading: dict, cfg: dict, now: float) -> tuple[dict, list[dict]]:
    """One interval: STATE (the last one's, {"targets": {name: ...}}) and READING (agent.measure:
    targets, gpus, baseline, paused) in, the new state and the actions out. Each action is
    {"action": restart|evict|readmit|degraded|recovered, "target", "index", "reason", "evidence"}."""
    state = copy.deepcopy(state or {})
    states = state.setdefault("targets", {})
    gpus = {g["index"]: g for g in reading.get("gpus", [])}
    targets = reading.get("targets", [])
    serving = [t["name"] for t in targets if not states.get(t["name"], {}).get("evicted")]
    actions: list[dict] = []
    for t in targets:
        ts = states.setdefault(t["name"], new_target_state())
        mine = [gpus.get(i, {"index": i, "present": False}) for i in t.get("gpus", [])]
        v = verdict(t, mine, cfg, reading.get("baseline"), reading.get("paused"))
        v["t"] = now
        ts["history"] = (ts["history"] + [v])[-KEEP:]
        if v["verdict"] == FAILED:
            ts["consecutive"] += 1
            ts["passes"] = 0
        elif v["verdict"] == PASSED:
            ts["consecutive"] = 0
            ts["passes"] += 1
        if v["verdict"] == INCONCLUSIVE:
            continue
        act = _act(t, ts, v, cfg, now, [s for s in serving if s != t["name"]])
        if act:
            act["evidence"] = [h for h in ts["history"] if h["verdict"] == FAILED][-cfg["failure_limit"]:]
            ts["last_action"] = {k: act[k] for k in ("action", "reason")} | {"t": now}
            actions.append(act)
            if act["action"] == "evict":
                serving.remove(t["name"])
    state["t"] = now
    return state, actions


def _act(t: dict, ts: dict, v: dict, cfg: dict, now: float, others: list[str]) -> dict | None:
    """The action for target T after verdict V, or None; updates TS (its state) for it."""
    base = {"target": t["name"], "index": t.get("index")}
    if v["verdict"] == PASSED:
        if ts["evicted"] and ts["passes"] >= cfg["failure_limit"]:
            ts["evicted"], ts["degraded"] = False, None
            return base | {"action": "readmit", "reason": f"healthy for {ts['passes']} intervals: back in the gateway"}
        if ts["degraded"] and not ts["evicted"]:
            was, ts["degraded"] = ts["degraded"], None
            return base | {"action": "recovered", "reason": f"healthy again after: {was}"}
        return None
    if ts["consecutive"] < cfg["failure_limit"]:
        return None
    ts["consecutive"] = 0                 # an action starts the count again
    why = "; ".join(v["reasons"][:3])
    if v["cause"] == HARDWARE:
        if ts["degraded"] and (ts["evicted"] or t.get("index") is None or not others):
            return None                   # already marked; nothing more to do until it heals
        ts["degraded"] = why
        if t.get("index") is not None and others and not ts["evicted"]:
            ts["evicted"], ts["passes"] = True, 0
            return base | {"action": "evict", "reason": f"hardware fault, no config rollback: {why}; "
                                                        f"{', '.join(others)} serve on"}
        return base | {"action": "degraded", "reason": f"hardware fault, no config rollback: {why}"}
    recent = [r for r in ts["restarts"] if now - r < cfg["restart_cooldown_s"]]
    if cfg["on_regression"] != "restart" or recent:
        if ts["degraded"] == why:
            return None
        ts["degraded"] = why
        after = "a restart did not mend it" if recent else "on_regression is none"
        return base | {"action": "degraded",
                       "reason": f"{v['cause']} with healthy GPUs, {after}: {why}; consider `make rollback`"}
    ts["restarts"] = recent + [now]
    return base | {"action": "restart", "reason": f"{v['cause']} with healthy GPUs: {why}"}


def health(state: dict) -> str:
    """healthy | degraded | down, from the state's targets: down when no target's last conclusive
    interval passed and one is down; degraded when any is marked or evicted."""
    targets = (state or {}).get("targets", {})
    if not targets:
        return "unknown"
    last = {n: next((h for h in reversed(s["history"]) if h["verdict"] != INCONCLUSIVE), None)
            for n, s in targets.items()}
    up = [n for n, h in last.items() if not targets[n]["evicted"] and (h is None or h["verdict"] == PASSED
                                                                        or h["cause"] != DOWN)]
    if not up:
        return "down"
    if any(s["degraded"] or s["evicted"] or s["consecutive"] for s in targets.values()):
        return "degraded"
    return "healthy"
