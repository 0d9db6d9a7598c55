"""Fault 15 (issue 40): a replica set converges to the release that serves. Six cases on a set
of three TP2 replicas behind smg (ct200twin/faultlab/variants.py F15_*), each ending with the
set matching its release: the instances that run are the release's, the gateway lists them and
runs its files, and nothing is lost.

(a) an untouched replica crashing mid-roll: replica 2 is SIGKILLed while replica 0 is in its
    rolling step; systemd restarts it from the files the roll wrote (no gate passed on it), and
    the roll takes it out of the gateway until its own step;
(b) count 3 -> 2: the set rolls, replica 2 is drained, stopped and disabled, its GPUs free;
(c) a rollback across an smg change (its routing policy): the gateway restarts on the restored files;
(d) a cut between a gateway's files and its restart (the deploy is SIGKILLed once the last
    replica switched): the re-run restarts the gateway on the files in place;
(e) a tampered kept profile (a shell word in a kept release's service.user): the rollback to
    that release is refused, nothing changed;
(f) an instance started by hand and a replica restarted from other files than those in place:
    `make plan` names both, the next run stops the one and rolls the other.

They run in the order a, b, f, d, c, e, each from the set the one before left: (c) rolls back from
the smg change that (d)'s re-run deployed (no deploy of its own, a roll of the whole set), and (e)
is refused the way back to it.
"""

from __future__ import annotations

import json
import time

from ct200twin.faultlab.lab import Lab, start
from ct200twin.faultlab.reading import RELEASES_DIR, releases
from ct200twin.faultlab.recovered import passed
from ct200twin.faultlab.rows import Row, add_case, did, fold
from ct200twin.faultlab.tool import PYINFRA, REPO, Run, deploy_and_strike, deploy_watching, kill, run

F15_SET3, F15_SET3B, F15_SET2, F15_POLICY = "f15set3", "f15set3-b", "f15set2", "f15set2-p"
GATEWAY_UNIT = "sglang-gateway.service"
GATEWAY = "http://127.0.0.1:30000"
API_KEY = "/etc/dsv4deploy/secrets/sglang-api-key"
CONTROL_KEY = "/etc/dsv4deploy/secrets/sglang-gateway-control-key"     # smg's /workers, where one is kept


def _pid(twin, unit: str) -> int:
    return int(twin.run(f"systemctl show -p MainPID --value {unit}").stdout.strip() or 0)


def workers(twin) -> list[str]:
    """The URLs the gateway lists as ready (none: it does not answer)."""
    out = twin.run(f"k={CONTROL_KEY}; [ -s $k ] || k={API_KEY}; sed 's/^/Authorization: Bearer /' $k | "
                   f"curl -s --max-time 5 -H @- {GATEWAY}/workers", check=False).stdout
    try:
        return sorted(w["url"] for w in json.loads(out)["workers"] if w["status"] == "ready")
    except (ValueError, KeyError, TypeError):
        return []


def active_instances(twin) -> list[str]:
    out = twin.run("systemctl list-units --plain --no-legend --type=service --state=active 'sglang@*' "
                   "| cut -d' ' -f1", check=False).stdout
    return sorted(out.split())


def gateway_policy(twin) -> str | None:
    """The routing policy the running gateway started with: its unit's, when its process started
    after the unit file last changed (smg renames its process: its argv cannot be read back);
    "older files" when it started before."""
    unit = f"/etc/systemd/system/{GATEWAY_UNIT}"
    out = twin.run(f"systemctl show -p ExecMainStartTimestamp --value --timestamp=unix {GATEWAY_UNIT} | tr -d @; "
                   f"stat -c %Z {unit}; grep -o -- '--policy [a-z_]*' {unit} | head -1", check=False).stdout.split()
    if len(out) < 4 or not (out[0].isdigit() and out[1].isdigit()):
        return None
    return out[3] if int(out[0]) >= int(out[1]) else "older files"


def set_problems(twin, count: int, policy: str | None = None) -> list[str]:
    """How the set differs from a release of COUNT replicas (and POLICY at the gateway)."""
    want = [f"sglang@{i}.service" for i in range(count)]
    urls = [f"http://127.0.0.1:{30001 + i}" for i in range(count)]
    out = []
    if active_instances(twin) != want:
        out.append(f"instances running {active_instances(twin)}, the release runs {want}")
    if workers(twin) != urls:
        out.append(f"the gateway routes to {workers(twin)}, the release's replicas are {urls}")
    if policy and gateway_policy(twin) != policy:
        out.append(f"the gateway runs --policy {gateway_policy(twin)}, the release's is {policy}")
    return out


