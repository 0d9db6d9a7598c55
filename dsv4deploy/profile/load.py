"""Profiles: `profiles/<name>.yaml`, merged over the package defaults and their `extends:`
chain, then checked against the JSON Schema. The result is a `Profile`: plain data plus the
file and line every value came from, so later checks can point at the right place.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from jsonschema import Draft202012Validator, validators

from dsv4deploy import PACKAGE_DATA
from dsv4deploy.profile.boundary import NAME_PATTERN, check_name, normalize_rendered, value_problems
from dsv4deploy.profile.errors import Problem, ProfileError
from dsv4deploy.profile.yamlpos import Origins, format_path, load_yaml

NAME_RE = re.compile(NAME_PATTERN + r"\Z")  # use with .match: \Z, never $ (it matches before a final newline)
DEFAULTS_FILE = "dsv4deploy/data/defaults.yaml"
NOT_DEPLOYED = ("tune", "watch")  # top-level keys that are not part of what a release deploys


@cache
def schema() -> dict:
    return json.loads((Path(__file__).with_name("schema") / "profile.schema.json").read_text())


@dataclass(frozen=True)
class Profile:
    """A resolved profile: merged data, where each value came from, and the files read."""

    name: str
    data: dict
    origins: Origins = field(repr=False)
    files: tuple[str, ...] = ()

    def __getitem__(self, key: str):
        return self.data[key]

    def where(self, path: tuple) -> tuple[str, int | None]:
        """File and line of `path`, or of its nearest ancestor that has one."""
        for end in range(len(path), 0, -1):
            if path[:end] in self.origins:
                return self.origins[path[:end]]
        return (self.files[-1], 1) if self.files else ("<profile>", None)

    def problem(self, path: tuple, message: str, severity: str = "error") -> Problem:
        file, line = self.where(path)
        return Problem(message, path=format_path(path), file=file, line=line, severity=severity)

    @property
    def content_hash(self) -> str:
        """sha256 of the canonical merged data: two profiles that mean the same hash the same.
        The `tune:` block (what `dsv4deploy tune` searches) and the `watch:` block (the watch's
        own unit reads it) are left out: they change nothing the server runs, so changing one
        must not make the next deploy restart the server."""
        deployed = {k: v for k, v in self.data.items() if k not in NOT_DEPLOYED}
        canon = json.dumps(deployed, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canon.encode()).hexdigest()

    @property
    def model(self) -> dict:
        return self.data["model"]

    @property
    def server(self) -> dict:
        return self.data["server"]


def list_profiles(directory: Path) -> list[str]:
    """Deployable profile names in DIRECTORY (files starting with `_` are shared bases, not
    deployable). DIRECTORY is the run's profiles folder: cli/settings.py Settings.profiles."""
    return sorted(p.stem for p in directory.glob("*.yaml") if not p.stem.startswith("_"))


