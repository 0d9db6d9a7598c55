"""The watch's decisions on the twin: a matrix of conditions, each from a healthy deployed release,
each judged right or wrong, with the time from the fault to the watch's decision.

    .venv/bin/python -m ct200twin up --fleet watch --hosts 1
    DSV4_PROFILES_DIR=... DSV4_SIM_FLEET=watch .venv/bin/pyinfra -y inventory/fleet-sim.py deploy/serve.py \\
        --data profile=nvfp4-ctx8k-watch          # nvfp4-ctx8k with `watch: {interval_s: 3, ...}`
    .venv/bin/python bench/watch.py [--fleet watch] [--healthy-intervals 1200]   # about 65 minutes

(bench/watch.py --profiles-dir DIR writes that profile into DIR: see WATCH_PROFILE.) Faults are
switched on through the twin's own files (ct200twin/host/sick.py); results are read from the
twin's root file system on this machine, so nothing here needs the SSH link once a fault is on
(the "control node gone" condition stops the twin's sshd as well). Last line:
`watch: M/M decided right, false_actions=N, detect_s_max=X`.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ct200twin.host import sick  # noqa: E402
from ct200twin.host.machines import SimHost  # noqa: E402

WATCH_BLOCK = """watch:
  interval_s: 3
  failure_limit: 3
  restart_cooldown_s: 120
  probe: {requests: 2, input_len: 16, output_len: 16, timeout_s: 2}
"""
# The watch's baseline is the gate's one-client level, and only that: one short level is enough
# (nvfp4-ctx8k's three levels took about a minute of each deploy on the twin).
WATCH_GATE = """gate:
  warmup_requests: 1
  levels:
    - {concurrency: 1, num_prompts: 4, input_len: 64, output_len: 32, min_output_throughput: 10}
"""
WATCH_PROFILE = ("extends: nvfp4-ctx8k\ndescription: nvfp4-ctx8k with the watch every 3 s, for the twin only "
                 "(bench/watch.py, tests/test_watch_twin.py)\n" + WATCH_BLOCK + WATCH_GATE)
WATCH_DP2_PROFILE = ("extends: nvfp4-ctx8k-dp2\ndescription: nvfp4-ctx8k-dp2 with the watch every 3 s, for the twin "
                     "only (bench/watch.py --replicas)\n" + WATCH_BLOCK)
ACTIONS = ("restart", "evict", "readmit", "degraded", "recovered")


class Twin:
    """The watched twin, read from its root file system here; faults through sick.py."""

    def __init__(self, fleet: str):
        self.host = SimHost(1, fleet)
        self.root = self.host.root
        cfg = json.loads((self.root / "etc/dsv4deploy/watch/watch.json").read_text())
        self.cfg = cfg
        self.interval = cfg["settings"]["interval_s"]
        self.limit = cfg["settings"]["failure_limit"]
        self.events = self.root / f"var/lib/dsv4deploy/releases/{cfg['release']:04d}/watch-events.jsonl"

    def state(self) -> dict:
        try:
            return json.loads((self.root / "var/lib/dsv4-watch/state.json").read_text())
        except (OSError, ValueError):
            return {}

    def actions_since(self, t0: float) -> list[dict]:
        try:
            lines = self.events.read_text().splitlines()
        except OSError:
            return []
        return [e for e in map(json.loads, lines) if (e.get("decided_at") or 0) >= t0]

    def fresh_watch(self) -> None:
        """Heal, forget the watch's counts (a new start for each condition), wait for a pass."""
        sick.heal(self.host)
        self.host.run("systemctl stop dsv4-watch.timer dsv4-watch.service; rm -f /var/lib/dsv4-watch/state.json "
                      "/var/lib/dsv4-watch/requests/*; systemctl is-active -q sglang || { systemctl reset-failed sglang; systemctl restart sglang; }; "
                      "systemctl start dsv4-watch.timer")
        end = time.time() + 60
        while time.time() < end:
            targets = self.state().get("targets") or {}
            if len(targets) == len(self.cfg["targets"]) and all(
                    (t.get("history") or [{}])[-1].get("verdict") == "passed" for t in targets.values()):
                return
            time.sleep(0.5)
        raise SystemExit("the watch did not pass an interval within 60 s of a healthy start")


LOAD = r"""
import json, sys, threading, time, urllib.request
url, clients, seconds, key_file = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
key = open(key_file).read().strip() if key_file != "-" else None
done, failed, end = [], [], time.time() + seconds
def user(n):
    while time.time() < end:
        n += 1
        body = json.dumps({"input_ids": list(range(100, 164)), "stream": True,
                           "sampling_params": {"max_new_tokens": 16 + n % 48, "ignore_eos": True}}).encode()
        req = urllib.request.Request(url + "/generate", data=body, method="POST",
                                     headers={"Content-Type": "application/json", **({"Authorization": "Bearer " + key} if key else {})})
        try:
            text = urllib.request.urlopen(req, timeout=60).read().decode()
            (done if '"error"' not in text and "[DONE]" in text else failed).append(1)
        except OSError:
            failed.append(1)
        time.sleep((n % 5) * 0.3)       # users come and go: 1 to CLIENTS running
threads = [threading.Thread(target=user, args=(i,)) for i in range(clients)]
[t.start() for t in threads]; [t.join() for t in threads]
print(json.dumps({"completed": len(done), "failed": len(failed)}))
"""