def set_status(lab: Lab) -> tuple[dict | None, str]:
    """`dsv4deploy status --json`'s comparison of the running set with the release that serves
    (release/running_set.py; None: it showed none), and its whole output."""
    out = run([str(REPO / ".venv" / "bin" / "dsv4deploy"), "status", "--inventory", lab.inventory, "--json"],
              env=lab.env, timeout=120)
    try:
        return json.loads(out.stdout)["hosts"][0].get("set"), out.stdout + out.stderr
    except (ValueError, KeyError, IndexError, TypeError):
        return None, out.stdout + out.stderr


def status_problems(lab: Lab, row: Row, key: str, expected: list[str]) -> list[str]:
    """What `dsv4deploy status` gets wrong about the set now: each of EXPECTED (parts of its
    differences; none: it must match its release) it does not say, or a difference it says
    that was not expected. Its output goes to ROW's outputs under KEY."""
    view, text = set_status(lab)
    row.outputs[key] = text
    if view is None:
        return [f"dsv4deploy status shows no comparison of the set with its release: {text[-300:]}"]
    said = view.get("differences") or ([view["error"]] if "error" in view else [])
    missing = [e for e in expected if not any(e in d for d in said)]
    extra = [d for d in said if not any(e in d for e in expected)]
    return ([f"dsv4deploy status does not say {e!r} (it says {said})" for e in missing]
            + [f"dsv4deploy status says {d!r}" for d in extra])


def _rollback(lab: Lab, *extra: str) -> Run:
    t0 = time.monotonic()
    out = run([PYINFRA, "-y", lab.inventory, "deploy/rollback.py", "--data", "health_poll_s=0.5", *extra],
              env=lab.env)
    return Run(rc=out.returncode, output=out.stdout + out.stderr, wall_s=time.monotonic() - t0)


def _case(row: Row, lab: Lab, name: str, line: str, first: Run, rerun: Run | None, problems: list[str],
          before: dict, t0: float) -> Row:
    case = Row(name, line)
    case.why_not += problems
    lab.judge(case, first, lab.after(first), t0=t0, before=before, rerun=rerun)
    add_case(row, case, f"- {name} {line}: {did(first.output)}"
                        + (f"; re-run: {did(rerun.output)}" if rerun else ""), {name: first.output})
    return case


def crash_mid_roll(lab: Lab, row: Row, before: dict) -> Row:
    """(a): 3 replicas roll to F15_SET3B; replica 2 dies while replica 0 rolls."""
    twin, t0, killed = lab.twin, time.monotonic(), {}

    def strike(line: str) -> None:
        if "replica 0 (sglang@0.service) drained" in line and not killed:
            killed["pid"] = _pid(twin, "sglang@2.service")
            twin.run(f"kill -KILL {killed['pid']}")

    first = deploy_watching(F15_SET3B, strike, **lab.where)
    problems = []
    if "replica 2 (sglang@2.service) taken out of sglang-gateway.service: it restarted" not in first.output:
        problems.append("the replica restarted from ungated files was not taken out of the gateway")
    if first.rc != 0:
        problems.append(f"the roll failed: {did(first.output)}")
    rec = releases(twin)[-1]
    if [r["status"] for r in rec.get("replicas") or []] != ["switched"] * 3:
        problems.append(f"release {rec['release']:04d}'s replicas: {rec.get('replicas')}")
    case = _case(row, lab, "15a", "replica 2 SIGKILLed while replica 0 rolls", first, None,
                 problems + set_problems(twin, 3), before, t0)
    if not killed:
        case.missed("(a) did not strike: no 'replica 0 ... drained' line in the roll")
        row.not_struck += case.not_struck
    return case


