"""The GPU memory a twin server holds, where the twin's nvidia-smi sees it: a stand-in for the
driver's per-process accounting. On CT200 the driver knows what each CUDA process holds on each
GPU and gives it back when the process ends; here the server writes ``<pid>.json`` into
``/dev/shm/dsv4deploy-twin-gpu/`` (made at every twin boot, mode 1777; env
``DSV4_TWIN_GPU_HOLDS`` moves it), and ct200twin/host/nvidia_smi.py counts a file only while its
PID still runs the process that wrote it. So a server stopped, crashed or SIGKILLed holds nothing,
as on the host, whether or not it removed its file.

/dev/shm, not /run: the server's unit has ProtectSystem=strict (/run read-only) but /dev stays
writable, as NCCL's shared-memory transport needs on the host. Without the folder (a server run
outside a twin: tests, benches) nothing is written. Standard library only.

The file: ``{"pid": N, "start": <field 22 of /proc/N/stat>, "name": <executable>,
"gpus": {"<CUDA_VISIBLE_DEVICES entry or index>": MiB, ...}}``.
"""

from __future__ import annotations

import json
import os
import sys

HOLDS_DIR = "/dev/shm/dsv4deploy-twin-gpu"
HOLDS_ENV = "DSV4_TWIN_GPU_HOLDS"


def start_ticks(pid: int | str = "self") -> str | None:
    """Field 22 of /proc/PID/stat (start time since boot, in clock ticks): with the PID, it names
    one process for good (a PID is reused, this pair is not). None where /proc does not say."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[19] if len(fields) > 19 else None


def server_gpus(count: int, gpus_visible: int, base_gpu_id: int = 0, gpu_id_step: int = 1,
                cuda_visible_devices: str | None = None) -> list[str]:
    """The GPUs a server's COUNT ranks use, as nvidia-smi names them: rank i takes CUDA device
    BASE_GPU_ID + i * GPU_ID_STEP, and CUDA device d is entry d of CUDA_VISIBLE_DEVICES (an index
    or UUID, what nvidia-smi's -i takes), or nvidia-smi's index d without it (GPUS_VISIBLE GPUs)."""
    if cuda_visible_devices is not None and cuda_visible_devices.strip():
        visible = [x.strip() for x in cuda_visible_devices.split(",") if x.strip()]
    else:
        visible = [str(i) for i in range(gpus_visible)]
    devices = [base_gpu_id + i * max(gpu_id_step, 1) for i in range(count)]
    return [visible[d] for d in devices if 0 <= d < len(visible)]


class GpuHold:
    """What this process holds on GPUS, written for the twin's nvidia-smi (see the module)."""

    def __init__(self, gpus: list[str], directory: str | None = None):
        self.gpus = list(gpus)
        self.directory = directory or os.environ.get(HOLDS_ENV) or HOLDS_DIR
        self.path = os.path.join(self.directory, f"{os.getpid()}.json")
        self.mib = 0

    def hold(self, gib_per_gpu: float) -> None:
        """Hold GIB_PER_GPU on each of the GPUs from now on (replaces what was held before)."""
        self.mib = int(round(gib_per_gpu * 1024))
        if not self.gpus or not os.path.isdir(self.directory):
            return
        doc = {"pid": os.getpid(), "start": start_ticks(), "name": sys.executable or "python3",
               "gpus": {g: self.mib for g in self.gpus}}
        tmp = f"{self.path}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(json.dumps(doc, sort_keys=True) + "\n")
            os.chmod(tmp, 0o644)   # the unit's UMask=0027 would keep the watch's and operator's nvidia-smi out
            os.replace(tmp, self.path)
        except OSError:
            pass                   # a twin without the folder's rights: nvidia-smi shows nothing held

    def release(self) -> None:
        """Hold nothing (the process ends): what the driver does when a CUDA process exits."""
        self.mib = 0
        try:
            os.unlink(self.path)
        except OSError:
            pass
