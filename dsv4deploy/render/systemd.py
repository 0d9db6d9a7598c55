"""systemd's side of a rendered unit, shared by the single server's (render/unit.py) and a
replica set's (render/replicas.py): the quoting of ExecStart= words and Environment=
assignments, the specifiers systemd resolves, the unit templates, and the guard's two shared
pieces: template inputs that could start a directive are refused, and a difference found when a
unit is read back is blamed on the profile key it comes from.
"""

from __future__ import annotations

import re
from functools import cache

import jinja2

from dsv4deploy.profile.boundary import first_unprintable
from dsv4deploy.profile.errors import ProfileError
from dsv4deploy.profile.load import Profile
from dsv4deploy.sglang.flags import flag_owner

# --- systemd quoting --------------------------------------------------------------------------

_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")  # fullmatch only: `$` would pass a final newline


def _quoted(word: str) -> str:
    """A word as systemd.syntax(7) un-quotes it: bare when plain, else in double quotes with
    backslash and double quote escaped (C escapes work inside quotes there)."""
    if _PLAIN.fullmatch(word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def systemd_word(word: str) -> str:
    """One ExecStart= word: '%' (specifiers) and '$' (variables) are both expanded there."""
    return _quoted(word.replace("%", "%%").replace("$", "$$"))


def systemd_exec(argv: list[str], raw: frozenset[int] = frozenset()) -> str:
    """The ExecStart= value; the words at indices `raw` go as they are (a template's '${NAME}'
    or '%d/...' words, which the round trip then resolves per instance)."""
    return " ".join(w if i in raw else systemd_word(w) for i, w in enumerate(argv))


def systemd_env(key: str, value: str) -> str:
    """One Environment= assignment: '%' is a specifier there, '$' is not special (systemd.exec(5):
    "Variable expansion is not performed inside the strings"), so only '%' is doubled."""
    return _quoted(f"{key}={value}".replace("%", "%%"))


def unit_specifiers(service: str) -> dict[str, str]:
    """The specifiers a rendered unit may use, as systemd resolves them for `service`.service."""
    return {"n": f"{service}.service", "N": service, "p": service, "P": service,
            "d": f"/run/credentials/{service}.service"}


# --- the templates and the guard -------------------------------------------------------------

@cache
def templates() -> jinja2.Environment:
    """The unit templates (render/templates/), loaded once."""
    return jinja2.Environment(
        loader=jinja2.PackageLoader("dsv4deploy.render", "templates"),
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
        keep_trailing_newline=True, autoescape=False,
    )


def check_template_inputs(profile: Profile, inputs: dict) -> None:
    """No template input may start a new directive: none holds a line break or any other
    unprintable character, and none ends in a backslash (systemd would join the next line)."""
    for name, value in inputs.items():
        for text in map(str, value if isinstance(value, (list, tuple)) else [value]):
            bad = first_unprintable(text)
            if bad is not None or text.endswith("\\"):
                what = f"an unprintable character at {bad + 1}" if bad is not None else "a trailing backslash"
                raise ProfileError([profile.problem(_INPUT_KEYS.get(name, ("service",)),
                                                    f"refused at render: the unit's {name} holds {what}")])


_INPUT_KEYS = {"profile": (), "sglang_version": ("sglang", "version"), "model_repo": ("model", "repo"),
               "user": ("service", "user"), "manifest": ("service", "name"), "home": ("service", "name"),
               "state_directory": ("service", "name"),
               "nccl_env": ("service", "name"), "environment": ("server", "env"),
               "exec_start": ("server", "extra_args")}


def blame(profile: Profile, argv: list[str], loc: tuple) -> tuple:
    """The profile key a rendered difference comes from."""
    data = profile.data
    if loc[0] == "env":
        return ("server", "env", loc[1]) if loc[1] in (data["server"].get("env") or {}) else ("server", "env")
    if loc[0] == "nccl":
        overrides = data["nccl"].get("overrides") or {}
        return ("nccl", "overrides", loc[1]) if loc[1] in overrides else ("nccl", "preset")
    if loc[0] in ("ip", "home"):
        return ("service",)
    if loc[0] == "argv":
        extra = data["server"].get("extra_args") or []
        first_extra = len(argv) - len(extra)
        i = loc[1]
        if i >= first_extra:
            return ("server", "extra_args", i - first_extra)
        for j in range(min(i, len(argv) - 1), 2, -1):
            owner = flag_owner(argv[j]) if argv[j].startswith("--") else None
            if owner == "model":
                return ("model", "repo")
            if owner:
                return ("model", owner) if owner == "served_model_name" else ("server", owner)
        return ("server",)
    return ("server", "extra_args") if loc[1:] == ("length",) else ("server",)
