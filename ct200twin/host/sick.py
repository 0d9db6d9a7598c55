"""Make a running twin sick, and well again, for the watch (docs/watch.md lists the faults):

    python -m ct200twin.host.sick --fleet watch server slowdown=1.67 | hang=1 | errors_after_s=5
    python -m ct200twin.host.sick --fleet watch gpu 2 gone=1 | ecc_uncorrectable=2 | remap_pending=1
                                 | clock_events=hw_thermal_slowdown | pcie_width=8 | pcie_gen=3
    python -m ct200twin.host.sick --fleet watch foreign 2 20000     # a foreign process, MiB
    python -m ct200twin.host.sick --fleet watch hold 4,5 4000       # a running process holds MiB on each
    python -m ct200twin.host.sick --fleet watch xid 2 79            # an NVRM Xid line in the kernel log
    python -m ct200twin.host.sick --fleet watch heal

Each takes effect at once under a running server: the server reads sick.json whenever it changes
(ct200twin/server/sickness.py), the twin's nvidia-smi reads its settings at every call. The kernel
log is a stand-in too: the twin's /dev/kmsg is a link to systemd-nspawn's FIFO on /proc/kmsg
(made at boot, ct200twin/host/twin_setup.py), which journald reads as the kernel's records, so a
line written there shows in `journalctl -k` as a driver's does on a host.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time

from ct200twin.host.machines import SimHost
from ct200twin.host.nvidia_smi import _BUSES, HOLDS_DIR

SICK = "/etc/dsv4deploy-twin/sick.json"
GPUS = "/etc/dsv4deploy-twin/gpus.json"
# A twin booted before the stand-in existed gets it now (journald then reopens /dev/kmsg); the
# FIFO is held open by systemd-nspawn, so neither journald nor the write below waits on it.
KMSG_SETUP = ("[ -L /dev/kmsg ] || { [ -p /proc/kmsg ] && ln -sfn /proc/kmsg /dev/kmsg && "
              "systemctl restart systemd-journald; }")


def _gpus(twin) -> dict:
    try:
        return json.loads(twin.read_file(GPUS))
    except (ValueError, Exception):  # noqa: BLE001 - a missing file starts from the defaults
        return {}


def server(twin, **sick) -> None:
    """The server's sickness (slowdown, hang, errors_after_s); none: healthy."""
    twin.write_file(SICK, json.dumps(sick) + "\n", 0o644)


def gpu(twin, index: int, **fault) -> None:
    """GPU INDEX's fault, merged into what nvidia-smi reports (gone, ecc_uncorrectable, ...)."""
    doc = _gpus(twin)
    doc.setdefault("faults", {}).setdefault(str(index), {}).update(fault)
    twin.write_file(GPUS, json.dumps(doc, indent=1, sort_keys=True) + "\n", 0o644)


def foreign(twin, index: int, mib: int, pid: int = 4242) -> None:
    doc = _gpus(twin)
    doc["foreign_processes"] = doc.get("foreign_processes", []) + [{"gpu": index, "pid": pid, "used_mib": mib}]
    twin.write_file(GPUS, json.dumps(doc, indent=1, sort_keys=True) + "\n", 0o644)


HOLD_UNIT = "dsv4deploy-twin-gpu-hold"
# the process of `hold`: says what it holds as a twin server does (ct200twin/server/gpu_hold.py), then waits
_HOLDER = ("import json, os, signal, sys\n"
           "folder, mib, gpus = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(',')\n"
           "start = open('/proc/self/stat').read().rsplit(')', 1)[1].split()[19]\n"
           "path = '%s/%d.json' % (folder, os.getpid())\n"
           "open(path + '.tmp', 'w').write(json.dumps({'pid': os.getpid(), 'start': start, 'name': 'python3',\n"
           "                                           'gpus': {g: mib for g in gpus}}))\n"
           "os.replace(path + '.tmp', path)\n"
           "while True:\n    signal.pause()\n")


def hold(twin, gpus: list[int], mib: int) -> int:
    """A process that is none of the release's holds MIB on each of GPUS while it runs (a CUDA
    process left behind, a server started by hand): the transient unit HOLD_UNIT-<gpus>, stopped
    by `heal`. Returns its PID once nvidia-smi can see it."""
    unit = f"{HOLD_UNIT}-{'-'.join(map(str, gpus))}"
    twin.run(f"systemctl reset-failed {unit} 2>/dev/null; systemd-run --quiet --collect --unit {unit} "
             f"/usr/bin/python3 -c {shlex.quote(_HOLDER)} {HOLDS_DIR} {int(mib)} {','.join(map(str, gpus))}")
    pid = int(twin.run(f"systemctl show -p MainPID --value {unit}").stdout.strip() or 0)
    deadline = time.monotonic() + 30             # by the clock: a command to the twin takes ~15 ms
    while time.monotonic() < deadline:
        if twin.run(f"test -f {HOLDS_DIR}/{pid}.json", check=False).returncode == 0:
            return pid
        time.sleep(0.1)
    raise RuntimeError(f"{unit} (PID {pid}) wrote no {HOLDS_DIR}/{pid}.json: is {HOLDS_DIR} there (a twin "
                       "booted before it existed)?")


def xid(twin, index: int, code: int) -> None:
    """An NVRM Xid record for GPU INDEX in the twin's kernel log, as the driver writes it."""
    bus = "0000:%02x:00" % _BUSES[index]
    text = f"NVRM: Xid (PCI:{bus}): {code}, pid=1234, name=python3, Ch 00000008"
    # the kernel's record format: priority,sequence,microseconds since boot,flags;text
    twin.run(f"{KMSG_SETUP} && printf '3,%s,%s,-;%s\\n' \"$(date +%s%N | cut -c1-16)\" "
             f"\"$(cut -d. -f1 /proc/uptime)000000\" '{text}' > /dev/kmsg")


def heal(twin) -> None:
    """Every sickness off: the server, the GPUs' faults, the foreign processes and those of `hold`."""
    server(twin)
    twin.run(f"systemctl stop '{HOLD_UNIT}-*' 2>/dev/null; true", check=False)
    doc = _gpus(twin)
    doc.pop("faults", None)
    doc.pop("foreign_processes", None)
    twin.write_file(GPUS, json.dumps(doc, indent=1, sort_keys=True) + "\n", 0o644)


def _pairs(words: list[str]) -> dict:
    out = {}
    for w in words:
        k, _, v = w.partition("=")
        out[k] = v.split(",") if k == "clock_events" else json.loads(v)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ct200twin.host.sick", description=__doc__.split("\n\n")[0])
    p.add_argument("--fleet", default=None)
    p.add_argument("--host", type=int, default=1)
    p.add_argument("what", choices=("server", "gpu", "foreign", "hold", "xid", "heal"))
    p.add_argument("args", nargs="*")
    a = p.parse_args(argv)
    twin = SimHost(a.host, a.fleet) if a.fleet else SimHost(a.host)
    if a.what == "server":
        server(twin, **_pairs(a.args))
    elif a.what == "gpu":
        gpu(twin, int(a.args[0]), **_pairs(a.args[1:]))
    elif a.what == "foreign":
        foreign(twin, int(a.args[0]), int(a.args[1]))
    elif a.what == "hold":
        print(hold(twin, [int(g) for g in a.args[0].split(",")], int(a.args[1])))
    elif a.what == "xid":
        xid(twin, int(a.args[0]), int(a.args[1]))
    else:
        heal(twin)
    return 0


if __name__ == "__main__":
    sys.exit(main())
