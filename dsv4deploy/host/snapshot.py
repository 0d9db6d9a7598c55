"""Many facts in one remote command: the host's state read once per run.

A re-deploy decides from what it reads, and on a real link every command is a round trip.
`Snapshot` runs the commands of several facts (this project's and pyinfra's own `FactBase`
classes, unchanged) in one shell, each after a marker line, and hands each fact its own lines
to its own `process`: the facts stay small and testable, the host sees one command.

    snap = read(host, {"unit": (UnitInfo, {"service": "sglang"}), ...})
    snap["unit"]["ActiveState"]
"""

from __future__ import annotations

import copy
import secrets
from dataclasses import dataclass, field
from typing import Any

from pyinfra.api import DeployError, FactBase, StringCommand
from pyinfra.api.facts import FactProcessError

Query = tuple[type[FactBase], dict[str, Any]]


def _as_shell(command) -> str:
    if isinstance(command, StringCommand):
        return command.get_raw_value()
    return str(command)


FIRST = "__first"       # the key of the command a batch runs before its facts (batch_command's FIRST)


def batch_command(queries: dict[str, Query], nonce: str, first: str = "") -> str:
    """One shell script that runs every fact's command (with its `requires_command` guard) at
    the same time, each into its own file of a private temporary folder (mktemp -d: 0700, gone
    with the command), then prints each after a line `<nonce> KEY` and ends it with a newline
    and `<nonce>rc KEY STATUS`: the read takes as long as its slowest fact (nvidia-smi, the
    checkpoint's listing), not the sum of them all. FIRST: a command run before any fact (the
    deploy lock: the facts then read the host under it), printed under the key FIRST."""
    def part(key: str, command: str, file: str) -> str:
        # the marker, the output, then (on a line of its own even after output with no final
        # newline) the status: written to one file per fact, printed by one `cat` at the end
        return (f"{{ echo '{nonce} {key}'; ( {command} ) 2>/dev/null </dev/null; "
                f"printf '\\n{nonce}rc {key} %s\\n' \"$?\"; }} >\"$d/{file}\"")

    runs = [part(FIRST, first, "first")] if first else []
    for i, (key, (fact_cls, kwargs)) in enumerate(queries.items()):
        fact = fact_cls()
        command = _as_shell(fact.command(**kwargs))
        requires = fact.requires_command(**kwargs) if callable(fact.requires_command) else fact.requires_command
        if requires:
            command = f"if command -v {_as_shell(requires)} >/dev/null 2>&1; then {command}; else false; fi"
        runs.append(part(key, command, str(i)) + " &")
    return "\n".join(["d=$(mktemp -d) || exit 1", "trap 'rm -rf \"$d\"' EXIT", *runs, "wait", "cat \"$d\"/*", "true"])


def split_output(lines: list[str], nonce: str) -> dict[str, tuple[list[str], int]]:
    """batch_command's stdout -> {key: (its lines, its exit status)}."""
    out: dict[str, tuple[list[str], int]] = {}
    key, buf = None, []
    for line in lines:
        if line.startswith(f"{nonce}rc "):
            _, k, rc = line.split(" ", 2)
            if buf and buf[-1] == "":
                buf = buf[:-1]          # the newline the status line's own guard added
            out[k] = (buf, int(rc) if rc.strip().lstrip("-").isdigit() else 1)
            key, buf = None, []
        elif line.startswith(f"{nonce} "):
            key, buf = line.split(" ", 1)[1], []
        elif key is not None:
            buf.append(line)
    return out


def interpret(queries: dict[str, Query], parts: dict[str, tuple[list[str], int]]) -> dict[str, Any]:
    """Each fact's `process` on its own lines, as pyinfra would: its default when the command
    failed or printed nothing, or when its lines do not parse; except a `strict` fact (the
    release records), whose lines that do not parse stop the run with its message (DeployError):
    read as "none", they would let a new release take a number the host already holds."""
    values: dict[str, Any] = {}
    for key, (fact_cls, _kwargs) in queries.items():
        fact = fact_cls()
        lines, rc = parts.get(key, ([], 1))
        value = fact.default()
        if rc == 0 and lines:
            try:
                value = fact.process(lines)
            except (FactProcessError, ValueError, KeyError, IndexError) as exc:
                if getattr(fact, "strict", False):
                    raise DeployError(str(exc)) from None
                value = fact.default()
        values[key] = value
    return values


@dataclass
class Snapshot:
    """The values of a batch of facts, read by one command; `.commands` counts the reads;
    `.first`: the lines and exit status of the command run before them (None: none was given, or
    the batch did not run to its end)."""

    values: dict[str, Any] = field(default_factory=dict)
    commands: int = 0
    first: tuple[list[str], int] | None = None

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


def distinct(queries: dict[str, Query]) -> tuple[dict[str, Query], dict[str, str]]:
    """QUERIES with each fact and arguments once: (those to run, {a repeat's key: the key that
    runs it}). A deploy asks for its server's unit under two names (its own, and as one of the
    units it may stop); systemctl then runs once."""
    run: dict[str, Query] = {}
    repeats: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for key, (fact_cls, kwargs) in queries.items():
        signature = (fact_cls, repr(sorted(kwargs.items())))
        if signature in seen:
            repeats[key] = seen[signature]
        else:
            seen[signature] = key
            run[key] = (fact_cls, kwargs)
    return run, repeats


def read(h, queries: dict[str, Query], timeout: float = 120, first: str = "") -> Snapshot:
    """Run QUERIES on host H in one command (with the inventory's privileges), after FIRST; a
    fact asked for twice with the same arguments runs once (distinct)."""
    from dsv4deploy.host.io import run

    nonce = "__dsv4_" + secrets.token_hex(8)
    once, repeats = distinct(queries)
    ok, output = run(h, batch_command(once, nonce, first), timeout=timeout)
    parts = split_output(list(output.stdout_lines), nonce) if ok else {}
    values = interpret(once, parts)
    values = {key: copy.deepcopy(values[repeats[key]]) if key in repeats else values[key] for key in queries}
    return Snapshot(values=values, commands=1,
                    first=parts.get(FIRST) if first else None)     # None: the command did not reach it
