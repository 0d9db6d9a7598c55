"""The tune's product: `profiles/<base>-tuned.yaml`, which `extends` the base and holds only the
chosen values (and a description saying what they are).

The writer proves what it wrote: it loads the new file through the ordinary loader, validates
it, and checks that it means exactly the chosen candidate; if not, the file is put back as it
was and the tune fails. It overwrites only a file an earlier tune wrote (first line's marker),
never a hand-written profile of the same name.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import yaml

from dsv4deploy.profile.boundary import TEXT, check_name
from dsv4deploy.profile.errors import Problem, ProfileError
from dsv4deploy.profile.load import load_profile
from dsv4deploy.profile.validate import validate
from dsv4deploy.tune.candidates import Candidate
from dsv4deploy.tune.knobs import KNOBS

HEADER = "# yaml-language-server: $schema=../dsv4deploy/schema/profile.schema.json"
MARKER = "# Written by `dsv4deploy tune`"
SUFFIX = "-tuned"


def tuned_name(base: str) -> str:
    """`<base>-tuned`, or a ProfileError when that is no valid profile name (too long)."""
    name = base + SUFFIX
    bad = check_name(name)
    if bad:
        raise ProfileError([Problem(f"the tuned profile would be named {name!r}: {bad}", path="profile",
                                    file="<command line>")])
    return name


def check_target(name: str, directory: Path) -> Path:
    """Where the tuned profile goes in DIRECTORY; ProfileError if a profile not written by tune is there."""
    path = directory / f"{name}.yaml"
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise ProfileError([Problem("is in the way (a symlink or not a file): the tuned profile is not written "
                                    "through it", file=str(path), line=1)])
    if path.exists():
        head = path.read_text(errors="replace").splitlines()[:3]
        if MARKER not in "\n".join(head):
            raise ProfileError([Problem(f"exists and was not written by dsv4deploy tune (no '{MARKER}' line at "
                                        "the top): rename it, or remove it, before tuning", file=str(path), line=1)])
    return path


def _line(text: str) -> str:
    """One header line: refused if anything in it is not one printable line."""
    bad = TEXT.check(text)
    if bad:
        raise ProfileError([Problem(f"tuned profile header refused: {bad}", file="<tune>")])
    return text


def tuned_text(base_name: str, cand: Candidate, *, description: str, notes: list[str]) -> str:
    body: dict = {"extends": base_name, "description": description[:1024]}
    for knob, value in cand.overrides.items():
        KNOBS[knob].apply(body, value)
    lines = [HEADER, f"{MARKER} from {base_name}: candidate {cand.id}, only the chosen values."]
    lines += [_line(f"# {n}") for n in notes]
    return "\n".join(lines) + "\n" + yaml.safe_dump(body, sort_keys=False, default_flow_style=False, width=4096)


def _same(a: dict, b: dict) -> bool:
    strip = lambda d: {k: v for k, v in d.items() if k != "description"}  # noqa: E731
    return strip(a) == strip(b)


def write_tuned(base_name: str, cand: Candidate, *, description: str, notes: list[str],
                directory: Path) -> Path:
    """Write the tuned profile into DIRECTORY, load and validate it back, or restore what was
    there and raise."""
    name = tuned_name(base_name)
    path = check_target(name, directory)
    text = tuned_text(base_name, cand, description=description, notes=notes)
    previous = path.read_text() if path.exists() else None
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".yaml", dir=directory)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    try:
        loaded = load_profile(name, directory)
        report = validate(loaded)
        if report.errors:
            raise ProfileError(report.errors)
        if not _same(loaded.data, cand.profile.data):
            raise ProfileError([Problem(f"reads back as another configuration than candidate {cand.id}: not kept",
                                        file=str(path), line=1)])
    except ProfileError:
        if previous is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(previous)
        raise
    return path
