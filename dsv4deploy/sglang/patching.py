"""The shell commands that put a patch into an installed tree (a venv's site-packages), as pure
functions: the deploy's venv step (dsv4deploy/host/: the PatchesApplied fact and the
patch_applied operation) sends exactly these strings to the host, and the tests run the same
strings locally against real SGLang wheels.

Applying is all or nothing:

1. the patch file's sha256 is the pinned one (`sha256sum -c`);
2. a forward `--dry-run` over the whole patch succeeds: every hunk of every file applies
   (exact context, offsets allowed, no fuzz);
3. only then the real `patch` runs, with no backup files (`--no-backup-if-mismatch`) and no
   reject files (`-r -`);
4. a reverse `--dry-run` proves the patch is in.

A patch that does not apply fails at step 1 or 2, before any file is written: no `.rej`, no
`.orig`, no half-applied tree. "Already applied" is a reverse dry-run that succeeds; then
nothing runs at all.

Fuzz is off (`-F0`) in every step. With GNU patch's default fuzz of 2, a hunk whose surrounding
lines moved can land in the wrong place and still "succeed": PR #25820's diff against SGLang
0.5.13.post1 puts a dataclass field after a function's `return` that way
(data/patches/README.md). Offsets (the same lines, elsewhere in the file) stay allowed.
"""

from __future__ import annotations

import shlex

APPLIED = "applied"
MISSING = "missing"


def _q(value) -> str:
    return shlex.quote(str(value))


def patch_cmd(patch_file: str, strip: int, *options: str) -> str:
    """`patch -pN` on `patch_file` with the options every step shares: no fuzz, no questions
    (`-f`: never guess that a patch is reversed, never prompt)."""
    return " ".join(["patch", f"-p{int(strip)}", "-F0", "-f", *options, "<", _q(patch_file)])


def reverse_dry_run(patch_file: str, strip: int) -> str:
    """Succeeds only when every hunk of the patch is in the tree (run in the tree's root)."""
    return patch_cmd(patch_file, strip, "-s", "-R", "--dry-run")


def forward_dry_run(patch_file: str, strip: int) -> str:
    """Succeeds only when every hunk applies; writes nothing (run in the tree's root). Not
    silent: on failure its report names each file and hunk that does not apply."""
    return patch_cmd(patch_file, strip, "--forward", "--dry-run")


def apply(patch_file: str, strip: int) -> str:
    """The real apply: no backups (.orig), rejects discarded (-r -), never reversed (--forward)."""
    return patch_cmd(patch_file, strip, "-s", "--forward", "--no-backup-if-mismatch", "-r", "-")


def state_command(directory: str, patch_file: str, strip: int) -> str:
    """Prints `applied` when the patch file exists and its reverse dry-run succeeds in
    `directory`, else `missing`. Changes nothing."""
    return (f"cd {_q(directory)} && if [ -f {_q(patch_file)} ] && "
            f"{reverse_dry_run(patch_file, strip)} >/dev/null 2>&1; "
            f"then echo {APPLIED}; else echo {MISSING}; fi")


def parse_state(lines) -> bool:
    """state_command's output (a list of lines) -> True when the patch is in."""
    return bool(lines) and lines[0].strip() == APPLIED


def _fail(message: str) -> str:
    return f"{{ echo {_q(message)} >&2; exit 1; }}"


def apply_command(directory: str, patch_file: str, strip: int, sha256: str | None = None,
                  label: str | None = None) -> str:
    """One command that applies `patch_file` in `directory` all or nothing (module docstring):
    exit 0 when the patch went in and the reverse dry-run proves it, exit 1 with a message on
    stderr otherwise. A tree the patch does not apply to is left exactly as it was.

    A tree that already carries the patch also fails here (its forward dry-run fails): callers
    ask state_command first and run this only for `missing`."""
    what = label or patch_file
    steps = []
    if sha256:
        steps.append(f"printf '%s  %s\\n' {_q(sha256)} {_q(patch_file)} | sha256sum -c --status || "
                     + _fail(f"{what}: sha256 is not {sha256}; nothing was changed"))
    # The dry-run's own report (which file, which hunk) goes to stderr with the message.
    steps.append(f"out=$({forward_dry_run(patch_file, strip)} 2>&1) || "
                 f"{{ printf '%s\\n' \"$out\" >&2; "
                 f"echo {_q(f'{what}: does not apply to {directory}; nothing was changed')} >&2; exit 1; }}")
    steps.append(f"{apply(patch_file, strip)} || "
                 + _fail(f"{what}: patch failed after a clean dry-run in {directory}"))
    steps.append(f"{reverse_dry_run(patch_file, strip)} >/dev/null 2>&1 || "
                 + _fail(f"{what}: applied, but its reverse dry-run fails in {directory}"))
    return f"cd {_q(directory)} && " + " && ".join(f"{{ {step}; }}" for step in steps)
