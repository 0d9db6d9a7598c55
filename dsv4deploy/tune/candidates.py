"""Candidates: the base profile plus one combination of knob values each, pruned before any host
is touched.

Each candidate's merged data goes through exactly what `dsv4deploy validate` runs on a profile
file: the boundary rule on every string, the JSON Schema, then the validator with its GPU-memory
budget. A candidate with an error is refused with the validator's own words and never measured
(the campaign's mem_fraction_static 0.85 at TP4 is refused by the budget: CUDA-graph capture
would run out of memory). Candidate 0 is the base itself: the reference the search must beat.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field

from dsv4deploy.profile.boundary import value_problems
from dsv4deploy.profile.errors import Problem
from dsv4deploy.profile.load import NOT_DEPLOYED, Profile, schema_problems
from dsv4deploy.profile.validate import Report, validate
from dsv4deploy.tune.knobs import KNOBS
from dsv4deploy.tune.space import Space

BASE_ID = "base"


def data_key(data: dict) -> str:
    """What a candidate is, for the state file: sha256 of what it deploys (the tune block left
    out, so editing the space keeps the measurements of candidates that did not change)."""
    deployed = {k: v for k, v in data.items() if k not in NOT_DEPLOYED}
    return hashlib.sha256(json.dumps(deployed, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def get_path(data: dict, path: tuple):
    for part in path:
        if not isinstance(data, dict) or part not in data:
            return None
        data = data[part]
    return data


@dataclass
class Candidate:
    """One configuration to try: base + `overrides` (only values that differ from the base)."""

    index: int
    overrides: dict
    profile: Profile
    key: str
    problems: list[Problem] = field(default_factory=list)
    new_warnings: list[Problem] = field(default_factory=list)   # warnings the base does not have
    report: Report | None = field(default=None, repr=False)

    @property
    def id(self) -> str:
        return BASE_ID if self.index == 0 else f"c{self.index:02d}"

    @property
    def is_base(self) -> bool:
        return self.index == 0

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def refused(self) -> bool:
        return bool(self.errors)

    @property
    def reasons(self) -> list[str]:
        """The validator's own messages, each with its key: 'server.mem_fraction_static: CUDA-graph ...'."""
        return [f"{p.path}: {p.message}" if p.path else p.message for p in self.errors]

    @property
    def label(self) -> str:
        if not self.overrides:
            return "(the base profile as it is)"
        return ", ".join(f"{k}={_shown(v)}" for k, v in self.overrides.items())

    @property
    def restart_key(self) -> tuple:
        """Candidates with equal restart keys differ only in knobs the running server takes live
        (none today: see knobs.py), so they can be measured one after the other without a restart."""
        return tuple(sorted((k, json.dumps(v)) for k, v in self.overrides.items() if KNOBS[k].restart))

    def to_dict(self) -> dict:
        return {"id": self.id, "key": self.key, "overrides": self.overrides, "refused": self.refused,
                "reasons": self.reasons, "warnings": [f"{p.path}: {p.message}" for p in self.new_warnings]}


def _shown(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def check(profile: Profile) -> tuple[list[Problem], Report | None]:
    """Every problem `dsv4deploy validate` would report for this merged data, and the report."""
    problems = [profile.problem(path, msg) for path, msg in value_problems(profile.data)]
    seen = {p.path for p in problems}
    problems += [p for p in schema_problems(profile) if p.path not in seen]
    if problems:
        return problems, None
    report = validate(profile)
    return list(report.problems), report


def changes(data: dict, knob: str, value) -> bool:
    """Whether setting KNOB to VALUE changes the profile (1 replica on a single server does not)."""
    have = get_path(data, KNOBS[knob].path)
    if have == value and type(have) is type(value):
        return False
    trial = copy.deepcopy(data)
    KNOBS[knob].apply(trial, value)
    return trial != data


def candidate_profile(base: Profile, overrides: dict, space: Space | None = None) -> Profile:
    """The base with `overrides` applied; each overridden key points at where its values were
    written (the tune block's line, or the command line)."""
    data = copy.deepcopy(base.data)
    origins = dict(base.origins)
    for name, value in overrides.items():
        path = KNOBS[name].path
        KNOBS[name].apply(data, value)
        if space is not None and name in space.origins:
            origins[path] = space.origins[name]
    return Profile(name=base.name, data=data, origins=origins, files=base.files)


def build_candidates(base: Profile, space: Space) -> list[Candidate]:
    """The base (index 0), then one candidate per distinct combination, each checked."""
    base_problems, base_report = check(base)
    base_warn = {p.path for p in base_problems if p.severity != "error"}  # a key the base already warns about
    out = [Candidate(0, {}, base, data_key(base.data), base_problems, [], report=base_report)]
    by_key = {out[0].key: out[0]}
    for combo in space.combinations():
        overrides = {k: v for k, v in combo.items() if changes(base.data, k, v)}
        profile = candidate_profile(base, overrides, space)
        key = data_key(profile.data)
        if key in by_key:
            continue  # the same configuration as an earlier one (or the base): measured once
        problems, report = check(profile)
        cand = Candidate(len(out), overrides, profile, key, problems,
                         [p for p in problems if p.severity != "error" and p.path not in base_warn],
                         report=report)
        by_key[key] = cand
        out.append(cand)
    return out
