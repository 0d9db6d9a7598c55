"""What one deploy run works from, decided before pyinfra touches the host: the validated
profile, its rendered files, the host paths, and the stand-ins an inventory names for parts
that cannot exist on that host (a test host without CUDA torch or NVIDIA's apt repository).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path

from pyinfra.api import DeployError

from dsv4deploy.profile.errors import ProfileError
from dsv4deploy.cli.inventories import placeholder_problem
from dsv4deploy.cli.settings import Settings, settings_of
from dsv4deploy.render.layout import Layout
from dsv4deploy.profile.load import Profile, load_profile
from dsv4deploy.render.unit import SGLANG_MODULE, Rendered, render
from dsv4deploy.profile.replicas import ReplicaPlan
from dsv4deploy.profile import calibration, replicas
from dsv4deploy.profile.validate import Report, ssh_user_problem, validate


@dataclass(frozen=True)
class Target:
    """One release's service on the host: its paths and how to reach and recognise it. For a
    profile with `replicas:` the Target is the whole set (reached through the gateway), and
    `replica(i)` is instance i alone (reached on its own loopback port)."""

    data: dict
    layout: Layout
    index: int | None = None          # a replica of the set, or None
    kept_gateway_venv: str | None = None   # as a kept release's manifest names it (as_kept)

    @classmethod
    def of(cls, data: dict) -> "Target":
        return cls(data=data, layout=Layout.of(data))

    @property
    def plan(self) -> ReplicaPlan | None:
        return replicas.plan(self.data)

    def as_kept(self, manifest: dict | None) -> "Target":
        """This service as release's kept MANIFEST says it ran: the venv (and the gateway's) it was
        built with. A newer dsv4deploy whose lock files changed names a profile's venv differently,
        and pruning or a restore must look at the one the kept unit starts, not that one."""
        if not manifest or not isinstance(manifest.get("patchset"), str):
            return self
        gateway = manifest.get("gateway") if isinstance(manifest.get("gateway"), dict) else {}
        return replace(self, layout=replace(self.layout, patchset=manifest["patchset"]),
                       kept_gateway_venv=gateway.get("venv") or self.kept_gateway_venv)

    @property
    def gateway_venv(self) -> str | None:
        """The smg venv this replica set runs its gateway from (None without replicas)."""
        return (self.kept_gateway_venv or replicas.gateway_venv(self.data)) if self.plan else None

    @property
    def is_set(self) -> bool:
        return self.plan is not None and self.index is None

    def replica(self, index: int) -> "Target":
        return replace(self, index=index)

    @property
    def replica_targets(self) -> list["Target"]:
        return [self.replica(r.index) for r in self.plan.replicas] if self.plan else []

    @property
    def unit(self) -> str:
        if self.index is not None:
            return f"{self.layout.instance(self.index)}.service"
        if self.plan is not None:
            return f"{self.layout.gateway_service}.service"
        return f"{self.layout.service}.service"

    @property
    def units(self) -> list[str]:
        """Every unit this release runs: the server, or each replica's instance and the gateway."""
        return [t.unit for t in self.replica_targets] + [self.unit] if self.is_set else [self.unit]

    @property
    def port(self) -> int:
        plan = self.plan
        if plan is None:
            return self.data["server"]["port"]
        return plan.gateway.port if self.index is None else plan.replicas[self.index].port

    @property
    def base_url(self) -> str:
        plan = self.plan
        if plan is not None:
            return plan.replicas[self.index].url if self.index is not None else _url(plan.gateway.host, plan.gateway.port)
        return _url(self.data["server"]["host"], self.data["server"]["port"])

    @property
    def label(self) -> str:
        return f"replica {self.index} ({self.unit})" if self.index is not None else self.unit

    @property
    def expected_server_info(self) -> dict:
        """What /server_info must say for the process to be this release's server."""
        server = self.data["server"]
        expected = {"model_path": self.layout.model_dir, "tp_size": server["tp_size"],
                    "mem_fraction_static": server["mem_fraction_static"]}
        if server.get("context_length"):
            expected["context_length"] = server["context_length"]
        return expected


def _url(host: str, port: int) -> str:
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


@dataclass(frozen=True)
class Rollout:
    profile: Profile
    report: Report
    rendered: Rendered
    layout: Layout
    module: str
    settings: Settings                               # the run's folders and inputs (host data `settings`)
    stand_ins: dict = field(default_factory=dict)   # inventory data `stand_ins`
    weights_source: dict = field(default_factory=dict)
    allow_reboot: bool = False
    expect_compute_cap: str | None = None            # inventory data: the GPUs' compute capability

    @property
    def data(self) -> dict:
        return self.profile.data

    @property
    def manifest_sha256(self) -> str:
        return hashlib.sha256(self.rendered.manifest.encode()).hexdigest()

    @property
    def target(self) -> Target:
        return Target(data=self.profile.data, layout=self.layout)


