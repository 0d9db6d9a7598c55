# dsv4deploy host program: runs on the GPU host with its own python3; standard library only.
"""One interval of the watch, on the host: run by dsv4-watch.service (a oneshot the timer starts)
as the watch's own unprivileged account. It reads its settings (watch.json, written by the deploy),
measures the server and the GPUs, decides with decide.py (loaded by path from its own folder),
then writes the state file, the node_exporter textfile .prom file (in its own folder: the deploy
links it into node_exporter's) and one journal line per target; an action goes as a request file
to dsv4-watch-act (act.py, root, under the deploy lock).

    python3 -I -S agent.py /etc/dsv4deploy/watch/watch.json
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def load_decide():
    """decide.py from this program's own folder (root's, checked by hash at deploy)."""
    spec = importlib.util.spec_from_file_location("dsv4_watch_decide", os.path.join(HERE, "decide.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def api_key(folder):
    """The server's API key, from the credential systemd hands the unit (LoadCredential=) in
    FOLDER ($CREDENTIALS_DIRECTORY)."""
    path = os.path.join(folder, "api_key") if folder else None
    if path and os.path.isfile(path):
        with open(path) as f:
            return f.read().strip() or None
    return None


def http(method, url, body=None, key=None, timeout=10.0):
    """(status, bytes) of one request; OSError on a refused or timed-out connection."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


# --- the server -------------------------------------------------------------------------------

def unit_state(unit):
    out = subprocess.run(["systemctl", "show", "-p", "ActiveState", "--value", unit],
                         capture_output=True, text=True, timeout=10).stdout.strip()
    return out or "unknown"


def read_health(base, key):
    try:
        status, _ = http("GET", base + "/health", key=key, timeout=10)
    except OSError as exc:
        return {"ok": False, "status": None, "error": str(getattr(exc, "reason", exc))[:120]}
    return {"ok": status == 200, "status": status}


GAUGE = re.compile(r"^sglang:(num_running_reqs|num_queue_reqs|gen_throughput|num_requests_total)\{[^}]*\}\s+(\S+)", re.M)


def read_metrics(base, key):
    """The server's own gauges and counters that say whether users load it (None: unreadable)."""
    try:
        status, body = http("GET", base + "/metrics", key=key, timeout=10)
    except OSError:
        return None
    if status != 200:
        return None
    found = {}
    for name, value in GAUGE.findall(body.decode(errors="replace")):
        found[name] = found.get(name, 0.0) + float(value)
    return found


