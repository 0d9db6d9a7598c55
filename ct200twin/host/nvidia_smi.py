#!/usr/bin/python3
# dsv4deploy host program: runs on the GPU host with its own python3; standard library only.
"""A stand-in for ``nvidia-smi`` on the CT200 twin.

Self-contained (Python 3 stdlib only, never imports dsv4deploy): the twin
harness copies this file into the twin root as ``/usr/bin/nvidia-smi``.

It answers the forms the deploy tool and SGLang use, with the layout of the
real tool (checked against nvidia-smi 580.159.04 on an H200):

    nvidia-smi                                   the summary table
    nvidia-smi -L                                GPU list with UUIDs
    nvidia-smi --version
    nvidia-smi topo -m                           PCIe topology (no NVLink)
    nvidia-smi -q                                short query report
    nvidia-smi --query-gpu=F1,F2 --format=csv[,noheader][,nounits] [-i IDS]

The GPUs it reports come from a JSON settings file, by default
``/etc/dsv4deploy-twin/gpus.json`` (env ``DSV4_TWIN_GPUS`` overrides the path):

    {"count": 8, "memory_mib": 97887, "driver_version": "580.95.05",
     "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
     "compute_cap": "12.0", "memory_used_mib": 0, "driver_installed": true,
     "cuda_version": "13.0", "uuid_seed": "CT200"}

Faults an operator sees on a real host, switchable while the twin runs (each call reads the
file again): ``"faults": {"<index>": {...}}`` with ``gone`` (the GPU fell off the bus: no
longer listed, "Unable to determine the device handle" on stderr), ``ecc_uncorrectable`` (n),
``remap_pending`` (bool), ``clock_events`` (names such as ``hw_thermal_slowdown``: reported
Active), ``pcie_gen`` / ``pcie_width`` (the link as trained now, below the slot's 5 / 16);
``"foreign_processes": [{"gpu": i, "pid": n, "used_mib": m}]``: processes that need not run.

The memory a process holds: the twin's servers write what they hold per GPU into
``/dev/shm/dsv4deploy-twin-gpu/<pid>.json`` (ct200twin/server/gpu_hold.py; env
``DSV4_TWIN_GPU_HOLDS`` moves the folder), the stand-in for the driver's accounting. A file
counts while its PID runs the process that wrote it (same start time, not a zombie): a server
stopped or killed holds nothing, as on the host. These processes and the foreign ones are
listed by ``--query-compute-apps`` and the summary table, and add to ``memory.used``.

Missing keys take these defaults (CT200's values). ``memory_used_mib`` may be
a list (one value per GPU).  Exit codes follow the real tool: 2 for a bad
field or format, 255 for an unknown option, 6 when no GPU matches, 9 when the
settings say the driver is not installed.
"""

import hashlib
import json
import os
import sys
import time

SETTINGS_PATH = "/etc/dsv4deploy-twin/gpus.json"
SETTINGS_ENV = "DSV4_TWIN_GPUS"
HOLDS_DIR = "/dev/shm/dsv4deploy-twin-gpu"      # the servers' side: ct200twin/server/gpu_hold.py
HOLDS_ENV = "DSV4_TWIN_GPU_HOLDS"

DEFAULTS = {
    "count": 8,
    "memory_mib": 97887,
    "driver_version": "580.95.05",
    "name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "compute_cap": "12.0",
    "memory_used_mib": 0,
    "driver_installed": True,
    "cuda_version": "13.0",
    "uuid_seed": "CT200",
    "power_limit_w": 600,
}

# PCI bus numbers of the 8 slots; GPUs 0-3 sit on NUMA node 0, 4-7 on node 1.
_BUSES = [0x01, 0x21, 0x41, 0x61, 0x81, 0xA1, 0xC1, 0xE1]
_CPU_AFFINITY = ["0-31,64-95", "32-63,96-127"]

DRIVER_FAILED = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.\n"
)


class Exit(Exception):
    def __init__(self, code, message=""):
        super().__init__(message)
        self.code = code
        self.message = message


