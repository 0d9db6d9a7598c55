#!/usr/bin/env python3
"""Device-side driver: environment facts, then in parallel the workload unfiltered (control),
under the core filter (SystemCallFilter + RestrictAddressFamilies, root without capabilities),
under the full seccomp set as user nobody, and under the trap variant that logs every denied
call; negative controls with and without the filter; then, only if a check fails under a filter
but passes in the control, follow-up runs that allow the suspects one at a time.
Stdlib only. Writes everything to stdout (tee it to $OUT/probe.log)."""
import json, os, re, shutil, subprocess, sys, tempfile, time

T0 = time.time()
DEADLINE = float(os.environ.get("PROBE_DEADLINE_S", "270"))
SRC = os.path.dirname(os.path.abspath(__file__))
RUN = tempfile.mkdtemp(prefix="devprobe-")
os.chmod(RUN, 0o755)
for f in os.listdir(SRC):
    if os.path.isfile(os.path.join(SRC, f)):
        shutil.copy(os.path.join(SRC, f), RUN)
        os.chmod(os.path.join(RUN, f), 0o644)
META = json.load(open(os.path.join(RUN, "filters.json")))
NAMES = {int(k): v for k, v in META["denied_x86_64"].items()}
NAMES.update({nr: name for name, nr in META["allowed"].items()})
OUT = os.environ.get("OUT", RUN)
CORE = ["syscall.bpf", "af.bpf"]
# systemd's order in exec_child: address families, realtime, suid/sgid, namespaces, personality,
# and the system call filter last
FULL = ["af.bpf", "realtime.bpf", "suid.bpf", "ns.bpf", "personality.bpf", "syscall.bpf"]
TRAP = ["syscall_trap.bpf", "af_trap.bpf"]


def el():
    return time.time() - T0


def say(s=""):
    print(s, flush=True)


def sh(cmd, timeout=30):
    try:
        r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout)
        return (r.stdout + r.stderr).strip()
    except Exception as e:  # noqa: BLE001
        return f"<{e}>"


def loader(filters, caps=True, user=None, home=None):
    cmd = [sys.executable, os.path.join(RUN, "load_filter.py")]
    if filters:
        cmd += ["--filters", ",".join(filters)]
    if caps:
        cmd += ["--drop-caps"]
    if user:
        cmd += ["--user", user]
    if home:
        cmd += ["--home", home]
    return cmd + ["--"]


def start(label, prefix, script="workload.py", extra_env=None):
    env = dict(os.environ, PROBE_LABEL=label, PYTHONUNBUFFERED="1", NCCL_NVLS_ENABLE="0",
               TORCH_SYMM_MEM_DISABLE_MULTICAST="1")
    env.update(extra_env or {})
    log = open(os.path.join(RUN, f"{label}.out"), "w")
    p = subprocess.Popen(prefix + ["python3", os.path.join(RUN, script)], cwd=RUN, env=env,
                         stdout=log, stderr=subprocess.STDOUT)
    return {"label": label, "p": p, "t0": time.time(), "log": log.name}


def wait_all(runs, timeout):
    end = time.time() + timeout
    for r in runs:
        try:
            r["rc"] = r["p"].wait(timeout=max(1, end - time.time()))
        except subprocess.TimeoutExpired:
            r["p"].kill()
            r["rc"] = "TIMEOUT"
        r["secs"] = time.time() - r["t0"]
        r["text"] = open(r["log"], errors="replace").read()
        r["checks"] = dict((m.group(2), m.group(1)) for m in re.finditer(r"\] (OK|FAIL) (\w+)", r["text"]))
    return runs


def show(r):
    say(f"\n===== {r['label']}: rc={r['rc']} {r['secs']:.0f}s checks={r['checks']}")
    say(r["text"].rstrip())


def hand_bpf(extra_nrs, path):
    """Allow-list filter equivalent to syscall.bpf plus extra syscall numbers (for follow-ups)."""
    import struct
    nrs = sorted(set(META["allowed"].values()) | set(extra_nrs))
    ins = [(0x20, 0, 0, 4), (0x15, 1, 0, 0xC000003E), (0x06, 0, 0, 0x80000000),
           (0x20, 0, 0, 0), (0x35, 0, 1, 0x40000000), (0x06, 0, 0, 0x80000000)]
    for n in nrs:
        ins += [(0x15, 0, 1, n), (0x06, 0, 0, 0x7FFF0000)]
    ins.append((0x06, 0, 0, 0x00050001))  # ERRNO(EPERM)
    with open(path, "wb") as f:
        for c, jt, jf, k in ins:
            f.write(struct.pack("<HBBI", c, jt, jf, k))
    os.chmod(path, 0o644)
    return path