def shrink(lab: Lab, row: Row, before: dict) -> Row:
    """(b): count 3 -> 2 rolls; replica 2 leaves."""
    twin, t0 = lab.twin, time.monotonic()
    first = lab.deploy(F15_SET2)
    problems = []
    if "stopped sglang@2.service: not in the new release's set; GPUs 4,5 free" not in first.output:
        problems.append("replica 2 was not stopped with its GPUs checked free")
    if "rolling update of 2 replicas" not in first.output:
        problems.append("the shrink did not roll")
    state = twin.run("systemctl is-enabled sglang@2.service", check=False).stdout.strip()
    if state != "disabled":
        problems.append(f"sglang@2.service is {state} (it would start again at boot)")
    rerun = lab.deploy(F15_SET2)
    if "nothing to change" not in rerun.output:
        problems.append(f"the re-run did not settle: {did(rerun.output)}")
    return _case(row, lab, "15b", "count 3 -> 2 (TP2)", first, rerun, problems + set_problems(twin, 2), before, t0)


def drifted(lab: Lab, row: Row, before: dict) -> Row:
    """(f): with F15_SET2 serving and its files in place, sglang@2 is started by hand (its files
    are still there) and sglang@1 is restarted from another argv (the template changed for its
    restart, then put back): `make plan` names both, the re-run stops the one and rolls the other."""
    twin, t0 = lab.twin, time.monotonic()
    unit = "/etc/systemd/system/sglang@.service"
    twin.run(f"cp -a {unit} /root/h10-unit && sed -i 's/--context-length 3840/--context-length 3584/' {unit} && "
             "systemctl daemon-reload && systemctl restart sglang@1.service && "
             f"cp -a /root/h10-unit {unit} && rm /root/h10-unit && systemctl daemon-reload && "
             "systemctl start sglang@2.service")
    problems = []
    if active_instances(twin) != ["sglang@0.service", "sglang@1.service", "sglang@2.service"]:
        problems.append(f"the strike did not leave sglang@2 running: {active_instances(twin)}")
    problems += status_problems(lab, row, "15f-status", [
        "sglang@2.service runs and is not one of the release's 2 replicas",
        "replica 1 (sglang@1.service) runs other files than the release's"])
    plan = lab.deploy(F15_SET2, dry=True)
    said = " | ".join(line for line in plan.output.splitlines() if "plan:" in line)
    for needle in ("sglang@2.service runs and is not one of its 2 replicas",
                   "replica 1 (sglang@1.service) runs other files"):
        if needle not in said:
            problems.append(f"make plan does not say {needle!r}: {said[:300]}")
    first = lab.deploy(F15_SET2)
    for needle in ("stopped sglang@2.service", "replica 1 (sglang@1.service) switched"):
        if needle not in first.output:
            problems.append(f"the re-run does not say {needle!r}")
    argv = twin.run("tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value sglang@1.service)/cmdline",
                    check=False).stdout
    problems += status_problems(lab, row, "15f-status-after", [])
    if "--context-length 3840" not in argv:
        problems.append("sglang@1 does not run the release's argv after the re-run")
    case = _case(row, lab, "15f", "an instance started by hand, a replica restarted from other files", first, None,
                 problems + set_problems(twin, 2), before, t0)
    row.outputs["15f-plan"] = plan.output
    return case


def rollback_across_smg(lab: Lab, row: Row, before: dict) -> Row:
    """(c): `make rollback` from F15_POLICY (another routing policy) serving, as (d)'s re-run left
    it (deployed here first when it is not), to the release before it."""
    twin, t0 = lab.twin, time.monotonic()
    problems = []
    last = releases(twin)[-1]
    if (last["profile"], last["status"], gateway_policy(twin)) != (F15_POLICY, "deployed", "random"):
        changed = lab.deploy(F15_POLICY)
        if changed.rc != 0 or gateway_policy(twin) != "random":
            problems.append(f"the policy change did not deploy: {did(changed.output)}, "
                            f"gateway --policy {gateway_policy(twin)}")
    first = _rollback(lab)
    if "restarted sglang-gateway.service: it ran other gateway files than the restored release's" not in first.output:
        problems.append("the rollback did not restart the gateway on the restored files")
    return _case(row, lab, "15c", "rollback across a change of smg's policy", first, None,
                 problems + set_problems(twin, 2, "round_robin"), before, t0)


