"""Connect to the hosts of a pyinfra inventory file from the CLI (history, bench), with the
same SSH settings (and host-key checking) a deploy uses.

Every failure to get there (an inventory that raises, a host that does not answer) becomes a
RemoteError with one readable message: the CLI prints it and exits 1, never a traceback.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

from pyinfra.api import Config, State
from pyinfra.api.connect import disconnect_all
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_config, ctx_host, ctx_inventory, ctx_state


class RemoteError(Exception):
    pass


def describe(exc: BaseException) -> str:
    """One line for any exception, even one whose __str__ breaks (pyinfra CLI's
    UnexpectedExternalError wraps the inventory's own exception and has no message of its own)."""
    inner = getattr(exc, "exception", None)
    if isinstance(inner, BaseException) and inner is not exc:
        return describe(inner)
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ must not end in a traceback
        text = ""
    if not text:
        try:
            args = getattr(exc, "args", ())
            text = str(args[0]) if args else ""
        except Exception:  # noqa: BLE001
            text = ""
    name = type(exc).__name__
    text = " ".join(text.split())
    if not text:
        return name
    return f"{name}: {text}" if type(exc).__module__ == "builtins" else text  # ValueError: ... ; ours as said


def _unreachable(name: str, errors: dict[str, str]) -> str:
    lines = [f"cannot reach {h} over SSH: {e}" for h, e in errors.items()]
    return "\n".join(lines) + (f"\n(check the address and port in {name}, that sshd runs there, and that "
                               "its host key is in the known_hosts file the inventory names)")


def _connect(h) -> str | None:
    """Connect one host; the reason it failed, or None. (A greenlet that raised would have gevent
    print its traceback.)"""
    try:
        h.connect(show_errors=False, raise_exceptions=True)
    except Exception as exc:  # noqa: BLE001 - ConnectError, or whatever a connector raises
        return describe(exc)
    return None


def load_inventory(inventory_file: str):
    """Load `inventory_file` as pyinfra does (connecting to nothing): (state, config, inventory); RemoteError
    when it is not a file or does not load."""
    if not Path(inventory_file).is_file():
        raise RemoteError(f"{inventory_file}: no such inventory file")
    from pyinfra_cli.inventory import make_inventory   # (its import patches the process with gevent)

    state = State()
    ctx_state.set(state)
    config = Config()
    ctx_config.set(config)
    try:
        inventory = make_inventory(inventory_file, cwd=os.getcwd())
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - an inventory file raises what its author chose
        text = describe(exc)
        raise RemoteError(text if text.startswith(inventory_file) else f"{inventory_file}: {text}") from None
    ctx_inventory.set(inventory)
    return state, config, inventory


@contextmanager
def connected(inventory_file: str, only=None):
    """Yield the connected hosts of `inventory_file` (with `only`, just the hosts of those names);
    raise RemoteError when the inventory does not load or any of its hosts cannot be reached."""
    with reachable(inventory_file, only) as (hosts, errors):
        if errors:
            raise RemoteError(_unreachable(inventory_file, errors))
        yield hosts


@contextmanager
def reachable(inventory_file: str, only=None):
    """Yield (the hosts, in inventory order; {name: why} for those that did not connect);
    RemoteError when the inventory does not load or names no host. `dsv4deploy report` shows an
    unreachable host as such instead of stopping."""
    state, config, inventory = load_inventory(inventory_file)
    state.init(inventory, config)
    state.set_stage(StateStage.Connect)
    hosts = list(inventory) if only is None else [h for h in inventory if h.name in set(only)]
    if not hosts:
        raise RemoteError(f"{inventory_file} names no host" + ("" if only is None else f" of {', '.join(only)}"))
    errors: dict[str, str] = {}
    greenlets = {state.pool.spawn(_connect, h): h for h in hosts}  # in parallel, like pyinfra's connect_all
    for greenlet, h in greenlets.items():
        error = greenlet.get()
        if error:
            errors[h.name] = error
        elif h.connected:
            state.activate_host(h)
        else:
            errors[h.name] = "not connected"
    state.set_stage(StateStage.Execute)
    try:
        yield hosts, errors
    finally:
        try:
            disconnect_all(state)
        except Exception:  # noqa: BLE001 - a host that never connected has nothing to close
            if not errors:
                raise


@contextmanager
def on(h):
    """Make `h` pyinfra's current host (facts look it up from the context)."""
    with ctx_host.use(h):
        yield h
