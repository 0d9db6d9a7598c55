"""The knobs `dsv4deploy tune` may turn: each a dotted profile key, with what changing it costs.

A knob's values are typed and bounded by the profile schema itself (the `tune.space` entries
there `$ref` the very key they set), so a value the profile would refuse is refused here with the
same words. `restart` says whether the server must restart to take a new value: every SGLang
launch flag is read once at startup and NCCL reads its environment at init, so today every knob
needs a restart. A knob is marked restart-free only when the server really applies it live.

The layout is a knob too: `replicas.count` (N replicas of `server.tp_size` GPUs behind the smg
gateway; 1 is the single server): the validator checks that the sets fit the host, and a candidate
with replicas is measured through the gateway, as users see it.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from dsv4deploy.profile.boundary import TEXT, Rule
from dsv4deploy.profile.errors import Problem, ProfileError
from dsv4deploy.profile.load import schema


@dataclass(frozen=True)
class Knob:
    """One searchable profile key."""

    name: str                 # as written in tune.space and --set: "server.context_length"
    path: tuple[str, ...]     # where it lives in the profile: ("server", "context_length")
    restart: bool = True      # the server must restart to take a new value
    absent_when: object = None   # the value that means "leave the whole block out" (1 replica: no set)

    def apply(self, data: dict, value) -> None:
        """Set the knob's key in a profile document (or drop its block for `absent_when`)."""
        if self.absent_when is not None and value == self.absent_when:
            data.pop(self.path[0], None)
            return
        for part in self.path[:-1]:
            data = data.setdefault(part, {})
        data[self.path[-1]] = value

    @property
    def schema(self) -> dict:
        """The profile schema's own definition of the key (type, bounds, enum)."""
        node = schema()
        for part in self.path:
            node = node["properties"][part]
        return node


KNOBS: dict[str, Knob] = {k.name: k for k in (
    Knob("server.context_length", ("server", "context_length")),
    Knob("server.mem_fraction_static", ("server", "mem_fraction_static")),
    Knob("server.cuda_graph_max_bs_decode", ("server", "cuda_graph_max_bs_decode")),
    Knob("server.max_running_requests", ("server", "max_running_requests")),
    Knob("server.chunked_prefill_size", ("server", "chunked_prefill_size")),
    Knob("server.moe_runner_backend", ("server", "moe_runner_backend")),
    Knob("server.disable_custom_all_reduce", ("server", "disable_custom_all_reduce")),
    Knob("server.tp_size", ("server", "tp_size")),
    Knob("nccl.preset", ("nccl", "preset")),
    # the layout: N replicas of server.tp_size GPUs behind the smg gateway (docs/replicas.md);
    # 1 is the single server, without a gateway
    Knob("replicas.count", ("replicas", "count"), absent_when=1),
)}

SET_KEY = Rule("a knob name: dotted lower-case words, e.g. server.context_length", 64,
               r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+")
SET_WORD = Rule("a --set argument: KNOB=VALUE[,VALUE...]", 4096, r"[^=]+=.*")
_INT = re.compile(r"[0-9]{1,16}")
_NUMBER = re.compile(r"[0-9]{1,16}(\.[0-9]{1,16})?|\.[0-9]{1,16}")
_BOOLS = {"true": True, "false": False}


def _cli_problem(path: str, message: str) -> ProfileError:
    return ProfileError([Problem(message, path=path, file="<command line>")])


def knob(name: str, where: str = "--set") -> Knob:
    """The knob called `name`, or a ProfileError naming it (with the closest known name)."""
    bad = SET_KEY.check(name)
    if name in KNOBS:
        return KNOBS[name]
    hint = difflib.get_close_matches(name, list(KNOBS), n=1, cutoff=0.6)
    msg = (bad + "; " if bad else f"unknown knob {name!r}; ") + (
        f"did you mean {hint[0]}?" if hint else f"knobs: {', '.join(KNOBS)}")
    raise _cli_problem(f"{where} {name}" if not bad else where, msg)


def parse_value(k: Knob, text: str, where: str):
    """One value of `k` from the command line, typed as the schema types the key."""
    spec = k.schema
    bad = TEXT.check(text)
    if bad:
        raise _cli_problem(where, bad)
    if "enum" in spec:
        if text not in spec["enum"]:
            hint = difflib.get_close_matches(text, spec["enum"], n=1)
            raise _cli_problem(where, f"{text!r} is not one of {', '.join(spec['enum'])}"
                               + (f"; did you mean {hint[0]}?" if hint else ""))
        return text
    kind = spec.get("type")
    if kind == "boolean":
        if text not in _BOOLS:
            raise _cli_problem(where, f"{text!r}: expected true or false")
        return _BOOLS[text]
    if kind == "integer":
        if not _INT.fullmatch(text):
            raise _cli_problem(where, f"{text!r}: expected a plain integer (digits only: 8192, not 8k)")
        value = int(text)
    elif kind == "number":
        if not _NUMBER.fullmatch(text):
            raise _cli_problem(where, f"{text!r}: expected a decimal number such as 0.70")
        value = float(text)
    else:  # pragma: no cover - every knob is an enum, boolean, integer or number
        raise _cli_problem(where, f"knob {k.name} has no command-line parser")
    low, high = spec.get("minimum"), spec.get("maximum")
    if (low is not None and value < low) or (high is not None and value > high) or (
            "exclusiveMinimum" in spec and value <= spec["exclusiveMinimum"]):
        lo = f"> {spec['exclusiveMinimum']}" if "exclusiveMinimum" in spec else f">= {low}"
        raise _cli_problem(where, f"{text} is out of range: {k.name} must be {lo} and <= {high}")
    return value


def parse_set(word: str) -> tuple[Knob, list]:
    """`server.context_length=8192,32768` -> (knob, [8192, 32768]); ProfileError names the key."""
    bad = SET_WORD.check(word)
    if bad:
        raise _cli_problem("--set", f"{bad} (e.g. --set server.context_length=8192,32768)")
    name, _, values = word.partition("=")
    k = knob(name.strip())
    words = [v.strip() for v in values.split(",")]
    if not values.strip() or any(not v for v in words):
        raise _cli_problem(f"--set {k.name}", "empty value: give one or more values separated by commas")
    parsed = [parse_value(k, v, f"--set {k.name}") for v in words]
    seen: list = []
    for v in parsed:
        if v in seen:
            raise _cli_problem(f"--set {k.name}", f"{v!r} is given twice")
        seen.append(v)
    if len(parsed) > 16:
        raise _cli_problem(f"--set {k.name}", f"{len(parsed)} values: at most 16 per knob")
    return k, parsed
