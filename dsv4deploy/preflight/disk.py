"""Disk room for a deploy, judged per file system before anything changes.

What a deploy still writes: the checkpoint's bytes not yet on disk under the models path (its
size less what is already there, complete or partial shards alike), and the SGLang venv under
/opt when the host does not hold it yet (the version data's installed size, versions.yaml
`venv_gib`). The models path and /opt are often one file system: then their needs add up.
Pure: the host's one read (host/facts.py DiskRoom) gives each path's file system and free
space, and the bytes present.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024 ** 3
SPARE = 0.05        # on top of what is still written: logs, a shard rewritten, the venv's bytecode


@dataclass(frozen=True)
class Room:
    """The file system holding a path, as `df` and `stat` saw it on the host."""

    device: str         # stat's device number: two paths on one file system share it
    mount: str          # where it is mounted (the message names it)
    free_bytes: int


@dataclass(frozen=True)
class Need:
    """What the deploy still writes under PATH, and how the message names it."""

    path: str
    bytes: int
    what: str


def weights_need(path: str, size_gib: float, present_bytes: float | None) -> Need:
    """The checkpoint's bytes still to come under PATH (its size SIZE_GIB less PRESENT_BYTES,
    what the model folder already holds: shards, partial downloads; None: nothing read)."""
    size = int(size_gib * GIB)
    present = min(max(int(present_bytes or 0), 0), size)
    there = f", {present / GIB:.2f} GiB already there" if present else ""
    return Need(path, size - present, f"the weights' {_gib(size - present)} still to come "
                                      f"({size_gib:.2f} GiB{there})")


def venv_need(path: str, venv_gib: float, installed: bool, label: str) -> Need:
    """The venv's installed size under PATH, or nothing when the host already holds it (its marker
    says it holds exactly these installs)."""
    size = 0 if installed else int(venv_gib * GIB)
    return Need(path, size, f"the {label}'s {_gib(size)}")


def disk_problems(needs: list[Need], rooms: dict[str, Room | None]) -> list[str]:
    """One line per file system too small for what goes there (its needs summed, 5% spare on
    top), or whose free space could not be read (ROOMS[path] None); [] when all fit."""
    by_device: dict[str, tuple[Room, list[Need]]] = {}
    problems = []
    for need in needs:
        if need.bytes <= 0:
            continue
        room = rooms.get(need.path)
        if room is None:
            problems.append(f"could not read the free disk space under {need.path} (df printed nothing usable); "
                            f"{_gib(need.bytes)} are needed there for {need.what}")
            continue
        by_device.setdefault(room.device, (room, []))[1].append(need)
    for room, wanted in by_device.values():
        total = sum(n.bytes for n in wanted)
        need_bytes = int(total * (1 + SPARE))
        if room.free_bytes >= need_bytes:
            continue
        paths = " and ".join(dict.fromkeys(n.path for n in wanted))
        parts = " + ".join(n.what for n in wanted)
        problems.append(f"not enough disk for {paths} (file system at {room.mount}): {_gib(room.free_bytes)} free, "
                        f"{_gib(need_bytes)} needed: {parts} + {SPARE:.0%} spare")
    return problems


def _gib(n: int | float) -> str:
    """GiB to a tenth; under one GiB in MiB (a stand-in's small checkpoint, a nearly full disk)."""
    return f"{n / GIB:.1f} GiB" if n >= GIB or n == 0 else f"{n / 1024 ** 2:.0f} MiB"
