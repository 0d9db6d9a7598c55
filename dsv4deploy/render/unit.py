"""Profile -> the exact files the host runs: launch argv, systemd unit, NCCL env file and a
launch manifest. Pure and deterministic: the same profile renders byte-identical output. A
profile with `replicas:` is rendered by render/replicas.py; the parts both share are in
render/argv.py, render/systemd.py and render/rendered.py.

Every release is read back with systemd's own rules (unitcheck.py) before it is returned: a
unit or env file that would give the process anything but the argv and environment the
profile asked for is a ProfileError naming the profile key, never a file on a host.
"""

from __future__ import annotations

from dsv4deploy.profile.boundary import RENDERED_LINE_MAX
from dsv4deploy.profile import network
from dsv4deploy.profile.errors import ProfileError
from dsv4deploy.profile.load import Profile
from dsv4deploy.render import keys, unitcheck
from dsv4deploy.render.argv import SGLANG_CONFIG_CREDENTIAL, SGLANG_MODULE, launch_argv
from dsv4deploy.render.layout import Layout
from dsv4deploy.render.nccl import nccl_environment, render_env_file
from dsv4deploy.render.rendered import Rendered, manifest_base, manifest_text
from dsv4deploy.render.replicas import render_replicas
from dsv4deploy.render.systemd import (blame, check_template_inputs, systemd_env, systemd_exec, systemd_word,
                                       templates, unit_specifiers)
from dsv4deploy.sglang.flags import HOME_ENV, home_environment, unit_environment


def render(profile: Profile, module: str = SGLANG_MODULE) -> Rendered:
    if profile.data.get("replicas") is not None:
        return render_replicas(profile, module)
    data = profile.data
    layout = Layout.of(data)
    server, service = data["server"], data["service"]
    argv = launch_argv(profile, module)
    env = {**unit_environment(data), **home_environment(layout.home)}
    nccl_vars = nccl_environment(data["nccl"]["preset"], data["nccl"].get("overrides"),
                                 one_host=network.single_host(data))
    nccl_env = render_env_file(nccl_vars, f"NCCL preset {data['nccl']['preset']} for profile {profile.name}")
    credentials = [(SGLANG_CONFIG_CREDENTIAL, layout.sglang_config_secret)] if server.get("api_key") else []
    inputs = dict(
        profile=profile.name, content_hash=profile.content_hash,
        sglang_version=data["sglang"]["version"], model_repo=data["model"]["repo"],
        manifest=layout.manifest, user=service["user"], home=layout.home,
        state_directory=layout.state_directory,
        nccl_env=layout.nccl_env, credentials=credentials, hardening=service.get("hardening", "strict"),
        environment=[systemd_env(k, v) for k, v in env.items()],
        exec_start=systemd_exec(argv),
        timeout_start_s=service["timeout_start_s"], timeout_stop_s=service["timeout_stop_s"],
        start_limit_interval=max(600, 3 * service["timeout_start_s"]),
        instance_note="", extra_env_files=[], ip_allow=network.server_allow(data) or [],
    )
    check_template_inputs(profile, inputs)
    unit = templates().get_template("sglang.service.j2").render(**inputs)
    check_round_trip(profile, unit, nccl_env, argv, env, nccl_vars, network.server_allow(data))
    files = {layout.unit: unit, layout.nccl_env: nccl_env}
    manifest = manifest_text({**manifest_base(profile, layout, module, argv), "service": service["name"],
                              "endpoint": {"host": server["host"], "port": server["port"]}}, files)
    files[layout.manifest] = manifest
    return Rendered(argv=argv, unit=unit, nccl_env=nccl_env, manifest=manifest, files=files)


# --- the guard: nothing reaches a host that systemd would read differently ---------------------

def check_round_trip(profile: Profile, unit: str, nccl_env: str, argv: list[str], env: dict[str, str],
                     nccl_vars: dict[str, str], ip_allow: list[str] | None) -> None:
    """Read the unit and the NCCL env file back as systemd does; raise ProfileError (naming the
    profile key each difference comes from) unless they give exactly `argv`, `env`, `nccl_vars`,
    the peers `ip_allow` (None: no IP rules), the venv's own home (unitcheck.check_home) and
    the server's keys only (keys.check)."""
    service = profile.data["service"]["name"]
    found = unitcheck.check_unit(unit, argv, env, unit_specifiers(service), RENDERED_LINE_MAX, quote=systemd_word)
    found += [(("nccl",) + loc[1:], msg) for loc, msg in unitcheck.check_env_file(nccl_env, nccl_vars)]
    found += unitcheck.check_ip_access(unit, ip_allow)
    found += unitcheck.check_home(unit, Layout.of(profile.data).home, HOME_ENV, unit_specifiers(service))
    found += keys.check(unit, Layout.of(profile.data), keys.has_admin_key(profile.data),
                        keys.SERVER_HOLDS if profile.data["server"].get("api_key") else frozenset())
    if found:
        raise ProfileError([profile.problem(blame(profile, argv, loc), f"refused at render: {msg}")
                            for loc, msg in found])
