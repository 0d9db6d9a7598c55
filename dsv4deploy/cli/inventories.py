"""What this project's pyinfra inventory files decide while they load, before pyinfra connects.

pyinfra 3.10's CLI loads the inventory, then connects to every host, and only then loads the
deploy file. A profile checked in the deploy file is therefore checked after SSH connects. So an
inventory decides the profile itself (host data `profile`, pyinfra's convention: the card's
`pyinfra inventory/ct200.py deploy/serve.py` needs no `--data`) and refuses a bad or unpinned one
right there, with `file:line: key: message` and exit code 2, before any connection.

`--data` reaches the host data only after the inventory has loaded, so it is read here from
pyinfra's own parsed command line (click's context; the same `key=value` split and value parsing
pyinfra applies, the last one winning), never by re-parsing `sys.argv`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn

from dsv4deploy.cli.settings import HOST_DATA_KEY, Settings
from dsv4deploy.profile.errors import EXIT_BAD_INPUT, Problem, ProfileError
from dsv4deploy.profile.validate import PLACEHOLDER_REVISION

# A deploy file that builds its run from a profile (deploy/serve.py) calls this.
PROFILE_DEPLOY_MARKER = "rollout_for("


def pyinfra_cli_params() -> dict[str, Any] | None:
    """The parsed parameters of the running `pyinfra` command, or None when the inventory is
    loaded some other way (dsv4deploy history/bench, the pyinfra API, tests)."""
    try:
        import click
    except ImportError:  # pragma: no cover - pyinfra depends on click
        return None
    ctx = click.get_current_context(silent=True)
    while ctx is not None and ctx.parent is not None:
        ctx = ctx.parent
    if ctx is None or getattr(ctx.command.callback, "__module__", "") != "pyinfra_cli.cli":
        return None
    return dict(ctx.params)


def cli_data(params: Mapping[str, Any] | None) -> dict[str, Any]:
    """`--data key=value` of the command line as pyinfra will apply them (after the inventory
    loads): split at the first `=`, values parsed like pyinfra's `parse_cli_arg`, last one wins.
    A word without `=` is skipped here (pyinfra itself refuses it)."""
    found: dict[str, Any] = {}
    for word in (params or {}).get("data") or ():
        if "=" not in str(word):
            continue
        key, value = str(word).split("=", 1)
        found[key] = parse_cli_arg(value)
    return found


def parse_cli_arg(value: str) -> Any:
    """pyinfra's own `parse_cli_arg` when its CLI is running (it always is when `--data` exists);
    otherwise the same rules, without importing pyinfra_cli (whose import monkey-patches the
    whole process with gevent)."""
    cli_util = sys.modules.get("pyinfra_cli.util")
    if cli_util is not None:
        return cli_util.parse_cli_arg(value)
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return json.loads(value)
    except ValueError:
        return value


def deploys_a_profile(operations: Iterable[str], cwd: str | Path | None = None) -> bool:
    """Whether one of the command's operations is a deploy file that builds its run from a
    profile (it calls rollout_for, like deploy/serve.py); rollback, exec, fact etc. need none."""
    base = Path(cwd or os.getcwd())
    for op in operations or ():
        path = base / str(op)
        if not str(op).endswith(".py") or not path.is_file():
            continue
        try:
            if PROFILE_DEPLOY_MARKER in path.read_text(encoding="utf-8", errors="replace"):
                return True
        except OSError:
            continue
    return False


def choose_profile(data: Mapping[str, Any], env: Mapping[str, str], env_names: Iterable[str],
                   default: str | None = None) -> tuple[str | None, str]:
    """The profile name and where it came from: `--data profile=` first (an empty one means none:
    it is what the deploy will see), then the first set environment variable of `env_names`,
    then `default` (None when there is none)."""
    if "profile" in data:
        value = data["profile"]
        return (str(value) if value not in (None, "") else None), "--data profile="
    for name in env_names:
        if env.get(name, "").strip():
            return env[name].strip(), name
    if default:
        return default, "the inventory's default"
    return None, ""


def placeholder_problem(profile) -> Problem | None:
    """The placeholder revision as an error: only an inventory with a weights stand-in (the twin's
    small checkpoint) may deploy a profile that does not pin the real checkpoint's commit."""
    if profile.data["model"]["revision"] != PLACEHOLDER_REVISION:
        return None
    return profile.problem(
        ("model", "revision"),
        f"placeholder revision ({PLACEHOLDER_REVISION[:7]}...): pin the checkpoint commit of "
        f"{profile.data['model']['repo']} first (make pin PROFILE={profile.name}); only an inventory with a "
        "weights stand-in (inventory/sim.py, the twin) deploys a placeholder")


