"""Rendering a profile with `replicas:`: one templated unit `<service>@.service`, per replica an
env file (its GPUs and port) and an NCCL env file, and the smg gateway's unit and launcher.

The template is the single-server unit (same sandbox, same template file) with three words that
differ per instance: `EnvironmentFile=.../nccl-%i.env` and `.../replica-%i.env`, `--port
${DSV4_REPLICA_PORT}` (from the replica's env file) and `--config %d/sglang-config.yaml` (its own
credentials folder). Every instance is read back as systemd reads it (unitcheck.check_instance:
its specifiers, its env files, the `${NAME}` word resolved) and must give exactly that
replica's argv and environment, or the render is refused like any other.
"""

from __future__ import annotations

from importlib.resources import files as package_files

from dsv4deploy.gateway import model as gateway
from dsv4deploy.profile import network, replicas
from dsv4deploy.profile.boundary import RENDERED_LINE_MAX
from dsv4deploy.profile.errors import ProfileError
from dsv4deploy.profile.load import Profile
from dsv4deploy.render import keys, unitcheck
from dsv4deploy.render.argv import SGLANG_CONFIG_CREDENTIAL, launch_argv
from dsv4deploy.render.layout import Layout
from dsv4deploy.render.nccl import nccl_environment, render_env_file
from dsv4deploy.render.rendered import Rendered, RenderedGateway, RenderedReplica, manifest_base, manifest_text
from dsv4deploy.render.systemd import (blame, check_template_inputs, systemd_env, systemd_exec, systemd_word,
                                       templates, unit_specifiers)
from dsv4deploy.sglang.flags import HOME_ENV, home_environment, unit_environment
from dsv4deploy.sglang.versions import facts