def display_path(path: Path) -> str:
    """PATH as a message names it: relative to the working directory when under it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


COMMAND_LINE = Problem("", path="profile", file="<command line>")


def _profile_path(name: str, directory: Path, referrer: Problem | None = None) -> Path:
    where = referrer or COMMAND_LINE
    bad = check_name(name)
    if bad:
        raise ProfileError([Problem(f"invalid profile name: {bad}", path=where.path, file=where.file,
                                    line=where.line)])
    path = directory / f"{name}.yaml"
    try:
        found = path.is_file()
    except OSError:  # e.g. a component the file system refuses
        found = False
    if not found:
        known = list_profiles(directory)
        hint = difflib.get_close_matches(name, known, n=1)
        msg = f"no profile named {name!r} ({display_path(path)} does not exist)"
        msg += f"; did you mean {hint[0]}?" if hint else f"; available: {', '.join(known) or 'none'}"
        raise ProfileError([Problem(msg, path=where.path, file=where.file, line=where.line)])
    return path


def _merge(base: dict, base_origins: Origins, over: dict, over_origins: Origins,
           prefix: tuple = ()) -> None:
    """Deep-merge `over` into `base` in place: mappings merge, everything else replaces."""
    for key, value in over.items():
        path = prefix + (key,)
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base_origins[path] = over_origins.get(path, base_origins.get(path))
            _merge(base[key], base_origins, value, over_origins, path)
            continue
        base[key] = copy.deepcopy(value)
        for stale in [p for p in base_origins if p[: len(path)] == path]:
            del base_origins[stale]
        for p, o in over_origins.items():
            if p[: len(path)] == path:
                base_origins[p] = o


def load_raw(name: str, directory: Path) -> tuple[dict, Origins, tuple[str, ...]]:
    """Merge defaults, the extends chain and the profile; no schema check yet."""
    chain: list[tuple[str, dict, Origins]] = []
    seen: list[str] = []
    referrer = None
    current = name
    while True:
        if current in seen:
            cycle = " -> ".join(seen + [current])
            raise ProfileError([Problem(f"extends cycle: {cycle}", path=referrer.path,
                                        file=referrer.file, line=referrer.line)])
        seen.append(current)
        path = _profile_path(current, directory, referrer)
        shown = display_path(path)
        data, origins = load_yaml(path, shown)
        chain.append((shown, data, origins))
        parent = data.get("extends")
        if parent is None:
            break
        file, line = origins[("extends",)]
        referrer = Problem("", path="extends", file=file, line=line)
        if not isinstance(parent, str):
            raise ProfileError([Problem("expected a profile name (string)", path="extends",
                                        file=file, line=line)])
        current = parent

    defaults, merged_origins = load_yaml(Path(PACKAGE_DATA / "defaults.yaml"), DEFAULTS_FILE)
    merged = copy.deepcopy(defaults)
    for _shown, data, origins in reversed(chain):
        _merge(merged, merged_origins, data, origins)
    merged.pop("extends", None)
    merged.pop("$schema", None)
    return merged, merged_origins, tuple(shown for shown, _, _ in reversed(chain))


def load_profile(name: str, directory: Path) -> Profile:
    """Load, merge and check the deployable profile NAME of DIRECTORY (boundary rule, then the
    schema); raise ProfileError listing every problem. Environment and NCCL values come back
    as the text they render to (boundary.rendered_text), whatever their YAML spelling."""
    path = _profile_path(name, directory)
    if name.startswith("_"):
        users = [p for p in list_profiles(directory) if _extends(directory, p) == name]
        raise ProfileError([Problem(
            f"{name} is a shared base (files starting with '_' are merged into other profiles through "
            f"extends:), not a deployable profile; deploy one that extends it"
            + (f": {', '.join(users)}" if users else ""), path="profile", file=display_path(path), line=1)])
    data, origins, files = load_raw(name, directory)
    profile = Profile(name=name, data=data, origins=origins, files=files)
    problems = [profile.problem(path, msg) for path, msg in value_problems(profile.data)]
    seen = {p.path for p in problems}
    problems += [p for p in schema_problems(profile) if p.path not in seen]
    if problems:
        raise ProfileError(problems)
    normalize_rendered(profile.data)  # once, before any rule reads an env or NCCL value
    return profile


def _extends(directory: Path, name: str) -> str | None:
    """The `extends:` of a profile, read cheaply for a hint (None when unreadable)."""
    try:
        data, _ = load_yaml(directory / f"{name}.yaml")
    except ProfileError:
        return None
    return data.get("extends")


# --- schema errors, phrased for people --------------------------------------------------------

_TYPE_NAMES = {"integer": "an integer", "number": "a number", "string": "a string",
               "boolean": "true or false", "object": "a mapping", "array": "a list", "null": "null"}


def _json_type(value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "mapping"
    return "null" if value is None else type(value).__name__


def _shown(value) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_integer(checker, value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(checker, value) -> bool:
    return _is_integer(checker, value) or (isinstance(value, float) and math.isfinite(value))


# Draft 2020-12 counts 4.0 as an integer (then `--tp-size 4.0` is rendered, which SGLang
# refuses) and NaN/inf as numbers (every comparison with NaN is false, so no bound holds).
StrictValidator = validators.extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine_many({"integer": _is_integer, "number": _is_number}))


def schema_problems(profile: Profile) -> list[Problem]:
    validator = StrictValidator(schema())
    problems: list[Problem] = []
    for error in sorted(validator.iter_errors(profile.data), key=lambda e: list(map(str, e.absolute_path))):
        path = tuple(error.absolute_path)
        value = error.instance
        kind = error.validator
        if "propertyNames" in error.schema_path:  # the boundary rule names the key itself (KEY_RULES)
            continue
        if kind == "additionalProperties":
            allowed = sorted(error.schema.get("properties", {}))
            for key in sorted(set(value) - set(allowed)):
                hint = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
                msg = "unknown key"
                msg += f"; did you mean {hint[0]}?" if hint else f"; valid keys: {', '.join(allowed)}"
                problems.append(profile.problem(path + (key,), msg))
            continue
        if kind == "required":
            missing = [k for k in error.validator_value if k not in value]
            file, line = profile.where(path)
            if file != profile.files[-1] or line is None:  # the parent came from a base: point at the profile
                file, line = profile.files[-1], 1
            for key in missing:
                problems.append(Problem(f"missing required key ({_describe(error.schema, key)})",
                                        path=format_path(path + (key,)), file=file, line=line))
            continue
        if kind == "type":
            expected = error.validator_value
            expected = [expected] if isinstance(expected, str) else expected
            want = " or ".join(_TYPE_NAMES.get(t, t) for t in expected)
            msg = f"expected {want}, got {_json_type(value)} {_shown(value)}"
            if isinstance(value, float) and value.is_integer() and "integer" in expected:
                msg += f" (write {int(value)}: a float here renders as {value!r})"
        elif kind == "enum":
            msg = f"expected one of {', '.join(map(str, error.validator_value))}; got {_shown(value)}"
            hint = difflib.get_close_matches(str(value), [str(v) for v in error.validator_value], n=1)
            msg += f"; did you mean {hint[0]}?" if hint else ""
            if isinstance(value, bool):  # YAML 1.1 reads bare off/on/yes/no as booleans
                msg += " (a bare off, on, yes or no is a boolean in YAML: quote it, e.g. 'off')"
        elif kind == "pattern" and isinstance(value, str) and not value.isprintable():
            msg = f"must not contain a newline or control character (it would reach a rendered file): {_shown(value)}"
        elif kind == "pattern":
            msg = f"{_shown(value)} is not valid here: {error.schema.get('description', 'expected pattern ' + error.validator_value)}"
        elif kind in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
            op = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}[kind]
            msg = f"expected a value {op} {error.validator_value}, got {_shown(value)}"
        elif kind in ("minLength", "minItems"):
            msg = "must not be empty"
        elif kind == "uniqueItems":
            msg = "items must be unique"
        elif kind == "oneOf" and path[:2] == ("sglang", "patches"):
            msg = "give exactly one of url or file"
        else:
            msg = error.message
        problems.append(profile.problem(path, msg))
    return problems


def _describe(parent_schema: dict, key: str) -> str:
    sub = parent_schema.get("properties", {}).get(key, {})
    return sub.get("description", "see the schema")