def deploy_problems(name: str, profiles: Path, *, weights_stand_in: bool, ssh_user: str | None = None) -> list[Problem]:
    """Every error that stops `name` (of the folder PROFILES) from being deployed by this
    inventory (empty: go); SSH_USER: the inventory's login, which service.user must not be."""
    from dsv4deploy.profile.load import load_profile
    from dsv4deploy.profile.validate import ssh_user_problem, validate

    try:
        profile = load_profile(name, profiles)
        report = validate(profile)
    except ProfileError as exc:
        return list(exc.problems)
    problems = list(report.errors)
    if (own := ssh_user_problem(profile, ssh_user)) and not any(p.path == own.path for p in problems):
        problems.append(own)
    if not weights_stand_in:
        problem = placeholder_problem(profile)
        if problem is not None and not any(p.path == problem.path for p in problems):
            problems.insert(0, problem)
    return problems


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def refuse(inventory: str, lines: Iterable[str], cli: bool, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Stop loading the inventory: under the pyinfra CLI a message and exit `code` (2: bad input;
    no traceback, nothing connected); loaded any other way, an InventoryError the caller reports."""
    text = f"{inventory}: " + "\n".join(str(line) for line in lines)
    if cli:
        _say(text)
        sys.exit(code)
    from pyinfra.api import InventoryError

    raise InventoryError(text)


def profile_data(inventory: str, *, env_names: Iterable[str], default: str | None, weights_stand_in: bool,
                 env: Mapping[str, str] | None = None, ssh_user: str | None = None) -> dict[str, Any]:
    """Host data `{"profile": NAME, "settings": Settings}` for an inventory file, decided and
    checked now: the run's settings (cli/settings.py: folders, environment, --dry and --diff),
    which the deploy steps read from the host data, and the profile. SSH_USER: the inventory's
    login (pyinfra's --user or --data ssh_user win), which service.user must not be.

    Under the pyinfra CLI with a profile deploy among the operations, the profile must be given
    and deployable, or the run stops here (exit 2) before pyinfra connects."""
    env = os.environ if env is None else env
    env_names = tuple(env_names)
    params = pyinfra_cli_params()
    settings = Settings.from_environment(env, dry_run=bool((params or {}).get("dry")),
                                         show_diffs=bool((params or {}).get("diff")))
    data = cli_data(params)
    name, where = choose_profile(data, env, env_names, default)
    found = {HOST_DATA_KEY: settings, **({"profile": name} if name else {})}
    if params is None or not deploys_a_profile(params.get("operations") or ()):
        return found
    if not name:
        empty = " (--data profile= is empty)" if where else ""
        refuse(inventory, [f"no profile{empty}: set {env_names[0]}=NAME (or --data profile=NAME; through make: "
                           f"make deploy PROFILE=NAME INVENTORY={inventory}); profiles: {_names(settings.profiles)}"],
               cli=True)
    problems = deploy_problems(name, settings.profiles, weights_stand_in=weights_stand_in,
                               ssh_user=(params or {}).get("ssh_user") or data.get("ssh_user") or ssh_user)
    if problems:
        refuse(inventory, [f"profile {_shown(name)} (from {where}) cannot be deployed; refused before connecting:",
                           *map(str, problems)], cli=True)
    _say(f"{inventory}: profile {name} (from {where})")
    return found


def _shown(text: str) -> str:
    """A name as typed, or escaped when it holds anything a terminal would act on."""
    return text if text.isprintable() else ascii(text)


def _names(profiles: Path) -> str:
    from dsv4deploy.profile.load import list_profiles

    try:
        return ", ".join(list_profiles(profiles)) or "none"
    except OSError:
        return "none found"