class Users:
    """Users' streaming traffic from inside the twin (its server listens on the twin's loopback)."""

    def __init__(self, tw: "Twin", url: str, clients: int, seconds: float):
        self.tw, self.out = tw, f"/tmp/bench-watch-load-{int(time.time())}.json"
        key = tw.cfg.get("api_key_file") or "-"
        tw.host.write_file("/tmp/bench-watch-load.py", LOAD)
        tw.host.run(f"nohup python3 -I /tmp/bench-watch-load.py {url} {clients} {seconds} {key} > {self.out} "
                    "2>&1 < /dev/null &")

    def result(self, wait_s: float = 120) -> dict:
        end = time.time() + wait_s
        while time.time() < end:
            out = self.tw.host.run(f"cat {self.out}", check=False).stdout.strip()
            if out.startswith("{"):
                return json.loads(out)
            time.sleep(1)
        return {"completed": 0, "failed": -1}


def run_condition(tw: Twin, name: str, expect: str | None, inject, *, watch_s: float | None = None,
                  after=None, onset_s: float = 0.0) -> dict:
    """Fault on (INJECT), wait for the first action (or WATCH_S without one), heal. EXPECT: the
    action that is right (None: no action is). ONSET_S: the fault shows this long after INJECT
    (errors_after_s): the time to detect counts from then."""
    tw.fresh_watch()
    t0 = time.time()
    inject()
    budget = watch_s or (tw.limit + 3) * tw.interval + 10
    got = []
    while time.time() - t0 < budget:
        got = tw.actions_since(t0)
        if got:
            break
        time.sleep(0.25)
    if after:
        after()
    sick.heal(tw.host)
    first = got[0] if got else None
    decision = first["action"] if first else "none"
    detect = round(first["decided_at"] - t0 - onset_s, 1) if first else None
    right = decision == (expect or "none")
    row = {"condition": name, "expected": expect or "none", "decision": decision, "detect_s": detect,
           "right": right, "false_action": bool(first) and not right,
           "evidence": "; ".join((first or {}).get("reason", "").split("; ")[:2])[:140]}
    print(f"{name:<34} expected {row['expected']:<9} decided {decision:<9} "
          f"detect {('%.1f s' % detect) if detect is not None else '-':>7}  {'RIGHT' if right else 'WRONG'}  "
          f"{row['evidence']}", flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fleet", default="watch")
    ap.add_argument("--healthy-intervals", type=int, default=1200,
                    help="intervals of the healthy condition under varying load (1200: an hour at 3 s; "
                         "60 for a quick run)")
    ap.add_argument("--replicas", action="store_true",
                    help="the replica-set condition only (after a deploy of nvfp4-ctx8k-dp2-watch)")
    ap.add_argument("--profiles-dir", help="write the twin's watch profile into this folder (a copy of profiles/) and exit")
    args = ap.parse_args()
    if args.profiles_dir:
        d = Path(args.profiles_dir)
        d.mkdir(parents=True, exist_ok=True)
        for p in (Path(__file__).resolve().parent.parent / "profiles").glob("*.yaml"):
            shutil.copy(p, d / p.name)
        (d / "nvfp4-ctx8k-watch.yaml").write_text(WATCH_PROFILE)
        (d / "nvfp4-ctx8k-dp2-watch.yaml").write_text(WATCH_DP2_PROFILE)
        return 0
    tw = Twin(args.fleet)
    t = tw.cfg["targets"][0]
    print(f"watch every {tw.interval} s, failure limit {tw.limit}; release {tw.cfg['release']:04d} "
          f"({tw.cfg['profile']}); bound: failure limit + 1 interval = {(tw.limit + 1) * tw.interval} s", flush=True)
    rows = []
    if args.replicas:
        rows.append(replica_condition(tw))
        return summary(rows)

    users: list[Users] = []
    healthy_s = args.healthy_intervals * tw.interval
    rows.append(run_condition(tw, f"healthy, users' load, {args.healthy_intervals} intervals", None,
                              lambda: users.append(Users(tw, t["url"], 8, healthy_s)), watch_s=healthy_s))
    got = users[0].result()
    print(f"  users' requests meanwhile: {got['completed']} completed, {got['failed']} failed", flush=True)
    print("  intervals meanwhile: " + tally(tw, time.time() - healthy_s - 5), flush=True)
    host = tw.host
    rows.append(run_condition(tw, "40% slowdown", "restart", lambda: sick.server(host, slowdown=1.67)))
    rows.append(run_condition(tw, "hang behind a healthy /health", "restart", lambda: sick.server(host, hang=True)))
    rows.append(run_condition(tw, "errors 2 s after the fault", "restart", lambda: sick.server(host, errors_after_s=2),
                              onset_s=2))
    rows.append(run_condition(tw, "XID 79 (fallen off the bus)", "degraded", lambda: sick.xid(host, 1, 79)))
    rows.append(run_condition(tw, "XID 13 (an application's)", None, lambda: sick.xid(host, 1, 13),
                              watch_s=(tw.limit + 2) * tw.interval))
    rows.append(run_condition(tw, "uncorrectable ECC", "degraded", lambda: sick.gpu(host, 2, ecc_uncorrectable=3)))
    rows.append(run_condition(tw, "row remap pending", "degraded", lambda: sick.gpu(host, 0, remap_pending=True)))
    rows.append(run_condition(tw, "thermal slowdown", "degraded",
                              lambda: sick.gpu(host, 3, clock_events=["hw_thermal_slowdown"])))
    rows.append(run_condition(tw, "PCIe link x8 (recorded x16)", "degraded", lambda: sick.gpu(host, 1, pcie_width=8)))
    rows.append(run_condition(tw, "GPU gone", "degraded", lambda: sick.gpu(host, 2, gone=True)))
    rows.append(run_condition(tw, "foreign process 20 GiB", "degraded", lambda: sick.foreign(host, 0, 20000)))
    rows.append(run_condition(tw, "fault on a GPU the release does not use", None, lambda: sick.xid(host, 6, 79),
                              watch_s=(tw.limit + 2) * tw.interval))
    lock = "/var/lib/dsv4deploy/deploy.lock"
    rows.append(run_condition(
        tw, "slowdown during a deploy (lock held)", None,
        lambda: (host.run(f"mkdir {lock} && echo '{{\"what\": \"bench/watch.py: a deploy\"}}' > {lock}/owner.json"),
                 sick.server(host, slowdown=1.67)),
        watch_s=(tw.limit + 2) * tw.interval, after=lambda: host.run(f"rm -rf {lock}")))
    rows.append(run_condition(
        tw, "control node gone (sshd stopped)", "restart",
        lambda: (host.run("systemd-run -q --on-active=45 systemctl start ssh.service; systemctl stop ssh.service",
                          check=False, timeout=20), _sick_offline(tw, hang=True)),
        after=lambda: _wait_ssh(host)))
    return summary(rows)


def replica_condition(tw: Twin) -> dict:
    """A GPU fault on replica 1 of a replica set under users' streaming load through the gateway:
    replica 1 leaves the gateway, replica 0 serves on, no user's request fails; healed, it returns."""
    tw.fresh_watch()
    users = Users(tw, tw.cfg["gateway"], 4, 75)
    time.sleep(2)
    row = run_condition(tw, "GPU fault on replica 1, streaming load", "evict",
                        lambda: sick.gpu(tw.host, 5, ecc_uncorrectable=1))
    t_heal = time.time()
    back = None
    while time.time() - t_heal < 60 and back is None:
        back = next((e for e in tw.actions_since(t_heal) if e["action"] == "readmit"), None)
        time.sleep(0.5)
    got = users.result()
    print(f"  replica 1 back in the gateway: {'after %.1f s' % (back['decided_at'] - t_heal) if back else 'NO'}; "
          f"users' requests: {got['completed']} completed, {got['failed']} failed", flush=True)
    row["right"] = row["right"] and back is not None and got["failed"] == 0 and got["completed"] > 0
    row["users"] = got
    return row


def tally(tw: Twin, since: float) -> str:
    """The watch's verdicts since SINCE, from its journal lines (`watch server: passed; ...`): how
    many of each, and the longest run of failed ones (the failure limit's margin)."""
    out = tw.host.run(f"journalctl -u dsv4-watch.service --since @{int(since)} -o cat --no-pager", check=False).stdout
    verdicts = [m.group(1) for m in map(re.compile(r"^watch \S+: (passed|failed|inconclusive)").match, out.splitlines()) if m]
    longest = run = 0
    for v in verdicts:
        run = run + 1 if v == "failed" else 0 if v == "passed" else run
        longest = max(longest, run)
    return (f"{len(verdicts)} judged: {verdicts.count('passed')} passed, {verdicts.count('inconclusive')} "
            f"inconclusive, {verdicts.count('failed')} failed (longest run of failed: {longest}, limit {tw.limit})")


def summary(rows: list[dict]) -> int:
    right = sum(r["right"] for r in rows)
    false_actions = sum(r["false_action"] for r in rows)
    detect = max((r["detect_s"] for r in rows if r["detect_s"] is not None), default=0.0)
    print(f"watch: {right}/{len(rows)} decided right, false_actions={false_actions}, detect_s_max={detect:.1f}")
    return 0 if right == len(rows) and not false_actions else 1


def _sick_offline(tw: Twin, **doc) -> None:
    """The server's sickness written into the twin's root here: no SSH needed."""
    path = tw.root / "etc/dsv4deploy-twin/sick.json"
    path.write_text(json.dumps(doc) + "\n")
    path.chmod(0o644)


def _wait_ssh(host) -> None:
    end = time.time() + 90
    while time.time() < end and not host.ssh_ok(timeout=5):
        time.sleep(2)


if __name__ == "__main__":
    sys.exit(main())
