"""Problems found in user input, each pinned to a file, line and key path.

Bad input must end in a readable message and exit code 2, never a traceback: every
check in the pure core reports `Problem`s and raises `ProfileError` with all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsv4deploy.profile.boundary import escaped

EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


def rerun_with(setting: str, make_target: str) -> str:
    """How to run again with a `--data` setting, for pyinfra and through make (whose ARGS= passes
    pyinfra flags through): 'run again with --data X (through make: make T ARGS="--data X")'."""
    return f'run again with --data {setting} (through make: make {make_target} ARGS="--data {setting}")'


def make_target(label: str) -> str:
    """The make target that runs what a deploy lock's LABEL names ('deploy NAME' or 'rollback')."""
    what, _, name = label.partition(" ")
    return f"deploy PROFILE={name}" if what == "deploy" and name else what


@dataclass(frozen=True)
class Problem:
    """One finding: where it is (file, line, dotted key path) and what is wrong."""

    message: str
    path: str = ""
    file: str = ""
    line: int | None = None
    severity: str = "error"  # "error" fails, "warning" is listed

    def __str__(self) -> str:
        where = self.file or "<profile>"
        if self.line:
            where += f":{self.line}"
        key = f" {self.path}:" if self.path else ""
        tag = "" if self.severity == "error" else f" {self.severity}:"
        text = f"{where}:{tag}{key} {self.message}"
        return escaped(text)     # one problem, one line: what a message quotes cannot drive a terminal

    def as_dict(self) -> dict:
        return {"severity": self.severity, "file": self.file, "line": self.line,
                "path": self.path, "message": self.message}


@dataclass
class ProfileError(Exception):
    """Raised with every error found, so the user fixes them in one pass."""

    problems: list[Problem] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(str(p) for p in self.problems)
