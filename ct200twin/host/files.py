"""Files written into twin roots from this machine.  Code in a twin runs as root and may plant
symlinks there, so every write checks that it stays inside its root (``_guard``) and replaces
the file atomically (``_write``); a root is deleted only with nothing mounted under it
(``_safe_rmtree``); folders inside a root are opened below a descriptor without following a link
(``_open_dirs``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

from ct200twin.host.errors import SimError
from ct200twin.host.layout import sim_dir


def _twin_root_of(path: Path) -> Path | None:
    """The twin (or cached) root that PATH lies in, if any."""
    try:
        rel = path.relative_to(sim_dir())
    except ValueError:
        return None
    parts = rel.parts
    if len(parts) >= 3 and parts[0] == "hosts" and parts[2] in ("root", "root.tmp"):
        return sim_dir().joinpath(*parts[:3])
    if len(parts) >= 2 and parts[0] == "rootfs":
        return sim_dir().joinpath(*parts[:2])
    return None


def _guard(path: Path, is_dir: bool = False) -> Path:
    """Refuse PATH if a symlink inside a twin root would lead it out of the root.

    The twins are written to from this machine while code running inside them
    (as root) may have changed them: an absolute symlink there points here.
    """
    root = _twin_root_of(path)
    if root is None:
        return path
    real_root = root.resolve()
    probe = path if is_dir else path.parent      # a file's own symlink gets replaced, not followed
    while not probe.exists() and probe != root:
        probe = probe.parent
    real = probe.resolve()
    if real != real_root and real_root not in real.parents:
        raise SimError(f"refusing to write {path}: a symlink in the twin leads to {real}")
    return path


def _write(path: Path, data: str | bytes, mode: int | None = None) -> None:
    _guard(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    if isinstance(data, str):
        tmp.write_text(data)
    else:
        tmp.write_bytes(data)
    if mode is not None:
        os.chmod(tmp, mode)
    os.replace(tmp, path)


def _mkdir(path: Path) -> Path:
    _guard(path, is_dir=True).mkdir(parents=True, exist_ok=True)
    return _guard(path, is_dir=True)


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve())
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            mnt = line.split()[1].replace("\\040", " ")
            if mnt == prefix or mnt.startswith(prefix + "/"):
                out.append(mnt)
    return sorted(out, key=len, reverse=True)


def _safe_rmtree(path: Path) -> None:
    if not path.exists() and not path.is_symlink():
        return
    for mnt in _mounts_under(path):
        subprocess.run(["umount", "-l", mnt], check=False)
    if _mounts_under(path):
        raise SimError(f"refusing to delete {path}: something is still mounted under it")
    shutil.rmtree(path)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def _open_dirs(fd: int, names: list[str], create: bool = True) -> int:
    """The folder NAMES below the folder FD, made (root's, 0755) where missing (CREATE), each opened
    without following a link; a new descriptor (FD stays open)."""
    fd = os.dup(fd)
    for name in names:
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=fd)
        try:
            child = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        finally:
            os.close(fd)
        fd = child
    return fd
