"""The search space of one tune: knob values from the profile's `tune:` block, replaced per knob
by `--set` on the command line, plus the target concurrency, the budget and the halving factor.

The block itself was checked by the profile schema when the profile loaded (unknown knobs and
bad values are refused there, with file and line); this module adds what a schema cannot say
(a space with no knob, too many combinations) and remembers where each knob's values were
written, so a refused candidate points at that line.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from dsv4deploy.profile.errors import Problem, ProfileError
from dsv4deploy.profile.load import Profile
from dsv4deploy.tune.knobs import KNOBS, Knob, parse_set

MAX_CANDIDATES = 256          # each candidate may cost a server restart: more is not a search, it is a week
DEFAULT_BUDGET_S = 1800
DEFAULT_ETA = 3
BUDGET_RANGE = (60, 604800)   # as the schema's tune.budget_s
CONCURRENCY_RANGE = (1, 4096)
COMMAND_LINE = ("<command line>", None)


@dataclass(frozen=True)
class Space:
    """Knob -> values to try (in the order written), and how the search is run."""

    values: dict[str, tuple]                     # knob name -> values
    origins: dict[str, tuple[str, int | None]]   # knob name -> (file, line) of its values
    concurrency: int
    budget_s: int
    eta: int = DEFAULT_ETA
    notes: tuple[str, ...] = field(default=())

    @property
    def knobs(self) -> list[Knob]:
        return [KNOBS[name] for name in self.values]

    @property
    def size(self) -> int:
        n = 1
        for vals in self.values.values():
            n *= len(vals)
        return n

    def combinations(self) -> list[dict]:
        """Every combination, as {knob name: value}, in a stable order (first knob slowest)."""
        names = list(self.values)
        return [dict(zip(names, combo)) for combo in itertools.product(*(self.values[n] for n in names))]

    def to_dict(self) -> dict:
        return {"concurrency": self.concurrency, "budget_s": self.budget_s, "eta": self.eta,
                "space": {k: list(v) for k, v in self.values.items()}}


def _cli(path: str, message: str) -> ProfileError:
    return ProfileError([Problem(message, path=path, file="<command line>")])


def _in_range(value: int | None, bounds: tuple[int, int], flag: str) -> None:
    if value is not None and not bounds[0] <= value <= bounds[1]:
        raise _cli(flag, f"{value} is out of range: expected {bounds[0]} to {bounds[1]}")


def default_concurrency(profile: Profile) -> int:
    """The highest concurrency the profile's gate measures (the gate's default levels otherwise)."""
    levels = profile.data.get("gate", {}).get("levels") or [{"concurrency": 64}]
    return max(int(lv["concurrency"]) for lv in levels)


def build_space(profile: Profile, sets: list[str] | None = None, *, concurrency: int | None = None,
                budget_s: int | None = None) -> Space:
    """The space of `profile` with the command line's overrides; ProfileError (exit 2) when it is
    unusable, naming the file and line or the command-line key."""
    _in_range(concurrency, CONCURRENCY_RANGE, "--concurrency")
    _in_range(budget_s, BUDGET_RANGE, "--budget-s")
    block = profile.data.get("tune") or {}
    values: dict[str, tuple] = {}
    origins: dict[str, tuple[str, int | None]] = {}
    for name, vals in (block.get("space") or {}).items():
        values[name] = tuple(vals)
        origins[name] = profile.where(("tune", "space", name))
    notes = []
    for word in sets or []:
        k, vals = parse_set(word)
        if k.name in values:
            notes.append(f"--set {k.name} replaces the profile's {list(values[k.name])}")
        values[k.name] = tuple(vals)
        origins[k.name] = COMMAND_LINE
    if not values:
        file, line = profile.where(("tune",)) if "tune" in profile.data else (profile.files[-1], 1)
        raise ProfileError([Problem("nothing to search: give a tune.space block in the profile or "
                                    "--set KNOB=V1,V2 (knobs: " + ", ".join(KNOBS) + ")",
                                    path="tune.space", file=file, line=line)])
    space = Space(values=values, origins=origins,
                  concurrency=concurrency or block.get("concurrency") or default_concurrency(profile),
                  budget_s=budget_s or block.get("budget_s") or DEFAULT_BUDGET_S,
                  eta=block.get("eta") or DEFAULT_ETA, notes=tuple(notes))
    if space.size > MAX_CANDIDATES:
        sizes = " x ".join(f"{len(v)} {k}" for k, v in values.items())
        file, line = (profile.where(("tune", "space")) if "tune" in profile.data and not sets
                      else COMMAND_LINE)
        raise ProfileError([Problem(f"{space.size} combinations ({sizes}): at most {MAX_CANDIDATES}; "
                                    "try fewer values per knob", path="tune.space", file=file, line=line)])
    return space