def host_calibration(settings: Settings, host_name: str | None) -> dict | None:
    """HOST_NAME's memory calibration on the control node (reports/<host>/calibration.json, made
    from SGLang's startup logs there; None: none yet, or no host named); DeployError if unreadable."""
    if not host_name:
        return None
    try:
        return calibration.read(calibration.path_for(settings.reports, host_name))
    except calibration.CalibrationError as exc:
        raise DeployError(f"{exc}: fix or remove it (the next start there makes it anew)") from None


def rollout_for(host_data, host_name: str | None = None) -> Rollout:
    """Build the Rollout from the host data: `profile` (set by the inventory, or `--data profile=`),
    the run's `settings` (set by the inventory: where the profiles are) and the inventory's stand-ins.
    HOST_NAME: the host deployed to, whose calibration (profile/calibration.py) the memory budget
    uses, so a fraction that host's own starts refuse is refused with the release that showed it.

    A bad profile raises DeployError here, in pyinfra's prepare stage: nothing is changed. (This
    project's inventories refuse it earlier, before connecting: dsv4deploy/cli/inventories.py.)"""
    name = host_data.get("profile")
    if not name:
        raise DeployError("no profile given: set it in the inventory's host data (inventory/ct200.py reads "
                          "CT200_PROFILE), or use --data profile=NAME (make deploy PROFILE=NAME)")
    settings = settings_of(host_data)
    measured = host_calibration(settings, host_name)
    try:
        profile = load_profile(str(name), settings.profiles)
        report = validate(profile, measured)
    except ProfileError as exc:
        raise DeployError(f"invalid profile {name}:\n{exc}") from None
    if report.errors:
        raise DeployError(f"invalid profile {name}:\n" + "\n".join(map(str, report.problems)))
    if own := ssh_user_problem(profile, host_data.get("ssh_user")):
        raise DeployError(f"invalid profile {name} for this inventory:\n{own}")
    if not host_data.get("weights_source") and (unpinned := placeholder_problem(profile)):
        raise DeployError(f"invalid profile {name} for this host:\n{unpinned}")
    stand_ins = dict(host_data.get("stand_ins") or {})
    if problems := stand_in_problems(stand_ins):
        raise DeployError("host data stand_ins (set by the inventory) cannot be used:\n" + "\n".join(problems))
    module = stand_ins.get("server_module", SGLANG_MODULE)
    weights_source = dict(host_data.get("weights_source") or profile.data["model"]["source"])
    if "{repo}" in weights_source.get("path", ""):
        weights_source["path"] = weights_source["path"].format(repo=profile.data["model"]["repo"].replace("/", "--"))
    return Rollout(profile=profile, report=report, rendered=render(profile, module=module),
                   layout=Layout.of(profile.data), module=module, settings=settings, stand_ins=stand_ins,
                   weights_source=weights_source, allow_reboot=bool(host_data.get("allow_reboot", False)),
                   expect_compute_cap=host_data.get("expect_compute_cap"))


def stand_in_problems(stand_ins: dict) -> list[str]:
    """What host data `stand_ins` lacks for the parts it replaces (empty: usable). The inventory
    names every part of a stand-in; nothing of one is assumed here. A stand-in for SGLang names
    the server module the unit starts, the module whose parser the launch check runs when the
    venv holds no SGLang parser of its own, and `sglang.bundle`, the archive of that server (a
    file on this machine); a stand-in for the driver names the command that installs it."""
    problems = []
    sglang = stand_ins.get("sglang")
    if sglang:
        for key in ("server_module", "launch_check_module"):
            if not isinstance(stand_ins.get(key), str) or not stand_ins[key]:
                problems.append(f"stand_ins.{key}: the stand-in server's module is required with stand_ins.sglang")
        bundle = sglang.get("bundle") if isinstance(sglang, dict) else None
        if not isinstance(bundle, str) or not bundle:
            problems.append("stand_ins.sglang.bundle: the path of the stand-in server's archive is required")
        elif not Path(bundle).is_file():
            problems.append(f"stand_ins.sglang.bundle: {bundle}: no such file")
        size = sglang.get("venv_gib") if isinstance(sglang, dict) else None
        if size is not None and (isinstance(size, bool) or not isinstance(size, (int, float)) or size <= 0):
            problems.append(f"stand_ins.sglang.venv_gib: {size!r}: the stand-in venv's size on disk, GiB > 0")
    driver = stand_ins.get("driver")
    if driver and not (isinstance(driver, dict) and isinstance(driver.get("install"), str) and driver["install"]):
        problems.append("stand_ins.driver.install: the command that installs the stand-in driver is required "
                        "({branch} is the profile's driver branch)")
    return problems
