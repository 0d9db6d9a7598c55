"""Faults 1-14 of issue 12, each from the baseline serving: strike, judge, run the same deploy
again. Each deploys its own variant of the baseline (variants.py), so the twin's fault file hits
the new release and not the one a rollback restores."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from typing import Callable

from ct200twin.faultlab.converge import fault_15, workers
from ct200twin.faultlab.lab import Lab, start
from ct200twin.faultlab.reading import (GATE_USER, RELEASES_DIR, checkpoint_sha, health, live_venv,
                                        local_checkpoint_sha, main_pid, releases)
from ct200twin.faultlab.recovered import serving
from ct200twin.faultlab.rows import Row, add_case, did, fold
from ct200twin.faultlab.tool import (REPO, Run, changed_ops, cut_missed, deploy_and_strike, deploy_argv,
                                     deploy_watching, kill, operations, step_key, while_paused)
from ct200twin.faultlab.variants import REVISION_11, VARIANTS, fresh_variants

# A gate client must be gone this soon after its control process was killed (its heartbeat: 1 s).
CUT_GRACE_S = 3.0
VERIFY_STEP = "Verify | health, identity, smoke gate, record"
F6_CUT_CONTEXT = 15360      # fault 6's cut profiles f6cut-N: this + N (below f6gate's 15872)


def _ctx(name: str) -> str:
    ctx = re.search(r"context_length: (\d+)", VARIANTS[name]).group(1)
    return f"--context-length {ctx}"


def fault_with_knobs(lab: Lab, number: str, fault: str, name: str, knobs: dict, expect: list[str],
                     strikes: str) -> Row:
    """Faults 1-4: a twin knob that hits the new release only; then the knobs are cleared and the
    same deploy is run again."""
    row = Row(number, fault, strikes=strikes)
    t0, before = start(lab)
    lab.faults(**knobs, match_argv=_ctx(name))
    first = lab.deploy(name)
    state = lab.after(first)
    lab.faults()
    rerun = lab.deploy(name)
    return lab.judge(row, first, state, t0=t0, before=before, rerun=rerun, expect=expect)


def fault_1(lab):
    return fault_with_knobs(lab, "1", "server crashes at start", "f1crash",
                            {"crash_on_start": "simulated CUDA error"},
                            ["simulated CUDA error", "rolled back: release"], "restart (load)")


def fault_2(lab):
    return fault_with_knobs(lab, "2", "never healthy (budget runs out)", "f2never", {"never_healthy": True},
                            ["not healthy after 10 s", "rolled back: release"], "health wait")


def fault_3(lab):
    return fault_with_knobs(lab, "3", "5% of requests fail in the gate", "f3errors", {"error_rate": 0.05},
                            ["failed the smoke gate", "failed request", "rolled back: release"], "gate")


def fault_4(lab):
    return fault_with_knobs(lab, "4", "server crashes mid-gate", "f4midgate", {"crash_after_requests": 10},
                            ["failed the smoke gate", "rolled back: release"], "gate (after 10 requests)")


def fault_5(lab):
    """A stale server from an old run holds the port: refused by PID before anything changes; the
    operator stops it as told, and the same deploy converges."""
    row = Row("5", "stale server holds the port", strikes="preflight")
    t0, before = start(lab)
    twin = lab.twin
    venv = live_venv(twin)
    twin.run("systemctl stop sglang.service")
    twin.write_file("/etc/dsv4deploy-twin/stale.json", json.dumps({"stale_model_path": "/srv/old-model"}))
    twin.run("systemd-run --unit stale-sglang -E DSV4_TWIN_FAULTS=/etc/dsv4deploy-twin/stale.json "
             f"-E PATH=/usr/bin:/bin {venv}/bin/python -m ct200twin.server.main --model-path /srv/old-model "
             "--port 30000")
    for _ in range(100):
        if health(twin) == "200":
            break
        time.sleep(0.1)
    stale_pid = int(twin.run("systemctl show -p MainPID --value stale-sglang.service").stdout.strip() or 0)
    first = lab.deploy("f5stale")
    state = lab.after(first)
    twin.run("systemctl stop stale-sglang.service", check=False)     # what the message says to do
    rerun = lab.deploy("f5stale")
    return lab.judge(row, first, state, t0=t0, before=before, rerun=rerun,
                     expect=[f"port 30000 is already held by PID {stale_pid}", "stale server"])


def _strike_mid_gate(lab: Lab):
    """An action for the verify step: kill the control process once the gate client runs on the host."""
    def action(p, _step):
        def wait_and_kill():
            deadline = time.monotonic() + 90      # a deadline, not a count: a command takes 15 to 200 ms
            while time.monotonic() < deadline:
                if p.poll() is not None:
                    return
                if lab.twin.run(f"pgrep -u {GATE_USER}", check=False).stdout.strip():
                    break
                time.sleep(0.1)
            time.sleep(0.5)
            kill(p)
        threading.Thread(target=wait_and_kill, daemon=True).start()
    return action


def cut_at(lab: Lab, name: str, step: str | None, mid_gate: bool = False) -> tuple[Run, tuple, Run]:
    """Kill the control process at `step` (or mid-gate), then run the same deploy again."""
    if mid_gate:
        first = deploy_and_strike(name, lambda s, _i: s == VERIFY_STEP, _strike_mid_gate(lab),
                                  **lab.where)
        if first.rc != -signal.SIGKILL:
            first.struck = None          # the gate ended before the client was seen: no cut
    else:
        first = deploy_and_strike(name, lambda s, _i: step_key(s) == step_key(step), kill,
                                  **lab.where)
    state = lab.after(first, within_s=CUT_GRACE_S)
    rerun = lab.deploy(name)
    return first, state, rerun


def fault_6(lab, steps: list[str] | None = None) -> Row:
    """The control process killed at each step boundary of a rollout (and once in the middle of
    the gate), then the same deploy run again: it converges, nothing is left pending, nothing of
    ours keeps running on the host.

    The steps are those a first run took, and every cut deploys a profile no release on the host
    had (f6cut-N, its own context length), as that run did: a step that runs only when its inputs
    change (the launch check: a new argv) comes in each cut run too. A cut whose step its run
    never started is said so, "DID NOT STRIKE", and the row is not recovered."""
    row = Row("6", "control process killed (SSH cut)", strikes="")
    fresh = fresh_variants(lab.profiles, {r["profile"] for r in releases(lab.twin)}, "f6cut", F6_CUT_CONTEXT)
    if steps is None:
        lab.baseline()
        full = lab.deploy(next(fresh))
        steps = operations(full.output)
        if full.rc != 0:
            row.why_not.append(f"the run that lists the steps failed (exit {full.rc}): {did(full.output)}")
    cases = [(s, False) for s in steps] + [("the gate, mid-run (f6gate)", True)]
    row.strikes = f"each of {len(steps)} step boundaries + mid-gate"
    subs = []
    for step, mid in cases:
        t0, before = start(lab)
        first, state, rerun = cut_at(lab, "f6gate" if mid else next(fresh), None if mid else step, mid_gate=mid)
        sub = lab.judge(Row("6", f"cut at {step}"), first, state, t0=t0, before=before, rerun=rerun)
        cut_case(row, sub, VERIFY_STEP if mid else step, step, first, rerun)
        subs.append(sub)
    row.did = "SIGKILL; re-run settled the cut release and converged"
    return fold(row, subs)


def cut_case(row: Row, sub: Row, step: str, label: str, first: Run, rerun: Run) -> None:
    """One cut of fault 6 into its row: the detail line, the runs' output, what went wrong (one
    line per cut, not each of its reasons). A cut at STEP that did not land on FIRST (its step
    never came, or the run ended first: tool.cut_missed) is said so and not counted as recovered."""
    missed = cut_missed(step, first)
    if missed:
        sub.missed(missed)
    row.details.append(f"  6 cut at {label[:60]:<60} exit {first.rc:>4}  re-run exit {rerun.rc}  "
                       f"{sub.verdict()}  ({sub.recover_s or 0:.1f} s)")
    row.outputs[f"cut at {label}"] = first.output
    row.outputs[f"re-run after {label}"] = rerun.output
    if sub.why_not:
        row.why_not.append(f"{label}: " + "; ".join(sub.why_not))
    row.not_struck += sub.not_struck


def fault_7(lab) -> Row:
    """Two deploys started at once: one refuses with the holder's PID, the other finishes."""
    row = Row("7", "two deploys at once", strikes="deploy lock")
    t0, before = start(lab)
    env = {**os.environ, **lab.env, "DSV4_PROFILES_DIR": str(lab.profiles)}
    procs = [subprocess.Popen(deploy_argv("f7twice", inventory=lab.inventory), cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    wall = time.monotonic() - t0
    rcs = [p.returncode for p in procs]
    winners = [i for i in (0, 1) if rcs[i] == 0]
    first = Run(rc=max(rcs), output="\n".join(outs), wall_s=wall)
    if len(winners) != 1:
        row.why_not.append(f"exit codes {rcs}: exactly one deploy must finish")
        loser_text = ""
    else:
        w, loser = winners[0], 1 - winners[0]
        loser_text = outs[loser]
        if f"another deploy holds the lock on this host: PID {procs[w].pid} " not in loser_text:
            row.why_not.append("the refused deploy does not name the holder's PID "
                               f"{procs[w].pid}: {did(loser_text)}")
        first = Run(rc=0, output=outs[w], wall_s=wall)
        row.did = f"one deployed, one {did(loser_text)}"
    state = lab.after(first)
    rerun = lab.deploy("f7twice")
    if changed_ops(rerun.output):
        row.why_not.append("the re-run changed something: " + ", ".join(changed_ops(rerun.output)))
    row.outputs["refused"] = loser_text
    return lab.judge(row, first, state, t0=t0, before=before, rerun=rerun)


def _cases(lab, row: Row, cases, parts: dict[str, Callable]) -> list[tuple]:
    """The parts of a many-part fault that `cases` names, in the fault's own order."""
    return [part(lab, row) for name, part in parts.items() if name in cases]


def fault_8(lab, cases=("crash", "files")) -> Row:
    """The release a rollback restores is itself broken: (a) it crashes at start too, (b) its kept
    files are gone. The tool ends with a clear error, records the failed rollback, claims nothing."""
    row = Row("8", "the release a rollback restores is broken", strikes="rollback")
    outs = _cases(lab, row, cases, {"crash": _fault_8a, "files": _fault_8b})
    for label, f, r, sub in outs:
        add_case(row, sub, f"  8 {label:<40} {did(f.output)[:100]}  re-run exit {r.rc}", {label: f.output})
    row.did = did(outs[0][1].output)
    return fold(row, [sub for *_, sub in outs])


def _fault_8a(lab, row):
    """(a) every server crashes at start: the new release and the restored one."""
    t0, before = start(lab)
    lab.faults(crash_on_start="simulated CUDA error")
    first = lab.deploy("f8rollback")
    state = lab.after(first)
    for needle in ("rollback to release", "failed", "NOTHING IS SERVING"):
        if needle not in first.output:
            row.why_not.append(f"(a) the output does not say {needle!r}")
    lab.faults()
    rerun = lab.deploy("f8rollback")
    sub_a = lab.judge(Row("8a", ""), first, state, t0=t0, before=before, rerun=rerun)
    return ("restored release crashes", first, rerun, sub_a)


def _fault_8b(lab, row):
    """(b) the files of the release it would restore are gone."""
    t0, before = start(lab)
    live = serving(lab.twin).release
    lab.twin.run(f"rm -rf {RELEASES_DIR}/{live['release']:04d}/files")
    lab.faults(crash_on_start="simulated CUDA error", match_argv=_ctx("f8rollback"))
    first_b = lab.deploy("f8rollback")
    state_b = lab.after(first_b)
    for needle in ("cannot be restored", "NOTHING IS SERVING"):
        if needle not in first_b.output:
            row.why_not.append(f"(b) the output does not say {needle!r}")
    lab.faults()
    rerun_b = lab.deploy("f8rollback")
    sub_b = lab.judge(Row("8b", ""), first_b, state_b, t0=t0, before=before, rerun=rerun_b,
                      spared={live["release"]})
    return ("restored release's files removed", first_b, rerun_b, sub_b)


def _model_dir(lab: Lab, name: str = "f9weights") -> str:
    rev = REVISION_11 if name == "f11disk" else "0" * 40
    return f"/srv/dsv4deploy/models/nvidia--DeepSeek-V4-Flash-NVFP4/{rev}"


def fault_9(lab, cases=("truncated", "corrupted")) -> Row:
    """A weight shard on the host truncated, or corrupted with its size kept: the next deploy finds
    it, pushes it again and verifies every shard before the restart."""
    from ct200twin.host.checkpoint import CHECKPOINTS
    row = Row("9", "weight shard truncated / corrupted", strikes="weights (rsync source)")
    folder = _model_dir(lab)
    source = local_checkpoint_sha(CHECKPOINTS / "nvidia--DeepSeek-V4-Flash-NVFP4")
    shard = "model-00002-of-00003.safetensors"
    subs = []
    strikes = {"truncated": f"truncate -s 1000 {folder}/{shard}",
               "corrupted": f"printf 'XXXXXXXX' | dd of={folder}/{shard} bs=1 seek=4096 conv=notrunc status=none"}
    for how in cases:
        t0, before = start(lab)
        lab.twin.run(strikes[how])
        first = lab.deploy("f9weights")
        state = lab.after(first)
        rerun = lab.deploy("f9weights") if lab.rerun else None
        sub = lab.judge(Row("9", how), first, state, t0=t0, before=before, rerun=rerun)
        if checkpoint_sha(lab.twin, folder) != source:
            sub.why_not.append(f"the {how} shard is still on the host after the re-run")
            sub.recovered = False
        add_case(row, sub, f"  9 shard {how:<10} {did(first.output)[:100]}", {how: first.output})
        subs.append(sub)
    row.did = "pushed again and verified before the restart"
    return fold(row, subs)


def fault_10(lab, cases=("before", "vanish")) -> Row:
    """(a) The host shows 2 GPUs for a TP4 profile: refused before any change. (b) Six GPUs vanish
    after the deploy's preflight passed, before its restart: the server cannot start, the rollback neither; a
    clear error; with the GPUs back the same deploy converges."""
    row = Row("10", "too few GPUs / GPUs vanish mid-deploy", strikes="preflight / first operation")
    subs = _cases(lab, row, cases, {"before": _fault_10a, "vanish": _fault_10b})
    for label, f, sub in subs:
        add_case(row, sub, f"  10 {label:<36} {did(f.output)[:110]}", {label: f.output})
    row.did = "; then: ".join(did(f.output) for _, f, _ in subs)
    return fold(row, [sub for *_, sub in subs])


def _fault_10a(lab, row):
    t0, before = start(lab)
    lab.twin.set_gpus(count=2)
    first = lab.deploy("f10gpus")
    state = lab.after(first)
    if "tp_size 4 needs 4 GPUs; nvidia-smi lists 2 usable" not in first.output or changed_ops(first.output):
        row.why_not.append("(a) not refused before any change: " + did(first.output))
    lab.twin.set_gpus(reset=True)
    rerun = lab.deploy("f10gpus")
    sub_a = lab.judge(Row("10a", ""), first, state, t0=t0, before=before, rerun=rerun)
    return ("2 of 8 GPUs before the deploy", first, sub_a)


def _fault_10b(lab, row):
    t0, before = start(lab)
    # struck at the run's first operation, the preflight passed, with the deploy paused: the
    # server reads the GPUs when it starts, and a strike at the restart's own step (or at the
    # launch check, which a run skips when an earlier release passed it) could land after that
    first_b = deploy_and_strike("f10gpus-b", lambda _s, i: i == 0,
                                while_paused(lambda: lab.twin.set_gpus(count=2)), **lab.where)
    state_b = lab.after(first_b)
    if first_b.struck is None:
        row.missed(f"(b) did not strike: the run (exit {first_b.rc}) started no operation")
    lab.twin.set_gpus(reset=True)
    rerun_b = lab.deploy("f10gpus-b")
    sub_b = lab.judge(Row("10b", ""), first_b, state_b, t0=t0, before=before, rerun=rerun_b,
                      expect=["needed)"])
    return ("6 of 8 GPUs vanish after the preflight", first_b, sub_b)


def fault_11(lab) -> Row:
    """The disk fills while the weights are written (a 64 KiB tmpfs over the new model folder, mounted
    when the weights step starts, before its push): the deploy stops before any restart with the error; once space
    is freed the same deploy converges. Bounded: nothing on this machine's disk is filled."""
    row = Row("11", "disk fills during the weights step", strikes="weights")
    folder = _model_dir(lab, "f11disk")
    t0, before = start(lab)
    lab.twin.run(f"umount {folder} 2>/dev/null; rm -rf {folder}", check=False)
    pid = main_pid(lab.twin)

    # the deploy waits while the folder fills: at the step before the push, so no byte of the
    # push can land under the mount (a mount racing the push hid what it had written so far,
    # and the run then failed on a missing file, not on the full disk)
    fill = while_paused(lambda: lab.twin.run(
        f"mkdir -p {folder} && mount -t tmpfs -o size=64k,mode=0755 dsv4deploy-fault-11 {folder}"))

    step = "Weights | model dir"
    first = deploy_and_strike("f11disk", lambda s, _i: s == step, fill, **lab.where)
    state = lab.after(first)
    if cut_missed(step, first):
        row.missed(cut_missed(step, first))
    if main_pid(lab.twin) != pid:
        row.why_not.append("the server was restarted although the weights failed")
    lab.twin.run(f"umount {folder}", check=False)         # the operator frees the disk
    rerun = lab.deploy("f11disk")
    return lab.judge(row, first, state, t0=t0, before=before, rerun=rerun, expect=["No space left on device"])


def fault_12(lab, reboot: Callable[[], None], step: str = VERIFY_STEP) -> Row:
    """The host reboots in the middle of a deploy (after the switch, at the verify step): the run
    fails; once the host is back, the same deploy settles the cut release and converges."""
    row = Row("12", "host reboots mid-deploy", strikes=f"at '{step}'")
    t0, before = start(lab)
    # the deploy waits while the host reboots: the reboot waits for the twins' lock, and a deploy
    # left running passed its verify step before the host went down (the strike then proved nothing)
    first = deploy_and_strike("f12reboot", lambda s, _i: s == step, while_paused(reboot), **lab.where)
    if cut_missed(step, first):
        row.missed(cut_missed(step, first))
    elif first.rc == 0:
        row.missed(f"the reboot at {step_key(step)!r} did not cut the run: it ended with exit 0")
    state = lab.after(first)
    rerun = lab.deploy("f12reboot")
    if "interrupted" not in rerun.output:
        row.why_not.append("the re-run did not settle the release the cut run left pending")
    row.did = f"exit {first.rc}; re-run: {did(rerun.output)}"
    return lab.judge(row, first, state, t0=t0, before=before, rerun=rerun)


def fault_13(lab) -> Row:
    """The gate's wall-clock budget runs out mid-gate (budget_s 10 s, the least a profile may set, for a level that takes minutes):
    the client stops itself, the gate fails with the budget named and the release rolls back; with
    the budget back to normal (f13ok, same server) the deploy converges."""
    row = Row("13", "gate runs out of wall-clock budget", strikes="gate")
    t0, before = start(lab)
    first = lab.deploy("f13budget")
    state = lab.after(first)
    rerun = lab.deploy("f13ok") if lab.rerun else None
    return lab.judge(row, first, state, t0=t0, before=before, rerun=rerun,
                     expect=["gate budget", "exhausted during C=4", "rolled back: release"])


SET_A, SET_B = "f14set", "f14set-b"     # the replica set (nvfp4-ctx8k-dp2) and a change of it
SET_UNITS = ("sglang@0.service", "sglang@1.service", "sglang-gateway.service")


def _unit_pid(twin, unit: str) -> int:
    return int(twin.run(f"systemctl show -p MainPID --value {unit}").stdout.strip() or 0)


def _routes_to_both(twin) -> bool:
    return len(workers(twin)) == 2


def _wait(check: Callable[[], bool], within_s: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < within_s:
        if check():
            return time.monotonic() - t0
        time.sleep(0.5)
    return None


def fault_14(lab: Lab) -> Row:
    """Replicas behind the gateway: (a) the gateway is killed (SIGKILL by its PID) while the set
    serves: systemd restarts it, it re-registers both replicas, the same deploy then changes
    nothing; (b) replica 1 is killed while replica 0 is in its rolling step: systemd restarts it
    (with the template the roll already wrote), the roll goes on and ends with the new release on
    both. Then the lab's single-server baseline comes back (the set is stopped for it)."""
    row = Row("14", "replicas: gateway dies / a replica dies mid-update", strikes="serving / rolling update")
    twin = lab.twin
    _, before = start(lab)
    setup = lab.deploy(SET_A)
    if setup.rc != 0:
        row.why_not.append(f"could not deploy the replica set {SET_A}: {did(setup.output)}")
        row.outputs["setup"] = setup.output
        return row
    cases: list[Row] = []

    # (a) the gateway dies
    case = Row("14a", "gateway killed")
    t0 = time.monotonic()
    pid = _unit_pid(twin, SET_UNITS[2])
    twin.run(f"kill -KILL {pid}")
    back = _wait(lambda: _unit_pid(twin, SET_UNITS[2]) not in (0, pid) and _routes_to_both(twin), 30)
    if back is None:
        case.why_not.append("the gateway did not come back routing to both replicas within 30 s")
    rerun = lab.deploy(SET_A)
    first = Run(rc=0, output=f"gateway PID {pid} killed; back in {back or 0:.1f} s", wall_s=time.monotonic() - t0)
    lab.judge(case, first, lab.after(first), t0=t0, before=before, rerun=rerun)
    if changed_ops(rerun.output):
        case.why_not.append(f"the re-run changed {changed_ops(rerun.output)}")
    add_case(row, case, f"- 14a gateway SIGKILL: systemd restarted it in {back or 0:.1f} s; re-run: "
                        f"{did(rerun.output)}", {"14a-rerun": rerun.output})
    cases.append(case)

    # (b) replica 1 dies while replica 0 is in its rolling step
    case = Row("14b", "replica dies mid-update")
    t0 = time.monotonic()
    killed: dict = {}

    def strike(line: str) -> None:
        if "replica 0 (sglang@0.service) drained" in line and not killed:
            killed["pid"] = _unit_pid(twin, SET_UNITS[1])
            twin.run(f"kill -KILL {killed['pid']}")

    first = deploy_watching(SET_B, strike, **lab.where)
    state = lab.after(first)
    rerun = lab.deploy(SET_B)
    lab.judge(case, first, state, t0=t0, before=before, rerun=rerun)
    if not killed:
        case.missed("(b) did not strike: no replica 0 drained in the roll (no rolling step seen)")
    if first.rc != 0:
        case.why_not.append(f"the update failed: {did(first.output)}")
    add_case(row, case, f"- 14b replica 1 SIGKILL (PID {killed.get('pid', '?')}) while replica 0 rolled: "
                        f"{did(first.output)}; re-run: {did(rerun.output)}", {"14b": first.output})
    cases.append(case)
    row.did = "gateway: restarted by systemd, re-run no-op; replica: restarted by systemd, the roll completed"
    return fold(row, cases)


ALL = [fault_1, fault_2, fault_3, fault_4, fault_5, fault_6, fault_7, fault_8, fault_9, fault_10, fault_11,
       fault_12, fault_13, fault_14, fault_15]