PORT_VAR = "DSV4_REPLICA_PORT"
GATEWAY_ENV = {"PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}


def instance_specifiers(service: str, index: int) -> dict[str, str]:
    """The specifiers of instance `<service>@<index>.service` as systemd resolves them."""
    name = f"{service}@{index}"
    return {"n": f"{name}.service", "N": name, "p": service, "P": service, "i": str(index), "I": str(index),
            "d": f"/run/credentials/{name}.service"}


def replica_env_text(env: dict[str, str], header: str) -> str:
    return render_env_file(env, header, read_by="systemd (EnvironmentFile=) for this instance only")


def render_replicas(profile: Profile, module: str) -> Rendered:
    data = profile.data
    layout = Layout.of(data)
    plan = replicas.plan(data)
    server, service = data["server"], data["service"]
    keyed = bool(server.get("api_key"))
    template_argv = launch_argv(profile, module, port="${" + PORT_VAR + "}",
                                config=f"%d/{SGLANG_CONFIG_CREDENTIAL}" if keyed else None)
    raw = {template_argv.index("--port") + 1} | ({template_argv.index("--config") + 1} if keyed else set())
    env = {**unit_environment(data), **home_environment(layout.home)}
    nccl_vars = nccl_environment(data["nccl"]["preset"], data["nccl"].get("overrides"),
                                 one_host=network.single_host(data))
    inputs = dict(
        profile=profile.name, content_hash=profile.content_hash,
        sglang_version=data["sglang"]["version"], model_repo=data["model"]["repo"],
        manifest=layout.manifest, user=service["user"], home=layout.home,
        state_directory=layout.state_directory,
        nccl_env=layout.replica_nccl_env("%i"), extra_env_files=[layout.replica_env("%i")],
        credentials=[(SGLANG_CONFIG_CREDENTIAL, layout.sglang_config_secret)] if keyed else [],
        hardening=service.get("hardening", "strict"),
        environment=[systemd_env(k, v) for k, v in env.items()],
        exec_start=systemd_exec(template_argv, frozenset(raw)),
        timeout_start_s=service["timeout_start_s"], timeout_stop_s=service["timeout_stop_s"],
        start_limit_interval=max(600, 3 * service["timeout_start_s"]),
        instance_note=", replica %i", ip_allow=network.replica_allow(data) or [],
    )
    check_template_inputs(profile, inputs)
    unit = templates().get_template("sglang.service.j2").render(**inputs)
    files = {layout.template_unit: unit}
    rendered_replicas = []
    found: list[tuple[tuple, tuple, str]] = [(loc, template_argv, f"{layout.template_unit}: {msg}") for loc, msg in
                                             unitcheck.check_ip_access(unit, network.replica_allow(data))
                                             + unitcheck.check_home(unit, layout.home, HOME_ENV,
                                                                    instance_specifiers(layout.service, 0))
                                             + keys.check(unit, layout, keys.has_admin_key(data),
                                                          keys.SERVER_HOLDS if keyed else frozenset())]
    for r in plan.replicas:
        instance = layout.instance(r.index)
        argv = launch_argv(profile, module, port=str(r.port),
                           config=layout.instance_credential_path(r.index, SGLANG_CONFIG_CREDENTIAL) if keyed else None)
        own = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": r.cuda_visible_devices, PORT_VAR: str(r.port)}
        env_path, nccl_path = layout.replica_env(r.index), layout.replica_nccl_env(r.index)
        env_text = replica_env_text(own, f"Replica {r.index} of profile {profile.name} ({instance}.service): "
                                         f"GPUs {r.cuda_visible_devices}, port {r.port}")
        nccl_text = render_env_file(nccl_vars, f"NCCL preset {data['nccl']['preset']} for profile {profile.name}, "
                                               f"replica {r.index} ({instance}.service)")
        problems = unitcheck.check_instance(unit, argv, env, {nccl_path: nccl_text, env_path: env_text},
                                            instance_specifiers(layout.service, r.index), RENDERED_LINE_MAX,
                                            quote=systemd_word)
        problems += [(("nccl",) + loc[1:], msg) for loc, msg in unitcheck.check_env_file(nccl_text, nccl_vars)]
        problems += [(("replicas",), msg) for _, msg in unitcheck.check_env_file(env_text, own)]
        found += [(loc, argv, f"{instance}.service: {msg}") for loc, msg in problems]
        files[env_path], files[nccl_path] = env_text, nccl_text
        rendered_replicas.append(RenderedReplica(index=r.index, instance=instance, gpus=r.gpus, port=r.port,
                                                 url=r.url, argv=argv, env_file=env_path, nccl_env_file=nccl_path))
    gw = _gateway(profile, layout, plan, keyed)
    found += [(loc, gw.argv, f"{gw.service}.service: {msg}") for loc, msg in
              unitcheck.check_unit(gw.unit, gw.argv, GATEWAY_ENV, unit_specifiers(gw.service), RENDERED_LINE_MAX,
                                   quote=systemd_word) + unitcheck.check_ip_access(gw.unit, network.gateway_allow(data))
              + keys.check(gw.unit, layout, keys.has_admin_key(data), keys.GATEWAY_HOLDS if keyed else frozenset())]
    if found:
        raise ProfileError([profile.problem(_where(profile, argv, loc), f"refused at render: {msg}")
                            for loc, argv, msg in found])
    files[gw.unit_path] = gw.unit
    files[gw.launcher] = package_files("dsv4deploy").joinpath("gateway", "launcher.py").read_text()
    manifest = _manifest(profile, layout, module, template_argv, rendered_replicas, gw, plan, files)
    files[layout.manifest] = manifest
    first = rendered_replicas[0]
    return Rendered(argv=first.argv, unit=unit, nccl_env=files[first.nccl_env_file], manifest=manifest,
                    files=files, replicas=tuple(rendered_replicas), gateway=gw)


def _where(profile: Profile, argv: list[str], loc: tuple) -> tuple:
    if loc[0] in ("replicas",):
        return loc
    if loc[0] == "gateway":
        return ("replicas", "gateway")
    return blame(profile, argv, loc)


def _gateway(profile: Profile, layout: Layout, plan, keyed: bool) -> RenderedGateway:
    spec = plan.gateway
    lock = gateway.lock_sha256(spec.version)
    venv = Layout.gateway_venv(spec.version, lock)
    launcher = f"{venv}/{gateway.LAUNCHER_FILE}"
    version = facts(profile.data["sglang"]["version"])
    probe = ("/ready", 5) if version is not None and version.has_ready_endpoint else ("/health", 30)
    flags = gateway.launch_flags(plan.worker_urls, spec.host, spec.port, spec.policy, spec.metrics_port, *probe)
    argv = gateway.launcher_argv(f"{venv}/bin/python", launcher, flags, keyed)
    service = layout.gateway_service
    first, last = layout.instance(0), layout.instance(len(plan.replicas) - 1)
    inputs = dict(
        smg_version=spec.version,
        instances=first if first == last else f"{first}..{plan.replicas[-1].index}", manifest=layout.manifest,
        environment=[systemd_env(k, v) for k, v in GATEWAY_ENV.items()],
        credentials=[(gateway.KEY_CREDENTIAL, layout.api_key_file),
                     (gateway.CONTROL_CREDENTIAL, layout.gateway_control_key_file)] if keyed else [],
        exec_start=systemd_exec(argv), timeout_stop_s=gateway.SHUTDOWN_GRACE_S + 30,
        ip_allow=network.gateway_allow(profile.data),
    )
    check_template_inputs(profile, inputs)
    unit = templates().get_template("gateway.service.j2").render(**inputs)
    host = f"[{spec.host}]" if ":" in spec.host else spec.host
    return RenderedGateway(service=service, unit_path=layout.gateway_unit, unit=unit, argv=argv, version=spec.version,
                           venv=venv, lock_sha256=lock, launcher=launcher, endpoint=f"http://{host}:{spec.port}",
                           metrics=f"{gateway.METRICS_HOST}:{spec.metrics_port}", worker_urls=plan.worker_urls)


def _manifest(profile, layout, module, template_argv, reps, gw, plan, files) -> str:
    return manifest_text({**manifest_base(profile, layout, module, template_argv),
        "service": layout.service,
        "template_unit": layout.template_unit,
        "endpoint": {"host": plan.gateway.host, "port": plan.gateway.port},
        "replicas": [{"index": r.index, "instance": r.instance, "gpus": list(r.gpus), "port": r.port, "url": r.url,
                      "argv": r.argv, "env_file": r.env_file, "nccl_env_file": r.nccl_env_file} for r in reps],
        "drain_timeout_s": plan.drain_timeout_s,
        "gateway": {"service": gw.service, "unit": gw.unit_path, "version": gw.version, "venv": gw.venv,
                    "lock_sha256": gw.lock_sha256, "argv": gw.argv, "policy": plan.gateway.policy,
                    "endpoint": gw.endpoint, "metrics": gw.metrics, "worker_urls": gw.worker_urls},
    }, files)
