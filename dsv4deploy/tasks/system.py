"""The host's packages, the service user, the gate client's user, and the directories every
release uses: each compared with the host's state, changed only where it differs."""

from __future__ import annotations

from pyinfra.api import deploy

from dsv4deploy.host import uvpip
from dsv4deploy.host import installer, ops
from dsv4deploy.host.accounts import MARKER
from dsv4deploy.host.state import HOST_PACKAGES, HostState, accounts_wanted, directories
from dsv4deploy.release.rollout import Rollout


@deploy("Host packages")
def host_packages(r: Rollout, state: HostState) -> None:
    ops.packages(name=f"packages the deploy uses ({', '.join(HOST_PACKAGES)})", names=HOST_PACKAGES,
                 installed=state["packages"] or {})
    ops.uv_tool(name=f"uv {uvpip.UV_VERSION}, sha256-pinned, to fill the venvs ({installer.TOOL})",
                requirements=installer.requirements(), program=installer.program(),
                requirements_state=state.file(installer.REQUIREMENTS), program_state=state.file(installer.PROGRAM),
                installed_state=state.file(installer.INSTALLED))


@deploy("Service user and directories")
def service_user(r: Rollout, state: HostState) -> None:
    accounts = state["accounts"] or {}
    for user, home, role, _ in accounts_wanted(r):
        ops.system_account(name=f"user {user} ({role}, no login)", user=user, home=home, accounts=accounts,
                           comment=MARKER)
    dirs = directories(r)
    ops.directories(name=f"dirs {', '.join(d[0] for d in dirs)}",
                    items=[(path, user, group, mode, state.file(path)) for path, user, group, mode in dirs])
