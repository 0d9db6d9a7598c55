"""Connect to the hosts of a pyinfra inventory file from the CLI (history, bench), with the
same SSH settings (and host-key checking) a deploy uses."""

from __future__ import annotations

import os
from contextlib import contextmanager

from pyinfra.api import Config, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_config, ctx_host, ctx_inventory, ctx_state


class RemoteError(Exception):
    pass


@contextmanager
def connected(inventory_file: str):
    """Yield the connected hosts of `inventory_file`; raise RemoteError when none connects."""
    from pyinfra_cli.inventory import make_inventory

    state = State()
    ctx_state.set(state)
    config = Config()
    ctx_config.set(config)
    try:
        inventory = make_inventory(inventory_file, cwd=os.getcwd())
    except Exception as exc:  # noqa: BLE001 - an inventory file raises what its author chose
        raise RemoteError(f"{inventory_file}: {exc}") from None
    ctx_inventory.set(inventory)
    state.init(inventory, config)
    state.set_stage(StateStage.Connect)
    try:
        connect_all(state)
    except PyinfraError as exc:
        raise RemoteError(f"cannot connect: {exc}") from None
    hosts = [h for h in inventory if h in state.activated_hosts]
    if not hosts:
        raise RemoteError(f"no host of {inventory_file} could be reached over SSH")
    state.set_stage(StateStage.Execute)
    try:
        yield hosts
    finally:
        disconnect_all(state)


@contextmanager
def on(h):
    """Make `h` pyinfra's current host (facts look it up from the context)."""
    with ctx_host.use(h):
        yield h
