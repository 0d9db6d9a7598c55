"""GPU inventory from ``nvidia-smi --query-gpu`` and the checks a profile puts on it.

Pure functions (no subprocess, no I/O): the deploy reads nvidia-smi's output over SSH and
hands the text here, the CLI runs nvidia-smi locally. Standard library only.

    gpus = parse_query(text)                       # text of QUERY_ARGS (or its header/unit forms)
    problems = check_gpus(gpus, **profile_expectations(profile.data))
    if problems: refuse, one line per problem

`parse_query` understands the four `--format=csv[,noheader][,nounits]` forms, the
placeholders nvidia-smi prints for values it cannot read (``[N/A]``, ``[Not Supported]``,
``[Insufficient Permissions]``, ``[Unknown Error]``, ``[GPU is lost]``), blank lines, and an
optional ``mig.mode.current`` column (QUERY_FIELDS_MIG) so that MIG-enabled GPUs are refused.
It raises `NvidiaSmiError` with nvidia-smi's own words for the failures it prints instead
of rows (driver not loaded, NVML/driver mismatch, unknown field on old drivers).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field

# The query the brief names; the deploy and the CLI use QUERY_FIELDS_MIG (one more column).
QUERY_FIELDS: tuple[str, ...] = ("index", "name", "uuid", "compute_cap", "memory.total",
                                 "memory.used", "driver_version")
QUERY_FIELDS_MIG: tuple[str, ...] = QUERY_FIELDS + ("mig.mode.current",)


def query_args(fields: tuple[str, ...] = QUERY_FIELDS_MIG, header: bool = False,
               units: bool = False) -> list[str]:
    """argv of the nvidia-smi query whose output `parse_query` reads."""
    fmt = "csv" + ("" if header else ",noheader") + ("" if units else ",nounits")
    return ["nvidia-smi", f"--query-gpu={','.join(fields)}", f"--format={fmt}"]


QUERY_ARGS = query_args()

# nvidia-smi's spellings of "no value", with or without brackets.
_PLACEHOLDER = re.compile(r"\[?(N/A|Not Supported|Insufficient Permissions|Unknown Error|"
                          r"GPU is lost|Requested functionality has been deprecated)\]?", re.I)
_ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id"}
# Output nvidia-smi prints instead of rows: (pattern, what to tell the operator).
_FAILURES = [
    (re.compile(r"couldn't communicate with the NVIDIA driver", re.I),
     "nvidia-smi cannot talk to the NVIDIA driver: the driver is not installed or not loaded "
     "(after a driver install the host may need a reboot)"),
    (re.compile(r"Driver/library version mismatch", re.I),
     "NVML and the loaded kernel driver differ (driver upgraded without a reboot): reboot the host"),
    (re.compile(r"Failed to initialize NVML", re.I), "nvidia-smi could not initialize NVML"),
    (re.compile(r"No devices were found", re.I), "nvidia-smi found no GPU"),
    (re.compile(r'Field "([^"]+)" is not a valid field to query', re.I),
     "this nvidia-smi does not know a queried field (driver too old for compute_cap: "
     "needs R510 or newer)"),
]


class NvidiaSmiError(ValueError):
    """nvidia-smi printed an error, or output that is not the expected CSV."""


@dataclass(frozen=True)
class GpuInfo:
    """One row of the query. A value nvidia-smi could not read is None, and `unreadable`
    names the field and what nvidia-smi printed for it (``memory.used=[N/A]``)."""

    index: int | None
    name: str | None
    uuid: str | None
    compute_cap: str | None
    memory_total_mib: int | None
    memory_used_mib: int | None
    driver_version: str | None
    mig_mode: str | None = None          # "Enabled" / "Disabled", None when not queried or N/A
    unreadable: tuple[str, ...] = field(default=())

    @property
    def memory_free_mib(self) -> int | None:
        if self.memory_total_mib is None or self.memory_used_mib is None:
            return None
        return self.memory_total_mib - self.memory_used_mib

    @property
    def mig_enabled(self) -> bool:
        return (self.mig_mode or "").lower() == "enabled"

    def as_dict(self) -> dict:
        d = asdict(self)
        d["unreadable"] = list(self.unreadable)
        d["memory_free_mib"] = self.memory_free_mib
        return d


def _canon(column: str) -> str:
    """'memory.total [MiB]' -> 'memory.total'; aliases to canonical names."""
    name = re.sub(r"\s*\[[^\]]*\]\s*$", "", column.strip()).strip().lower()
    return _ALIASES.get(name, name)


def _value(raw: str) -> str | None:
    text = raw.strip()
    if not text or _PLACEHOLDER.fullmatch(text):
        return None
    return text


def _mib(text: str, fname: str, line: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(MiB|GiB|KiB|B)?", text, re.I)
    if not m:
        raise NvidiaSmiError(f"{fname}: expected a size in MiB, got {text!r} in line {line!r}")
    number, unit = float(m.group(1)), (m.group(2) or "MiB").lower()
    scale = {"mib": 1, "gib": 1024, "kib": 1 / 1024, "b": 1 / 1048576}[unit]
    return int(round(number * scale))


def _check_failure(text: str) -> None:
    for pattern, meaning in _FAILURES:
        m = pattern.search(text)
        if m:
            first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
            raise NvidiaSmiError(f"{meaning}; nvidia-smi said: {first}")


def parse_query(csv_text: str, fields: tuple[str, ...] | None = None) -> list[GpuInfo]:
    """Rows of ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.

    Columns come from the header line when there is one (any order, with or without units),
    else from `fields`; without `fields`, a row of 7 columns is read as QUERY_FIELDS and one
    of 8 as QUERY_FIELDS_MIG. Sizes with units (``143771 MiB``) are read as MiB. Raises
    NvidiaSmiError for nvidia-smi's error messages and for rows of the wrong shape.
    """
    _check_failure(csv_text)
    lines = [ln.rstrip("\r") for ln in csv_text.splitlines() if ln.strip()]
    columns: list[str] | None = list(fields) if fields else None
    known = set(QUERY_FIELDS_MIG) | {"pci.bus_id", "memory.free", "count"}
    if lines and any(_canon(c) in known for c in lines[0].split(",")):   # a header line
        columns = [_canon(c) for c in lines[0].split(",")]
        lines = lines[1:]
    gpus: list[GpuInfo] = []
    for line in lines:
        cells = [c.strip() for c in line.split(",")]
        cols = columns
        if cols is None:
            cols = {len(QUERY_FIELDS): list(QUERY_FIELDS),
                    len(QUERY_FIELDS_MIG): list(QUERY_FIELDS_MIG)}.get(len(cells))
        if cols is None or len(cells) != len(cols):
            want = len(cols) if cols else f"{len(QUERY_FIELDS)} or {len(QUERY_FIELDS_MIG)}"
            raise NvidiaSmiError(f"expected {want} comma-separated columns, got {len(cells)} "
                                 f"in line {line!r}")
        row = dict(zip([_canon(c) for c in cols], cells))
        unreadable = tuple(f"{k}={v}" for k, v in row.items() if _value(v) is None)
        vals = {k: _value(v) for k, v in row.items()}
        index = vals.get("index")
        if index is not None and not index.isdigit():
            raise NvidiaSmiError(f"index: expected an integer, got {index!r} in line {line!r}")
        total = vals.get("memory.total")
        used = vals.get("memory.used")
        gpus.append(GpuInfo(
            index=int(index) if index is not None else None,
            name=vals.get("name"),
            uuid=vals.get("uuid"),
            compute_cap=vals.get("compute_cap"),
            memory_total_mib=_mib(total, "memory.total", line) if total is not None else None,
            memory_used_mib=_mib(used, "memory.used", line) if used is not None else None,
            driver_version=vals.get("driver_version"),
            mig_mode=vals.get("mig.mode.current"),
            unreadable=unreadable,
        ))
    return gpus


def driver_branch(version_str: str | None) -> int:
    """'580.159.04' -> 580, '570.86.10' -> 570, '580' -> 580. ValueError if unreadable."""
    m = re.fullmatch(r"\s*(\d+)(?:\.\d+)*\s*", version_str or "")
    if not m:
        raise ValueError(f"not a driver version: {version_str!r}")
    return int(m.group(1))


def _cap(value: str | float | None) -> tuple[int, ...] | None:
    m = re.fullmatch(r"\s*(\d+)(?:\.(\d+))?\s*", str(value) if value is not None else "")
    return (int(m.group(1)), int(m.group(2) or 0)) if m else None


def check_gpus(gpus: list[GpuInfo], *, tp_size: int, compute_cap: str | None = None,
               min_free_mib: int | None = None, min_driver_branch: int | None = None) -> list[str]:
    """Why this host cannot run the profile; [] when it can.

    SGLang puts TP rank i on GPU i, so compute capability and free memory are checked on the
    first `tp_size` GPUs by index (MIG-enabled GPUs do not count: TP needs whole GPUs); the
    driver is checked once (all GPUs share it). A value nvidia-smi could not read fails its
    check: the preflight does not guess.
    """
    problems: list[str] = []
    if not gpus:
        return ["nvidia-smi lists no GPU"]
    ordered = sorted(gpus, key=lambda g: (g.index is None, g.index if g.index is not None else 0))
    for g in ordered:
        if g.mig_enabled:
            problems.append(f"GPU {g.index}: MIG mode is enabled; tensor parallelism needs whole "
                            f"GPUs (disable it: nvidia-smi -i {g.index} -mig 0, then reset the GPU)")
    whole = [g for g in ordered if not g.mig_enabled]
    if len(whole) < tp_size:
        listed = ", ".join(f"{g.index}: {g.name}" for g in ordered)
        problems.append(f"tp_size {tp_size} needs {tp_size} GPUs; nvidia-smi lists {len(whole)} "
                        f"usable ({listed})")
    used = whole[:tp_size]
    if compute_cap is not None:
        want = _cap(compute_cap)
        for g in used:
            have = _cap(g.compute_cap)
            if have is None:
                problems.append(f"GPU {g.index} ({g.name}): compute capability unreadable "
                                f"({_raw(g, 'compute_cap')}); expected {compute_cap}")
            elif have != want:
                problems.append(f"GPU {g.index} ({g.name}): compute capability {g.compute_cap}, "
                                f"expected {compute_cap} (the profile's hardware.gpu; kernels and "
                                f"MoE backend are chosen for it; --expect-compute-cap overrides)")
    if min_free_mib is not None:
        for g in used:
            free = g.memory_free_mib
            if free is None:
                problems.append(f"GPU {g.index} ({g.name}): free memory unknown "
                                f"(memory.total={_raw(g, 'memory.total')}, "
                                f"memory.used={_raw(g, 'memory.used')}); "
                                f"the profile needs {min_free_mib:,} MiB free")
            elif free < min_free_mib:
                problems.append(f"GPU {g.index} ({g.name}): {free:,} MiB free of "
                                f"{g.memory_total_mib:,} MiB ({g.memory_used_mib:,} MiB in use); the "
                                f"profile's static budget needs {min_free_mib:,} MiB (see "
                                f"nvidia-smi --query-compute-apps=pid,used_memory --format=csv)")
    if min_driver_branch is not None:
        versions = sorted({g.driver_version for g in ordered if g.driver_version})
        if not versions:
            problems.append(f"driver version unreadable; the profile needs branch >= {min_driver_branch}")
        for v in versions:
            try:
                branch = driver_branch(v)
            except ValueError:
                problems.append(f"driver version {v!r} unreadable; the profile needs branch >= "
                                f"{min_driver_branch}")
                continue
            if branch < min_driver_branch:
                problems.append(f"driver {v} (branch {branch}) is older than branch "
                                f"{min_driver_branch} that the profile needs")
    return problems


def _raw(g: GpuInfo, fname: str) -> str:
    for item in g.unreadable:
        k, _, v = item.partition("=")
        if k == fname:
            return v or "empty"
    return "missing"


def profile_expectations(data: dict, *, compute_cap: str | None = None,
                         min_driver_branch: int | None = None) -> dict:
    """`check_gpus` keyword arguments for a resolved profile (`Profile.data`).

    tp_size: server.tp_size / server.nnodes (GPUs on this host); compute_cap: the catalog
    GPU's (hardware.gpu), unless given; min_free_mib: the static budget,
    ceil(mem_fraction_static x the catalog GPU's memory); min_driver_branch: the larger of
    the catalog GPU's minimum and the profile's driver.branch, unless given.
    """
    from dsv4deploy.profile import catalog  # data only; keeps this module importable without PyYAML

    server = data["server"]
    gpu = catalog.gpu(data["hardware"]["gpu"])
    nnodes = int(server.get("nnodes") or 1)
    branches = [gpu.min_driver_branch] + ([int(data["driver"]["branch"])]
                                          if data.get("driver", {}).get("branch") else [])
    return {
        "tp_size": int(server["tp_size"]) // nnodes,
        "compute_cap": str(compute_cap) if compute_cap is not None else str(gpu.compute_cap),
        "min_free_mib": int(math.ceil(float(server["mem_fraction_static"]) * gpu.memory_mib)),
        "min_driver_branch": int(min_driver_branch) if min_driver_branch is not None else max(branches),
    }


def format_table(gpus: list[GpuInfo]) -> str:
    """A plain-text table of the inventory (what `preflight gpus` prints)."""
    head = ("idx", "name", "cc", "total MiB", "used MiB", "free MiB", "driver", "MIG", "uuid")
    rows = [head]
    for g in gpus:
        def n(v):
            return f"{v:,}" if isinstance(v, int) else "?"
        rows.append((str(g.index) if g.index is not None else "?", g.name or "?", g.compute_cap or "?",
                     n(g.memory_total_mib), n(g.memory_used_mib), n(g.memory_free_mib),
                     g.driver_version or "?", g.mig_mode or "-", g.uuid or "?"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    right = {3, 4, 5}
    out = []
    for r in rows:
        out.append("  ".join(c.rjust(w) if i in right else c.ljust(w)
                             for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    return "\n".join(out) + "\n"