def main():
    say(f"== devprobe start, run dir {RUN}")
    say(f"uname -a: {sh('uname -a')}")
    say(f"kernel: {sh('uname -r')}  ({'gVisor' if sh('uname -r').startswith('4.4.0') else 'not gVisor (Firecracker/Linux)'})")
    say(f"dmesg head: {sh('dmesg 2>&1 | head -3')}")
    say(f"seccomp actions_avail: {sh('cat /proc/sys/kernel/seccomp/actions_avail')}")
    say("self status: " + sh("grep -E '^(Seccomp|NoNewPrivs|CapEff)' /proc/self/status | tr -s '[:space:]' ' '"))
    say(f"nvidia-smi: {sh('nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader')}")
    say(f"/dev/nvidia*: {sh('ls -l /dev/nvidia* 2>&1 | head -12')}")
    say(f"python3: {sh('command -v python3; python3 -V')}")
    say(f"glibc: {sh('ldd --version | head -1')}")
    say("libnccl: " + sh("python3 -c \"import glob, nvidia.nccl as n; print(glob.glob(list(n.__path__)[0] + '/lib/*'))\""))
    say(f"nobody: {sh('getent passwd nobody')}")
    say(f"filters: allowed x86_64 syscalls={META['allowed_x86_64_count']} denied known={len(META['denied_x86_64'])} "
        f"bpf={META['bpf_instructions']}")
    say(f"== t={el():.0f}s seccomp smoke test")
    smoke = subprocess.run(loader(CORE, caps=True) + ["true"], capture_output=True, text=True, timeout=30)
    say(smoke.stderr.strip())
    if smoke.returncode != 0:
        say(f"RESULT seccomp filter could not be installed here (rc={smoke.returncode}); nothing below ran under a filter")
        return 2
    nobody_home = tempfile.mkdtemp(prefix="home-nobody-")
    shutil.chown(nobody_home, "nobody", "nogroup" if sh("getent group nogroup") else None)
    diag_log = os.path.join(RUN, "sigsys.log")
    open(diag_log, "w").close(); os.chmod(diag_log, 0o666)

    say(f"== t={el():.0f}s negative controls")
    negs = [start("neg-none", []  , "negctl.py"),
            start("neg-core-keepcaps", loader(CORE, caps=False), "negctl.py"),
            start("neg-core", loader(CORE), "negctl.py"),
            start("neg-full-nobody", loader(FULL, user="nobody", home=nobody_home), "negctl.py")]
    for r in wait_all(negs, 60):
        show(r)

    say(f"\n== t={el():.0f}s workloads in parallel")
    runs = [start("control", []),
            start("core", loader(CORE)),
            start("full-nobody", loader(FULL, user="nobody", home=nobody_home)),
            start("diag-trap", loader(TRAP), extra_env={"LD_PRELOAD": os.path.join(RUN, "sigsys_log.so"),
                                                        "SIGSYS_LOG": diag_log})]
    wait_all(runs, max(60, DEADLINE - 90 - el()))
    for r in runs:
        show(r)
    denied = {}
    for line in open(diag_log, errors="replace"):
        m = re.search(r"comm=(\S*) nr=(\d+) arg0=(\S+)", line)
        if m:
            nr = int(m.group(2))
            key = (NAMES.get(nr, f"nr{nr}"), nr)
            denied.setdefault(key, {"count": 0, "comms": set(), "arg0": set()})
            denied[key]["count"] += 1
            denied[key]["comms"].add(m.group(1))
            if len(denied[key]["arg0"]) < 4:
                denied[key]["arg0"].add(m.group(3))
    say(f"\n== denied calls seen by the trap run (the real filter returns EPERM / EAFNOSUPPORT for these):")
    if not denied:
        say("   none")
    for (name, nr), d in sorted(denied.items(), key=lambda kv: -kv[1]["count"]):
        say(f"   {name} (nr {nr}) x{d['count']} by {sorted(d['comms'])} arg0 {sorted(d['arg0'])}")

    ctrl = {k for k, v in runs[0]["checks"].items() if v == "OK"}
    follow = []
    bad_core = [k for k in ctrl if runs[1]["checks"].get(k) != "OK"]
    bad_full = [k for k in ctrl if runs[2]["checks"].get(k) != "OK"]
    left = DEADLINE - el()
    say(f"\n== t={el():.0f}s control OK={sorted(ctrl)} core broke={bad_core} full broke={bad_full}; {left:.0f}s left")
    if (bad_core or bad_full) and left > 60:
        suspects = [nr for (name, nr) in denied if nr != 41][:6]
        if bad_core:
            follow.append(start("core+alldenied", loader([hand_bpf(suspects, os.path.join(RUN, "plus_all.bpf")), "af.bpf"])))
            for nr in suspects:
                follow.append(start(f"core+{NAMES.get(nr, nr)}", loader([hand_bpf([nr], os.path.join(RUN, f"plus_{nr}.bpf")), "af.bpf"])))
            if any(nr == 41 for (_, nr) in denied):
                follow.append(start("core-noaf", loader(["syscall.bpf"])))
        if bad_full:
            for drop in FULL:
                follow.append(start(f"full-minus-{drop[:-4]}", loader([f for f in FULL if f != drop], user="nobody", home=nobody_home)))
            follow.append(start("nobody-nofilter", loader([], user="nobody", home=nobody_home)))
        wait_all(follow, max(30, DEADLINE - el() - 5))
        for r in follow:
            say(f"\n===== follow-up {r['label']}: rc={r['rc']} {r['secs']:.0f}s checks={r['checks']}")
            say("\n".join(l for l in r["text"].splitlines() if " OK " in l or "FAIL" in l or "SUMMARY" in l or "LOADER" in l))
    summary = {"kernel": sh("uname -r"), "elapsed_s": round(el()),
               "runs": {r["label"]: {"rc": r["rc"], "secs": round(r["secs"]), "checks": r["checks"]} for r in runs + follow},
               "negctl": {r["label"]: re.findall(r"CALL (.*)", r["text"]) for r in negs},
               "denied_seen": {f"{n}({nr})": d["count"] for (n, nr), d in denied.items()}}
    say("\nSUMMARY_JSON " + json.dumps(summary))
    try:
        json.dump(summary, open(os.path.join(OUT, "summary.json"), "w"), indent=1)
        shutil.copy(diag_log, os.path.join(OUT, "sigsys.log"))
    except OSError:
        pass
    say(f"== done t={el():.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