def cut_before_gateway_restart(lab: Lab, row: Row, before: dict) -> Row:
    """(d): F15_POLICY's deploy SIGKILLed once replica 1 switched (the gateway restarts after)."""
    twin, t0, cut = lab.twin, time.monotonic(), {}
    gw = _pid(twin, GATEWAY_UNIT)

    def strike(line: str) -> None:
        if "replica 1 (sglang@1.service) switched" in line and "at" not in cut:
            cut["at"] = line.strip()
            kill(cut["p"])

    def on_start(p, _step=""):
        cut["p"] = p

    first = deploy_and_strike(F15_POLICY, lambda step, i: i == 0, on_start, on_line=strike, **lab.where)
    problems = []
    if _pid(twin, GATEWAY_UNIT) != gw:
        problems.append("the gateway restarted before the cut: nothing to converge")
    plan = lab.deploy(F15_POLICY, dry=True)         # `make plan`: it says the gateway restarts
    said = [line for line in plan.output.splitlines() if "plan:" in line]
    if not any("restart sglang-gateway.service" in line for line in said):
        problems.append(f"make plan after the cut does not say the gateway restarts: {' | '.join(said)[:300]}")
    rerun = lab.deploy(F15_POLICY)
    if "restarted sglang-gateway.service" not in rerun.output:
        problems.append(f"the re-run did not restart the gateway: {did(rerun.output)}")
    case = _case(row, lab, "15d", "cut between the gateway's files and its restart", first, rerun,
                 problems + set_problems(twin, 2, "random"), before, t0)
    row.outputs["15d-plan"] = plan.output
    if "at" not in cut:
        case.missed("(d) did not strike: no 'replica 1 ... switched' line")
        row.not_struck += case.not_struck
    return case


def tampered_kept_profile(lab: Lab, row: Row, before: dict) -> Row:
    """(e): the release a rollback would restore (F15_POLICY's, which (c) rolled back from) has a
    shell word in its kept service.user."""
    twin, t0 = lab.twin, time.monotonic()
    recs = releases(twin)
    by_number = {r["release"]: r for r in recs}
    target = [r for r in recs[:-1] if r["profile"] == F15_POLICY and passed(r, by_number)][-1]
    kept = f"{RELEASES_DIR}/{target['release']:04d}/profile.json"
    twin.run(f"cp -a {kept} {kept}.h10 && python3 -c \"import json,sys; p=sys.argv[1]; d=json.load(open(p)); "
             f"d['data']['service']['user']='sglang; touch /tmp/pwned'; json.dump(d, open(p, 'w'))\" {kept}")
    pids = {u: _pid(twin, u) for u in ("sglang@0.service", "sglang@1.service", GATEWAY_UNIT)}
    try:
        first = _rollback(lab, "--data", f"to={target['release']}")
    finally:
        twin.run(f"mv {kept}.h10 {kept}", check=False)
    problems = []
    if first.rc == 0 or "holds a value no profile may" not in first.output:
        problems.append(f"the rollback from a tampered profile was not refused: {did(first.output)}")
    if twin.run("test -e /tmp/pwned", check=False).returncode == 0:
        problems.append("the tampered value reached a shell")
    if {u: _pid(twin, u) for u in pids} != pids:
        problems.append("a unit restarted: the refusal changed something")
    first = Run(rc=0, output=first.output, wall_s=first.wall_s)     # refused as it must be: judged as nothing done
    return _case(row, lab, "15e", "tampered kept profile.json, then a rollback to it", first, None,
                 problems + set_problems(twin, 2, "round_robin"), before, t0)


def fault_15(lab: Lab) -> Row:
    row = Row("15", "replica sets converge to the release",
              strikes="roll / shrink / drift / rollback / cut / kept file")
    _, before = start(lab)
    lab.twin.run("systemctl disable --now sglang.service 2>/dev/null; true", check=False)
    setup = lab.deploy(F15_SET3)
    if setup.rc != 0:
        row.why_not.append(f"could not deploy the replica set {F15_SET3}: {did(setup.output)}")
        row.outputs["setup"] = setup.output
        return row
    cases = [crash_mid_roll(lab, row, before), shrink(lab, row, before), drifted(lab, row, before),
             cut_before_gateway_restart(lab, row, before), rollback_across_smg(lab, row, before),
             tampered_kept_profile(lab, row, before)]
    row.did = ("crashed replica out of the gateway until rolled; surplus drained, stopped, GPUs free; gateway "
               "restarted on restored or cut-off files; tampered kept profile refused")
    return fold(row, cases)