def probe(base, key, p):
    """P["requests"] sequential streamed generations of P["output_len"] tokens at one client:
    median TTFT and time per output token, and the tokens the last one returned."""
    ttfts, tpots, tokens = [], [], None
    body = {"input_ids": [1000 + i for i in range(p["input_len"])], "stream": True,
            "sampling_params": {"max_new_tokens": p["output_len"], "ignore_eos": True, "temperature": 0}}
    for _ in range(p["requests"]):
        t0 = time.monotonic()
        first = last = None
        tokens = 0
        req = urllib.request.Request(base + "/generate", data=json.dumps(body).encode(), method="POST")
        req.add_header("Content-Type", "application/json")
        if key:
            req.add_header("Authorization", "Bearer " + key)
        try:
            with urllib.request.urlopen(req, timeout=p["timeout_s"]) as resp:
                for raw in resp:
                    line = raw.decode(errors="replace").strip()
                    if not line.startswith("data:") or line == "data: [DONE]":
                        continue
                    doc = json.loads(line[5:])
                    if "error" in doc:
                        return {"asked": p["output_len"], "error": "error mid-stream: " + str(doc["error"])[:100]}
                    n = (doc.get("meta_info") or {}).get("completion_tokens", 0)
                    if n and first is None:
                        first = time.monotonic()
                    if n > tokens:
                        tokens, last = n, time.monotonic()
                    if time.monotonic() - t0 > p["timeout_s"]:
                        return {"asked": p["output_len"], "error": "no answer within %d s" % p["timeout_s"]}
        except urllib.error.HTTPError as exc:
            return {"asked": p["output_len"], "error": "HTTP %d" % exc.code}
        except (OSError, ValueError) as exc:
            return {"asked": p["output_len"], "error": "no answer within %d s (%s)" % (
                p["timeout_s"], str(getattr(exc, "reason", exc))[:60])}
        if first is None:
            return {"asked": p["output_len"], "tokens": 0, "error": "no token"}
        ttfts.append((first - t0) * 1000)
        if tokens > 1:
            tpots.append((last - first) * 1000 / (tokens - 1))
    med = lambda xs: sorted(xs)[len(xs) // 2] if xs else None  # noqa: E731
    return {"asked": p["output_len"], "tokens": tokens, "ttft_ms": med(ttfts), "tpot_ms": med(tpots)}


def read_target(t, key, cfg):
    state = unit_state(t["unit"])
    out = {"name": t["name"], "index": t.get("index"), "gpus": t["gpus"], "unit": t["unit"],
           "unit_active": state in ("active", "reloading"), "starting": state == "activating"}
    if not out["unit_active"]:
        return out
    out["health"] = read_health(t["url"], key)
    if not out["health"]["ok"]:
        return out
    before = read_metrics(t["url"], key)
    out["metrics"] = before
    out["probe"] = probe(t["url"], key, cfg["probe"])
    out["running"] = users_around(before, read_metrics(t["url"], key), cfg["probe"]["requests"])
    return out


def users_around(before, after, own):
    """Users' requests around the probe: running or queued when it began or when it ended, plus
    those that finished while it ran (the server's request counter moved by more than the probe's
    OWN). Users who came and went during the probe slow it as surely as those already there: on
    the twin, a probe taken at 0 running requests while users' load arrived read 54% slower than
    the gate, a failed interval that was the users' doing. None: the metrics were unreadable."""
    if before is None or after is None:
        return None
    queued = [int(m.get("num_running_reqs", 0) + m.get("num_queue_reqs", 0)) for m in (before, after)]
    finished = int(after.get("num_requests_total", 0) - before.get("num_requests_total", 0)) - own
    return max(queued) + max(finished, 0)


# --- the GPUs ---------------------------------------------------------------------------------

QUERY = ("index,uuid,pci.bus_id,pcie.link.gen.max,pcie.link.width.current,ecc.errors.uncorrected.volatile.total,"
         "clocks_event_reasons.hw_slowdown,clocks_event_reasons.hw_thermal_slowdown,"
         "clocks_event_reasons.sw_thermal_slowdown,clocks_event_reasons.hw_power_brake_slowdown,"
         "clocks_event_reasons.sw_power_cap")
EVENTS = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown", "sw_power_cap")
XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")


def smi(args):
    done = subprocess.run(["nvidia-smi"] + args, capture_output=True, text=True, timeout=30)
    return done.returncode, done.stdout


def _int(v):
    try:
        return int(float(v))
    except ValueError:
        return None


def read_gpus(expected, own_units, since):
    """Each expected GPU ({index, uuid, bus_id, pcie}) as decide.gpu_faults reads it: present,
    XIDs in the kernel log since SINCE, ECC, row remaps, clock events, link, foreign memory."""
    rc, out = smi(["--query-gpu=" + QUERY, "--format=csv,noheader,nounits"])
    seen = {}
    for line in out.splitlines():     # a GPU gone is missing from the rows (and the status is not 0)
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < 11:
            continue
        seen[cols[1]] = {"bus_id": cols[2], "pcie": [_int(cols[3]), _int(cols[4])], "ecc_uncorrectable": _int(cols[5]) or 0,
                         "clock_events": [e for e, v in zip(EVENTS, cols[6:11]) if v.lower() == "active"]}
    rc, out = smi(["--query-remapped-rows=gpu_uuid,remapped_rows.pending", "--format=csv,noheader"])
    pending = {c[0].strip() for c in (line.split(",") for line in out.splitlines() if rc == 0)
               if len(c) > 1 and c[1].strip().lower() in ("yes", "1", "true")}
    rc, out = smi(["--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits"])
    foreign = {}
    for line in out.splitlines() if rc == 0 else []:
        c = [x.strip() for x in line.split(",")]
        if len(c) == 3 and c[1].isdigit() and not _own(int(c[1]), own_units):
            foreign[c[0]] = foreign.get(c[0], 0) + (_int(c[2]) or 0)
    xids = kernel_xids(since)
    gpus = []
    for g in expected:
        now = seen.get(g["uuid"])
        doc = {"index": g["index"], "uuid": g["uuid"], "present": now is not None, "pcie_recorded": g.get("pcie")}
        if now:
            doc.update(now, remap_pending=g["uuid"] in pending, foreign_mib=foreign.get(g["uuid"], 0),
                       xid=[x for b, x in xids if _slot(b) == _slot(now["bus_id"])])
        gpus.append(doc)
    return gpus


def _slot(bus_id):
    """(bus, device) of a PCI address as the kernel (0000:41:00) or nvidia-smi (00000000:41:00.0)
    writes it."""
    parts = bus_id.lower().split(".")[0].split(":")
    return tuple(int(x, 16) for x in parts[-2:]) if len(parts) >= 2 else None


def _own(pid, units):
    """Whether PID runs in one of the release's units (its cgroup names one of UNITS)."""
    try:
        with open("/proc/%d/cgroup" % pid) as f:
            text = f.read()
    except OSError:
        return False
    return any(("/" + u) in text for u in units)


def kernel_xids(since):
    """(PCI bus id, XID) of each NVRM Xid line in the kernel log since SINCE (epoch seconds)."""
    # _TRANSPORT=kernel, not -k: -k also matches this boot's id, which a unit with
    # ProtectKernelTunables= cannot always read (in a container it cannot), and then finds nothing
    done = subprocess.run(["journalctl", "_TRANSPORT=kernel", "-q", "--no-pager", "-o", "cat", "--since", "@%d" % int(since)],
                          capture_output=True, text=True, timeout=30)
    return [(m.group(1), int(m.group(2))) for m in XID.finditer(done.stdout)]


# --- one interval -----------------------------------------------------------------------------

def remember_fatal(state, gpus, hardware):
    """A fatal XID is written to the kernel log once, but the GPU stays broken until it is reset:
    keep it in the state (for this release) so that every later interval sees it too."""
    kept = state.setdefault("fatal_xids", {})
    for g in gpus:
        new = g.get("xid", [])
        g["xid_new"] = len(new)
        fatal = sorted(set(kept.get(str(g["index"]), [])) | {x for x in new if x in hardware})
        if fatal:
            kept[str(g["index"])] = fatal
        g["xid"] = sorted(set(new) | set(fatal))


def measure(cfg, state, now, key, hardware=frozenset()):
    paused = None
    if os.path.isdir(cfg["lock"]):
        paused = "a deploy, rollback or tune holds the deploy lock"
    elif os.path.exists(cfg["paused_file"]):
        paused = "paused (%s)" % cfg["paused_file"]
    targets = [] if paused else [read_target(t, key, cfg) for t in cfg["targets"]]
    since = state.get("t") or now - cfg["interval_s"]
    gpus = read_gpus(cfg["gpus"], [t["unit"] for t in cfg["targets"]], since - 1)
    remember_fatal(state, gpus, hardware)
    return {"t": now, "paused": paused, "targets": targets or [dict(t, unit_active=True) for t in cfg["targets"]],
            "gpus": gpus, "baseline": cfg.get("baseline")}


def write_atomic(path, text, mode=0o644):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def prom(cfg, state, reading, health):
    """node_exporter textfile-collector format: release and profile as labels."""
    base = 'release="%04d",profile="%s"' % (cfg["release"], cfg["profile"])
    lines = ["# HELP dsv4_watch_up 1 healthy, 0.5 degraded, 0 down (the watch's verdict).",
             "# TYPE dsv4_watch_up gauge",
             "dsv4_watch_up{%s} %s" % (base, {"healthy": 1, "degraded": 0.5}.get(health, 0)),
             "# HELP dsv4_watch_last_run_timestamp_seconds When the watch last measured.",
             "# TYPE dsv4_watch_last_run_timestamp_seconds gauge",
             "dsv4_watch_last_run_timestamp_seconds{%s} %d" % (base, reading["t"])]
    rows = {"dsv4_watch_interval_result": [], "dsv4_watch_consecutive_failures": [], "dsv4_watch_probe_ttft_seconds": [],
            "dsv4_watch_probe_tpot_seconds": [], "dsv4_watch_evicted": [], "dsv4_watch_last_action_timestamp_seconds": []}
    for t in reading["targets"]:
        ts = state["targets"].get(t["name"], {})
        last = (ts.get("history") or [{}])[-1]
        lab = '%s,target="%s"' % (base, t["name"])
        rows["dsv4_watch_interval_result"].append('dsv4_watch_interval_result{%s,result="%s",cause="%s"} 1' % (
            lab, last.get("verdict", "none"), last.get("cause") or ""))
        rows["dsv4_watch_consecutive_failures"].append("dsv4_watch_consecutive_failures{%s} %d" % (lab, ts.get("consecutive", 0)))
        p = t.get("probe") or {}
        if p.get("ttft_ms") is not None:
            rows["dsv4_watch_probe_ttft_seconds"].append("dsv4_watch_probe_ttft_seconds{%s} %.4f" % (lab, p["ttft_ms"] / 1000))
        if p.get("tpot_ms") is not None:
            rows["dsv4_watch_probe_tpot_seconds"].append("dsv4_watch_probe_tpot_seconds{%s} %.5f" % (lab, p["tpot_ms"] / 1000))
        rows["dsv4_watch_evicted"].append("dsv4_watch_evicted{%s} %d" % (lab, 1 if ts.get("evicted") else 0))
        act = ts.get("last_action")
        if act:
            rows["dsv4_watch_last_action_timestamp_seconds"].append(
                'dsv4_watch_last_action_timestamp_seconds{%s,action="%s"} %d' % (lab, act["action"], act["t"]))
    for name, values in rows.items():
        if values:
            lines += ["# TYPE %s gauge" % name] + values
    lines.append("# TYPE dsv4_watch_gpu_fault gauge")
    decide = load_decide()
    for g in reading["gpus"]:
        lines.append('dsv4_watch_gpu_fault{%s,gpu="%d",uuid="%s"} %d' % (
            base, g["index"], g["uuid"], len(decide.gpu_faults(g, cfg["settings"]["foreign_mib"]))))
    lines.append("# TYPE dsv4_watch_gpu_xid_total counter")
    for g in reading["gpus"]:
        total = state.setdefault("xid_total", {}).get(str(g["index"]), 0) + g.get("xid_new", 0)
        state["xid_total"][str(g["index"])] = total
        lines.append('dsv4_watch_gpu_xid_total{%s,gpu="%d"} %d' % (base, g["index"], total))
    return "\n".join(lines) + "\n"


def main(argv):
    with open(argv[1]) as f:
        cfg = json.load(f)
    decide = load_decide()
    settings = decide.settings(cfg["settings"])
    cfg["settings"] = settings
    cfg["interval_s"], cfg["probe"] = settings["interval_s"], settings["probe"]
    state_file = os.path.join(cfg["state_dir"], "state.json")
    try:
        with open(state_file) as f:
            state = json.load(f)
    except (OSError, ValueError):
        state = {}
    if state.get("release") != cfg["release"]:     # a new release starts a new count
        state = {"release": cfg["release"], "profile": cfg["profile"]}
    now = time.time()
    reading = measure(cfg, state, now, api_key(os.environ.get("CREDENTIALS_DIRECTORY")), decide.XID_HARDWARE)
    state, actions = decide.step(state, reading, settings, now)
    health = decide.health(state)
    state.update(release=cfg["release"], profile=cfg["profile"], health=health, last_reading=reading)
    for t in reading["targets"]:
        last = state["targets"][t["name"]]["history"][-1]
        p = t.get("probe") or {}
        print("watch %s: %s%s; %s%s" % (t["name"], last["verdict"], " (%s)" % last["cause"] if last["cause"] else "",
                                        "; ".join(last["reasons"]) or "probe TTFT %s ms TPOT %s ms" % (
                                            _r(p.get("ttft_ms")), _r(p.get("tpot_ms"))),
                                        "" if not state["targets"][t["name"]]["consecutive"] else
                                        " [%d/%d failed]" % (state["targets"][t["name"]]["consecutive"], settings["failure_limit"])))
    text = prom(cfg, state, reading, health)
    write_atomic(state_file, json.dumps(state, sort_keys=True), 0o640)
    # node_exporter reads it through the link the deploy put in textfile_dir
    write_atomic(os.path.join(cfg["state_dir"], "dsv4deploy_watch.prom"), text)
    for a in actions:
        print("watch decides: %s %s: %s" % (a["action"], a["target"], a["reason"]))
        a.update(t=now, release=cfg["release"])
        write_atomic(os.path.join(cfg["requests_dir"], "%d-%s.json" % (int(now * 1000), a["target"])),
                     json.dumps(a, sort_keys=True), 0o640)
    return 0


def _r(v):
    return "-" if v is None else "%.1f" % v


if __name__ == "__main__":
    sys.exit(main(sys.argv))