# ----------------------------------------------------------------- settings

def load_settings(path=None):
    """Settings dict: defaults overlaid with the JSON file (if it exists)."""
    path = path or os.environ.get(SETTINGS_ENV) or SETTINGS_PATH
    settings = dict(DEFAULTS)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        data = {}
    except (OSError, ValueError) as e:
        raise Exit(6, "Failed to read GPU settings %s: %s\n" % (path, e))
    if not isinstance(data, dict):
        raise Exit(6, "Failed to read GPU settings %s: not a JSON object\n" % path)
    settings.update({k: v for k, v in data.items() if v is not None})
    return settings


class Gpu:
    def __init__(self, index, s):
        self.index = index
        self.s = s
        self.name = str(s["name"])
        self.memory_total = int(s["memory_mib"])
        used = s["memory_used_mib"]
        if isinstance(used, list):
            used = used[index] if index < len(used) else 0
        self.memory_base = int(used)
        self.processes = []         # {"pid", "name", "used_mib"} of the processes holding memory here
        digest = hashlib.sha1(("%s:%d" % (s["uuid_seed"], index)).encode()).hexdigest()
        self.uuid = "GPU-%s-%s-%s-%s-%s" % (
            digest[0:8], digest[8:12], digest[12:16], digest[16:20], digest[20:32])
        self.serial = str(int(digest[:10], 16) % 10**13).rjust(13, "1")
        bus = _BUSES[index] if index < len(_BUSES) else (index * 0x10 + 1) & 0xFF
        self.bus_id = "00000000:%02X:00.0" % bus
        self.numa = 0 if index < max(int(s["count"]) // 2, 1) else 1
        self.power_limit = int(s.get("power_limit_w") or 600)

    @property
    def memory_used(self):
        return min(self.memory_base + sum(p["used_mib"] for p in self.processes), self.memory_total)

    @property
    def memory_free(self):
        return max(self.memory_total - self.memory_used, 0)


def fault(g, key, default=None):
    """GPU G's switched-on fault KEY (settings "faults", by index), or DEFAULT."""
    faults = g.s.get("faults") or {}
    return (faults.get(str(g.index)) or {}).get(key, default)


def gpus(settings):
    every = [Gpu(i, settings) for i in range(int(settings["count"]))]
    for g in every:
        if fault(g, "gone"):
            sys.stderr.write("Unable to determine the device handle for GPU%s: Unknown Error\n" % g.bus_id[4:])
    listed = [g for g in every if not fault(g, "gone")]
    by_index = {g.index: g for g in listed}
    for p in settings.get("foreign_processes") or []:
        if isinstance(p, dict) and p.get("gpu") in by_index:
            by_index[p["gpu"]].processes.append({"pid": int(p.get("pid", 0)), "name": str(p.get("name", "python3")),
                                                 "used_mib": int(p.get("used_mib", 0))})
    for pid, name, token, mib in held(os.environ.get(HOLDS_ENV) or HOLDS_DIR):
        for g in select(listed, token)[:1]:
            g.processes.append({"pid": pid, "name": name, "used_mib": mib})
    return listed


def running(pid, start):
    """Whether PID still runs the process that wrote its file: it exists, is no zombie, and
    started at START (a PID reused is another process). kill(pid, 0) answers for any user."""
    try:
        os.kill(pid, 0)
    except PermissionError:
        pass
    except OSError:
        return False
    try:
        with open("/proc/%d/stat" % pid, encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return True
    if fields and fields[0] in ("Z", "X"):
        return False
    return start is None or len(fields) < 20 or fields[19] == str(start)


def held(folder):
    """(pid, name, GPU as -i names it, MiB) of each running process's file in FOLDER, by PID."""
    try:
        names = sorted(os.listdir(folder), key=lambda n: (len(n), n))
    except OSError:
        return []
    out = []
    for fname in names:
        if not (fname.endswith(".json") and fname[:-5].isdigit()):
            continue
        try:
            with open(os.path.join(folder, fname), encoding="utf-8") as f:
                doc = json.load(f)
            pid = int(doc["pid"])
            per_gpu = {str(k): int(v) for k, v in dict(doc["gpus"]).items()}
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if pid != int(fname[:-5]) or not running(pid, doc.get("start")):
            continue
        name = str(doc.get("name") or "python3")
        out += [(pid, name, token, mib) for token, mib in per_gpu.items() if mib > 0]
    return out


def select(all_gpus, ids):
    """Apply ``-i``: comma-separated indices, UUIDs or PCI bus ids."""
    if ids is None:
        return all_gpus
    chosen = []
    for tok in ids.split(","):
        tok = tok.strip()
        for g in all_gpus:
            if tok == str(g.index) or tok == g.uuid or tok.upper() in (g.bus_id, g.bus_id[4:]):
                if g not in chosen:
                    chosen.append(g)
    return chosen


# ------------------------------------------------------------ --query-gpu

def _mib(v):
    return (v, "MiB")


# canonical field -> (header unit or None, getter returning value or (value, unit))
FIELDS = {
    "timestamp": (None, lambda g: time.strftime("%Y/%m/%d %H:%M:%S.000")),
    "driver_version": (None, lambda g: g.s["driver_version"]),
    "count": (None, lambda g: str(int(g.s["count"]))),
    "name": (None, lambda g: g.name),
    "serial": (None, lambda g: g.serial),
    "uuid": (None, lambda g: g.uuid),
    "pci.bus_id": (None, lambda g: g.bus_id),
    "pci.domain": (None, lambda g: "0x0000"),
    "pci.bus": (None, lambda g: "0x" + g.bus_id[9:11]),
    "pci.device": (None, lambda g: "0x00"),
    "pci.device_id": (None, lambda g: "0x2BB510DE"),
    "index": (None, lambda g: str(g.index)),
    "persistence_mode": (None, lambda g: "Enabled"),
    "pstate": (None, lambda g: "P8"),
    "compute_mode": (None, lambda g: "Default"),
    "compute_cap": (None, lambda g: str(g.s["compute_cap"])),
    "mig.mode.current": (None, lambda g: "Disabled"),
    "memory.total": ("MiB", lambda g: _mib(g.memory_total)),
    "memory.reserved": ("MiB", lambda g: _mib(0)),
    "memory.used": ("MiB", lambda g: _mib(g.memory_used)),
    "memory.free": ("MiB", lambda g: _mib(g.memory_free)),
    "temperature.gpu": (None, lambda g: "32"),
    "utilization.gpu": ("%", lambda g: (0, "%")),
    "utilization.memory": ("%", lambda g: (0, "%")),
    "power.draw": ("W", lambda g: ("28.50", "W")),
    "power.limit": ("W", lambda g: ("%.2f" % g.power_limit, "W")),
    "fan.speed": ("%", lambda g: ("[N/A]", None)),
    "pcie.link.gen.current": (None, lambda g: str(fault(g, "pcie_gen", 5))),
    "pcie.link.gen.max": (None, lambda g: str(fault(g, "pcie_gen", 5))),
    "pcie.link.gen.gpumax": (None, lambda g: "5"),
    "pcie.link.width.current": (None, lambda g: str(fault(g, "pcie_width", 16))),
    "pcie.link.width.max": (None, lambda g: "16"),
    "ecc.errors.uncorrected.volatile.total": (None, lambda g: str(fault(g, "ecc_uncorrectable", 0))),
    "ecc.errors.corrected.volatile.total": (None, lambda g: "0"),
}
CLOCK_EVENTS = ("gpu_idle", "applications_clocks_setting", "sw_power_cap", "hw_slowdown", "hw_thermal_slowdown",
                "sw_thermal_slowdown", "hw_power_brake_slowdown", "sync_boost")
for _name in CLOCK_EVENTS:
    FIELDS["clocks_event_reasons." + _name] = (None, lambda g, n=_name: "Active" if n in fault(g, "clock_events", [])
                                               else "Not Active")

ALIASES = {
    "gpu_name": "name",
    "gpu_uuid": "uuid",
    "gpu_serial": "serial",
    "gpu_bus_id": "pci.bus_id",
    "persistence-mode": "persistence_mode",
    "compute-mode": "compute_mode",
    "temperature.gpu.tlimit": "temperature.gpu",
    "power.draw.instant": "power.draw",
    "enforced.power.limit": "power.limit",
}


def query_gpu(selected, fields, fmt):
    names = []
    for f in fields:
        canon = ALIASES.get(f, f)
        if canon not in FIELDS:
            raise Exit(2, 'Field "%s" is not a valid field to query.\n\n' % f)
        names.append(canon)
    noheader = "noheader" in fmt
    nounits = "nounits" in fmt
    lines = []
    if not noheader:
        cols = []
        for n in names:
            unit = FIELDS[n][0]
            cols.append("%s [%s]" % (n, unit) if unit else n)
        lines.append(", ".join(cols))
    for g in selected:
        cols = []
        for n in names:
            v = FIELDS[n][1](g)
            if isinstance(v, tuple):
                val, unit = v
                if unit and not nounits:
                    cols.append("%s %s" % (val, unit) if unit != "%" else "%s %%" % val)
                else:
                    cols.append(str(val))
            else:
                cols.append(str(v))
        lines.append(", ".join(cols))
    return "\n".join(lines) + "\n"


SIDE_FIELDS = {
    "query-remapped-rows": ("gpu_uuid", "gpu_bus_id", "remapped_rows.correctable", "remapped_rows.uncorrectable",
                            "remapped_rows.pending", "remapped_rows.failure"),
    "query-compute-apps": ("gpu_name", "gpu_uuid", "gpu_bus_id", "gpu_serial", "pid", "process_name", "used_memory"),
}


def side_query(settings, selected, mode, fields, fmt):
    """--query-remapped-rows (one row per GPU) and --query-compute-apps (a row per GPU and process)."""
    for f in fields:
        if f not in SIDE_FIELDS[mode]:
            raise Exit(2, 'Field "%s" is not a valid field to query.\n\n' % f)
    mib = "" if "nounits" in fmt else " MiB"
    if mode == "query-remapped-rows":
        rows = [{"gpu_uuid": g.uuid, "gpu_bus_id": g.bus_id, "remapped_rows.correctable": "0",
                 "remapped_rows.uncorrectable": str(fault(g, "ecc_uncorrectable", 0)),
                 "remapped_rows.pending": "Yes" if fault(g, "remap_pending") else "No",
                 "remapped_rows.failure": "No"} for g in selected]
    else:
        rows = [{"gpu_uuid": g.uuid, "gpu_bus_id": g.bus_id, "pid": str(p["pid"]), "process_name": p["name"],
                 "used_memory": "%d%s" % (p["used_mib"], mib), "gpu_name": g.name, "gpu_serial": g.serial}
                for g in selected for p in g.processes]
    lines = [] if "noheader" in fmt else [", ".join(f + (" [MiB]" if f == "used_memory" else "") for f in fields)]
    lines += [", ".join(r[f] for f in fields) for r in rows]
    return "\n".join(lines) + ("\n" if lines else "")


def parse_format(value):
    mods = [m.strip() for m in value.split(",") if m.strip()]
    for m in mods:
        if m not in ("csv", "noheader", "nounits"):
            raise Exit(2, "Format modifier is not recognized.\n")
    return set(mods)


# ----------------------------------------------------------------- outputs

def version_text(s):
    drv = str(s["driver_version"])
    nvml = ".".join(drv.split(".")[:2])
    return ("NVIDIA-SMI version  : %s\nNVML version        : %s\n"
            "DRIVER version      : %s\nCUDA Version        : %s\n" % (drv, nvml, drv, s["cuda_version"]))


def list_text(selected):
    return "".join("GPU %d: %s (UUID: %s)\n" % (g.index, g.name, g.uuid) for g in selected)


def _cell(left, right, width):
    return left + " " * max(width - len(left) - len(right), 1) + right


def table_text(s, selected):
    sep = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    wide = "+" + "-" * 89 + "+"
    out = [time.asctime() + "       ", wide,
           "| NVIDIA-SMI %-23sDriver Version: %-15sCUDA Version: %-9s|" % (
               s["driver_version"], s["driver_version"], s["cuda_version"]),
           sep,
           "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
           "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
           "|                                         |                        |               MIG M. |",
           "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|"]
    for g in selected:
        name = g.name if len(g.name) <= 29 else g.name[:26] + "..."
        out.append("|%4d  %-29s%4s  |   %-16s %3s |%21s |" % (g.index, name, "On", g.bus_id, "Off", "0"))
        usage = "%dMiB / %dMiB " % (g.memory_used, g.memory_total)
        out.append("|%s|%s|%s|" % (
            _cell(" N/A   32C    P8", "28W / %4dW " % g.power_limit, 41),
            usage.rjust(24), "      0%      Default "))
        out.append("|%s|%s|%21s |" % (" " * 41, " " * 24, "Disabled"))
        out.append(sep)
    out += ["", wide,
            "| Processes:" + " " * 78 + "|",
            "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
            "|        ID   ID                                                               Usage      |",
            "|" + "=" * 89 + "|"]
    procs = [(g, p) for g in selected for p in g.processes]
    for g, p in procs:
        name = p["name"] if len(p["name"]) <= 35 else "..." + p["name"][-32:]
        out.append("|%5d   N/A  N/A%16d      C   %-36s%10s |" % (g.index, p["pid"], name, "%dMiB" % p["used_mib"]))
    if not procs:
        out.append("|  No running processes found" + " " * 61 + "|")
    out.append(wide)
    return "\n".join(out) + "\n"


def topo_text(all_gpus):
    n = len(all_gpus)
    head = "\t\x1b[4m" + "".join("GPU%d\t" % i for i in range(n)) + \
        "CPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m"
    lines = [head]
    for a in all_gpus:
        cells = []
        for b in all_gpus:
            if a is b:
                cells.append(" X ")
            elif a.numa == b.numa:
                cells.append("NODE")
            else:
                cells.append("SYS")
        lines.append("GPU%d\t%s\t%s\t%d\t\tN/A" % (
            a.index, "\t".join(cells), _CPU_AFFINITY[a.numa % 2], a.numa))
    lines += ["", "Legend:", "",
              "  X    = Self",
              "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
              "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
              "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
              "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
              "  PIX  = Connection traversing at most a single PCIe bridge",
              "  NV#  = Connection traversing a bonded set of # NVLinks"]
    return "\n".join(lines) + "\n"


def query_text(s, selected):
    out = ["", "==============NVSMI LOG==============", "",
           "Timestamp                                 : %s" % time.asctime(),
           "Driver Version                            : %s" % s["driver_version"],
           "CUDA Version                              : %s" % s["cuda_version"], "",
           "Attached GPUs                             : %d" % int(s["count"])]
    for g in selected:
        out += ["GPU %s" % g.bus_id,
                "    Product Name                          : %s" % g.name,
                "    Product Brand                         : NVIDIA RTX",
                "    Product Architecture                  : Blackwell",
                "    Persistence Mode                      : Enabled",
                "    Serial Number                         : %s" % g.serial,
                "    GPU UUID                              : %s" % g.uuid,
                "    Minor Number                          : %d" % g.index,
                "    PCI",
                "        Bus Id                            : %s" % g.bus_id,
                "    FB Memory Usage",
                "        Total                             : %d MiB" % g.memory_total,
                "        Reserved                          : 0 MiB",
                "        Used                              : %d MiB" % g.memory_used,
                "        Free                              : %d MiB" % g.memory_free,
                ""]
    return "\n".join(out) + "\n"


HELP = """NVIDIA System Management Interface -- v{drv}

nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...

    -h,   --help                Print usage information and exit.
          --version             Print version information and exit.
    -L,   --list-gpus           Display a list of GPUs connected to the system.
    -q,   --query               Display GPU or Unit info.
    -i,   --id=                 Target a specific GPU.
    --query-gpu                 Information about GPU.
    --format=                   Comma separated list of format options:
                                  csv - comma separated values (MANDATORY)
                                  noheader - skip the first line with column headers
                                  nounits - don't print units for numerical values
    topo -m                     Display the GPUDirect communication matrix for the system.

(dsv4deploy CT200 twin)
"""


# -------------------------------------------------------------------- main

def _unknown(opt):
    return Exit(255, "ERROR: Option %s is not recognized. Please run 'nvidia-smi -h'.\n\n" % opt)


def _take_value(argv, i, opt):
    """Value of ``--opt=value`` / ``--opt value`` / ``-i value``; returns (value, next_i)."""
    arg = argv[i]
    if "=" in arg and arg.startswith("--"):
        return arg.split("=", 1)[1], i + 1
    if i + 1 >= len(argv):
        raise Exit(2, "Option %s requires an argument.\n" % opt)
    return argv[i + 1], i + 2


def run(argv, settings=None):
    """Return (exit_code, stdout_text)."""
    if settings is None:
        settings = load_settings()
    if not settings.get("driver_installed", True):
        raise Exit(9, DRIVER_FAILED)

    mode = "table"
    ids = None
    query_fields = None
    fmt = None
    topo_matrix = False
    i = 0
    if argv and argv[0] == "topo":
        mode = "topo"
        for a in argv[1:]:
            if a in ("-m", "--matrix"):
                topo_matrix = True
            else:
                raise _unknown(a)
        argv = []
    while i < len(argv):
        a = argv[i]
        opt = a.split("=", 1)[0] if a.startswith("--") else a
        if opt in ("-h", "--help"):
            return 0, HELP.format(drv=settings["driver_version"])
        if opt == "--version":
            mode = "version"
            i += 1
        elif opt in ("-L", "--list-gpus"):
            mode = "list"
            i += 1
        elif opt in ("-q", "--query"):
            mode = "query"
            i += 1
        elif opt in ("-i", "--id"):
            ids, i = _take_value(argv, i, opt)
        elif a.startswith("-i") and len(a) > 2 and a[2:].replace(",", "").isdigit():
            ids, i = a[2:], i + 1
        elif opt == "--query-gpu":
            value, i = _take_value(argv, i, opt)
            query_fields = [f.strip() for f in value.split(",") if f.strip()]
            mode = "query-gpu"
        elif opt in ("--query-remapped-rows", "--query-compute-apps"):
            value, i = _take_value(argv, i, opt)
            query_fields = [f.strip() for f in value.split(",") if f.strip()]
            mode = opt[2:]
        elif opt == "--format":
            value, i = _take_value(argv, i, opt)
            fmt = parse_format(value)
        else:
            raise _unknown(a)

    if mode == "version":
        return 0, version_text(settings)
    if mode == "topo":
        if not topo_matrix:
            return 0, "\n" * 6
        all_gpus = gpus(settings)
        if not all_gpus:
            raise Exit(6, "No devices were found\n")
        return 0, topo_text(all_gpus)

    all_gpus = gpus(settings)
    selected = select(all_gpus, ids)
    if not selected:
        raise Exit(6, "No devices were found\n")
    if mode == "list":
        return 0, list_text(selected)
    if mode == "query":
        return 0, query_text(settings, selected)
    if mode in ("query-remapped-rows", "query-compute-apps"):
        return 0, side_query(settings, selected, mode, query_fields, fmt if fmt is not None else {"csv"})
    if mode == "query-gpu":
        if not query_fields:
            raise Exit(2, "No query fields were given.\n")
        return 0, query_gpu(selected, query_fields, fmt if fmt is not None else {"csv"})
    if fmt is not None:
        raise Exit(2, "Option --format requires --query-gpu.\n")
    return 0, table_text(settings, selected)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        code, text = run(argv)
    except Exit as e:
        code, text = e.code, e.message
    sys.stdout.write(text)
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
