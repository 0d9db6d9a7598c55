"""What SGLang 0.5.23 says about GPU memory while it starts, read from its journal lines: the
host's own numbers, kept with the release (records.py `startup`) and turned into the host's
calibration (profile/calibration.py). Pure: text in, figures out.

The lines (SGLang 0.5.23's own wording, rank 0's; SGLang's "GB" are GiB, bytes / 2**30):
  Load weight end. elapsed=.. s, type=.., avail mem=A GB, mem usage=W GB.       (model_runner.py)
  KV Cache is allocated. #tokens: N, KV size: S GB                               (the pool's size)
  Memory pool end. avail mem=H GB                                   (mem_cache/kv_cache_configurator.py)
  Capture target decode CUDA graph end. bs=[..], elapsed=.. s, mem usage=G GB, avail mem=R GB.
                                                     (model_runner_components/cuda_graph_setup.py)
  max_total_num_tokens=N, chunked_prefill_size=.., ..., available_gpu_mem=R GB    (managers/scheduler.py)
and after a crash, torch's allocator message (inside SGLang's "Capture cuda graph failed: ..."):
  CUDA out of memory. Tried to allocate X GiB. GPU 0 has a total capacity of T GiB of which F GiB is free.
"""

from __future__ import annotations

import re

_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_UNITS = {"B": 1 / 1024 ** 3, "KiB": 1 / 1024 ** 2, "MiB": 1 / 1024, "GiB": 1.0, "TiB": 1024.0}
_SIZE = _NUM + r" (B|KiB|MiB|GiB|TiB)"
_RANK = re.compile(r"\bTP(\d+)\b")

_LINES = {
    "weights_gib": re.compile(r"Load weight end\..*?mem usage=" + _NUM + " GB"),
    "kv_size_gib": re.compile(r"KV Cache is allocated\..*?KV size: " + _NUM + " GB"),
    "pool_avail_gib": re.compile(r"Memory pool end\. avail mem=" + _NUM + " GB"),
    "capture_gib": re.compile(r"Capture (?:target|draft) decode CUDA graph end\..*?mem usage=" + _NUM + " GB"),
    "capture_avail_gib": re.compile(r"Capture (?:target|draft) decode CUDA graph end\..*?avail mem=" + _NUM + " GB"),
    "available_gpu_mem_gib": re.compile(r"max_total_num_tokens=\d+,.*?available_gpu_mem=" + _NUM + " GB"),
}
_TOKENS = re.compile(r"max_total_num_tokens=(\d+),")
_KV_TOKENS = re.compile(r"KV Cache is allocated\..*?#tokens: (\d+)")
_OOM = re.compile(r"CUDA out of memory\. Tried to allocate " + _SIZE + r"\. GPU \d+ has a total capacity of "
                  + _SIZE + " of which " + _SIZE + " is free")
_BEGIN = "Load weight begin."

# journalctl's grep: only these lines come back from the host (the ServerArgs line is 16 KB)
GREP_PATTERN = ("Load weight begin|Load weight end|KV Cache is allocated|Memory pool end|"
                "decode CUDA graph end|max_total_num_tokens=|CUDA out of memory")


def _gib(value: str, unit: str) -> float:
    return float(value) * _UNITS[unit]


def _rank(line: str) -> int:
    m = _RANK.search(line)
    return int(m.group(1)) if m else 0


def parse(text: str) -> dict:
    """The memory figures of the last start in TEXT (journal lines, oldest first) that logged any
    (a unit restarted after a crash may have begun another), rank 0's where lines carry a rank;
    {} when none did. `oom` is torch's message, if that start hit one."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if _BEGIN in line] or [0]
    ends = starts[1:] + [len(lines)]
    for begin, end in reversed(list(zip(starts, ends))):
        if figures := _figures(lines[begin:end]):
            return figures
    return {}


def _figures(lines: list[str]) -> dict:
    out: dict = {}
    for line in lines:
        if _rank(line) != 0:
            continue
        for key, pattern in _LINES.items():
            if key not in out and (m := pattern.search(line)):
                out[key] = float(m.group(1))
        for key, pattern in (("max_total_num_tokens", _TOKENS), ("kv_tokens", _KV_TOKENS)):
            if key not in out and (m := pattern.search(line)):
                out[key] = int(m.group(1))
    for line in lines:
        if m := _OOM.search(line):
            out["oom"] = {"tried_gib": round(_gib(m.group(1), m.group(2)), 4),
                          "capacity_gib": round(_gib(m.group(3), m.group(4)), 4),
                          "free_gib": round(_gib(m.group(5), m.group(6)), 4)}
            break
    return out


def summary(figures: dict) -> str:
    """One line for the deploy's output."""
    if "oom" in figures:
        o = figures["oom"]
        return (f"out of memory at start: tried to allocate {o['tried_gib']:.2f} GiB with {o['free_gib']:.2f} GiB "
                f"free of {o['capacity_gib']:.2f} GiB")
    parts = []
    if "max_total_num_tokens" in figures:
        parts.append(f"KV pool {figures['max_total_num_tokens']:,} tokens")
    if "capture_gib" in figures:
        parts.append(f"graph capture took {figures['capture_gib']:.2f} GiB")
    if "available_gpu_mem_gib" in figures:
        parts.append(f"{figures['available_gpu_mem_gib']:.2f} GiB left")
    return ", ".join(parts) or "no memory lines in the journal"
