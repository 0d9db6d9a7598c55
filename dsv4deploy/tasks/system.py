"""The service user, the gate client's user, and the directories every release uses."""

from __future__ import annotations

from pyinfra.api import deploy
from pyinfra.operations import files, server

from ..layout import ETC, GATE_USER, MODELS, OPT, STATE
from ..rollout import Rollout


@deploy("Service user and directories")
def service_user(r: Rollout) -> None:
    user = r.data["service"]["user"]
    server.group(name=f"group {user}", group=user, system=True)
    server.user(name=f"user {user} (no login)", user=user, group=user, system=True,
                shell="/usr/sbin/nologin", home=r.layout.state_dir, create_home=False)
    server.group(name=f"group {GATE_USER}", group=GATE_USER, system=True)
    server.user(name=f"user {GATE_USER} (runs the gate's load client)", user=GATE_USER, group=GATE_USER,
                system=True, shell="/usr/sbin/nologin", home="/nonexistent", create_home=False)
    for path, owner, mode in ((OPT, "root", "755"), (f"{OPT}/venvs", "root", "755"),
                              (ETC, "root", "755"), (r.layout.config_dir, "root", "755"),
                              (STATE, "root", "755"), (r.layout.releases_dir, "root", "755"),
                              (r.layout.state_dir, user, "750"), (MODELS, "root", "755")):
        files.directory(name=f"dir {path}", path=path, user=owner, group=owner if owner == "root" else user,
                        mode=mode)
