# dsv4deploy host program: runs on the GPU host with its own python3; standard library only.
"""The watch's hands, as root: dsv4-watch-act.service runs this when the agent (the unprivileged
watch) has left a request. Requests are data only, checked against watch.json (root's): an
action this program knows, for a target the release has. Each runs under the host's deploy lock,
the one a deploy, `make rollback` and tune take (the same mkdir and owner.json as
host/release_store.py): while another holds it, the request is dropped and said so, and the
watch decides again from new intervals. What it did, with the watch's evidence, is appended to the
live release's folder (watch-events.jsonl) and to the journal.

    python3 -I -S act.py /etc/dsv4deploy/watch/watch.json
"""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

ACTIONS = ("restart", "evict", "readmit", "degraded", "recovered")


def now_iso():
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())


def take_lock(lock, what):
    """The deploy lock for WHAT, or None when another holds it (its owner.json)."""
    os.makedirs(os.path.dirname(lock), exist_ok=True)
    try:
        os.mkdir(lock)
    except FileExistsError:
        return None
    owner = json.dumps({"controller": socket.gethostname(), "pid": os.getpid(), "started": now_iso(), "what": what},
                       sort_keys=True)
    with open(os.path.join(lock, "owner.json"), "w") as f:
        f.write(owner + "\n")
    return owner


def give_back(lock, owner):
    """Remove the lock if it is still OWNER's, under the flock a takeover uses."""
    check = '[ "$(cat %s/owner.json 2>/dev/null)" = "$1" ] && rm -rf %s; true' % (lock, lock)
    subprocess.run(["flock", lock + ".flock", "sh", "-c", check, "sh", owner], timeout=60)


KEY = {}    # the servers' API key and the gateway's control-plane key (read once, as root)


def http(method, url, body=None, timeout=10.0, key="key"):
    req = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None, method=method)
    req.add_header("Content-Type", "application/json")
    if KEY.get(key):
        req.add_header("Authorization", "Bearer " + KEY[key])
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def healthy_within(url, budget_s):
    end = time.monotonic() + budget_s
    while time.monotonic() < end:
        try:
            if http("GET", url + "/health", timeout=5)[0] == 200:
                return True
        except OSError:
            pass
        time.sleep(1)
    return False


def restart(cfg, t):
    # as a rollback does: a unit that hit its start limit would refuse the restart
    subprocess.run(["systemctl", "reset-failed", t["unit"]], timeout=60)
    subprocess.run(["systemctl", "restart", t["unit"]], check=True, timeout=cfg["restart_timeout_s"])
    if not healthy_within(t["url"], cfg["restart_timeout_s"]):
        return "restarted %s; /health not 200 within %d s" % (t["unit"], cfg["restart_timeout_s"])
    return "restarted %s; /health 200 again" % t["unit"]


def workers(gateway):
    status, body = http("GET", gateway + "/workers", key="control")
    doc = json.loads(body) if status == 200 else {}
    return doc.get("workers", []) if isinstance(doc, dict) else []


def evict(cfg, t):
    """Remove T's URL from the gateway (smg: DELETE /workers/{id}), and wait until it is gone."""
    gone = [w for w in workers(cfg["gateway"]) if w.get("url", "").rstrip("/") == t["url"]]
    for w in gone:
        http("DELETE", "%s/workers/%s" % (cfg["gateway"], w["id"]), key="control")
    for _ in range(30):
        if not any(w.get("url", "").rstrip("/") == t["url"] for w in workers(cfg["gateway"])):
            return "removed %s from the gateway" % t["url"]
        time.sleep(0.5)
    return "asked the gateway to remove %s; still listed after 15 s" % t["url"]


def readmit(cfg, t):
    if any(w.get("url", "").rstrip("/") == t["url"] for w in workers(cfg["gateway"])):
        return "%s is in the gateway already" % t["url"]
    # the worker's (inference) key travels in the body, as smg requires: without it smg registers
    # the replica keyless and every request it routes there fails 401 (gateway/model.py add_worker)
    spec = {"url": t["url"], **({"api_key": KEY["key"]} if KEY.get("key") else {})}
    status, _ = http("POST", cfg["gateway"] + "/workers", spec, key="control")
    return "added %s to the gateway again (HTTP %d)" % (t["url"], status)


def carry_out(cfg, req):
    """One checked request: what was done, in words."""
    targets = {t["name"]: t for t in cfg["targets"]}
    t = targets[req["target"]]
    if req["action"] == "restart":
        return restart(cfg, t)
    if req["action"] == "evict":
        return evict(cfg, t) if cfg.get("gateway") else "no gateway: marked degraded only"
    if req["action"] == "readmit":
        return readmit(cfg, t) if cfg.get("gateway") else "no gateway: marked healthy"
    return "marked " + req["action"]


def checked(cfg, path):
    """The request at PATH when it is well-formed and for this release, else None."""
    try:    # data another account wrote: never followed through a link
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW)) as f:
            req = json.load(f)
    except (OSError, ValueError):
        return None
    names = {t["name"] for t in cfg["targets"]}
    if not isinstance(req, dict) or req.get("action") not in ACTIONS or req.get("target") not in names \
            or req.get("release") != cfg["release"]:
        return None
    return req


def record(cfg, doc):
    folder = os.path.join(cfg["releases_dir"], "%04d" % cfg["release"])
    if os.path.isdir(folder):
        with open(os.path.join(folder, "watch-events.jsonl"), "a") as f:
            f.write(json.dumps(doc, sort_keys=True) + "\n")


def main(argv):
    with open(argv[1]) as f:
        cfg = json.load(f)
    for name, path in (("key", cfg.get("api_key_file")), ("control", cfg.get("control_key_file"))):
        if path and os.path.isfile(path):
            with open(path) as f:
                KEY[name] = f.read().strip()
    folder = cfg["requests_dir"]
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        req = checked(cfg, path)
        os.unlink(path)
        if req is None:
            print("watch act: ignored %s: not a request for release %04d" % (name, cfg["release"]))
            continue
        what = "watch %s %s" % (req["action"], req["target"])
        owner = take_lock(cfg["lock"], what)
        if owner is None:
            print("watch act: %s not done: another run holds the deploy lock" % what)
            continue
        try:
            try:
                done = carry_out(cfg, req)
            except (OSError, subprocess.SubprocessError, ValueError) as exc:
                done = "failed: %s" % exc
            doc = {"at": now_iso(), "action": req["action"], "target": req["target"], "reason": req["reason"],
                   "done": done, "evidence": req.get("evidence", []), "release": cfg["release"],
                   "decided_at": req.get("t")}
            record(cfg, doc)
            print("watch act: %s: %s (%s)" % (what, done, req["reason"]))
        finally:
            give_back(cfg["lock"], owner)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
