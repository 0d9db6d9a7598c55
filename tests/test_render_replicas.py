"""Rendering replicas: one templated unit whose every instance reads back (systemd's rules:
its specifiers, its env files, `${DSV4_REPLICA_PORT}`) to exactly that replica's argv, GPUs and
credentials; and the gateway's unit, argv and launcher."""

from __future__ import annotations

import json
import shlex

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsv4deploy.gateway import model as gateway
from dsv4deploy.render import unitcheck
from dsv4deploy.profile.errors import ProfileError
from checkout import load_profile
from dsv4deploy.render.unit import render
from dsv4deploy.render.replicas import instance_specifiers
from dsv4deploy.render.unitcheck import SyntaxProblem, env_file, exec_argv, unit_directives
from dsv4deploy.profile.validate import validate

DP2 = "nvfp4-ctx8k-dp2"


def exec_start(unit: str) -> str:
    return next(d.value for d in unit_directives(unit) if d.key == "ExecStart")


def instance_argv(rendered, index: int) -> list[str]:
    """What systemd starts for instance <index>: the template read with that instance's env files."""
    r = rendered.replicas[index]
    env = {**env_file(rendered.files[r.nccl_env_file]), **env_file(rendered.files[r.env_file])}
    return exec_argv(exec_start(rendered.unit), instance_specifiers("sglang", index), env)


def test_each_instance_starts_with_its_own_port_and_credentials():
    rendered = render(load_profile(DP2))
    for i, r in enumerate(rendered.replicas):
        argv = instance_argv(rendered, i)
        assert argv == r.argv
        assert argv[argv.index("--port") + 1] == str(30001 + i)
        assert argv[argv.index("--config") + 1] == f"/run/credentials/sglang@{i}.service/sglang-config.yaml"
        assert argv[argv.index("--host") + 1] == "127.0.0.1"


def test_each_instance_sees_only_its_gpus_in_pci_order():
    rendered = render(load_profile(DP2))
    for r, gpus in zip(rendered.replicas, ("0,1,2,3", "4,5,6,7")):
        env = env_file(rendered.files[r.env_file])
        assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": gpus, "DSV4_REPLICA_PORT": str(r.port)}
        assert env_file(rendered.files[r.nccl_env_file]) == {"NCCL_ALGO": "Ring", "NCCL_IB_DISABLE": "1", "NCCL_PROTO": "LL",
                                                             "NCCL_SOCKET_IFNAME": "lo", "GLOO_SOCKET_IFNAME": "lo",
                                                             "NCCL_CONF_FILE": "/dev/null"}


def test_the_check_would_catch_an_instance_reading_another_replicas_env_file():
    """The round trip is not its own witness: swap replica 1's env file for replica 0's and it fails."""
    rendered = render(load_profile(DP2))
    r0, r1 = rendered.replicas
    wrong = {r1.nccl_env_file: rendered.files[r1.nccl_env_file], r1.env_file: rendered.files[r0.env_file]}
    found = unitcheck.check_instance(rendered.unit, r1.argv, _unit_env(rendered), wrong,
                                     instance_specifiers("sglang", 1), 1 << 20)
    assert found and found[0][0][0] == "argv" and "30001" in found[0][1], found
    right = {**wrong, r1.env_file: rendered.files[r1.env_file]}
    assert unitcheck.check_instance(rendered.unit, r1.argv, _unit_env(rendered), right,
                                    instance_specifiers("sglang", 1), 1 << 20) == []


def test_an_env_file_the_release_does_not_render_is_refused():
    rendered = render(load_profile(DP2))
    r1 = rendered.replicas[1]
    found = unitcheck.check_instance(rendered.unit, r1.argv, _unit_env(rendered),
                                     {r1.nccl_env_file: rendered.files[r1.nccl_env_file]},
                                     instance_specifiers("sglang", 1), 1 << 20)
    assert found and "does not render" in found[0][1]


def _unit_env(rendered) -> dict:
    env = {}
    for d in unit_directives(rendered.unit):
        if d.key == "Environment":
            env.update(unitcheck.environment_assignments(d.value, {}))
    return env


def test_the_gateway_takes_the_public_endpoint_and_routes_to_the_replicas():
    rendered = render(load_profile(DP2))
    gw = rendered.gateway
    flags = gw.argv[gw.argv.index("--") + 1:]
    assert flags[flags.index("--host") + 1:flags.index("--host") + 2] == ["127.0.0.1"]
    assert flags[flags.index("--port") + 1] == "30000"
    assert flags[flags.index("--prometheus-host") + 1] == "127.0.0.1"
    assert flags[flags.index("--worker-urls") + 1:flags.index("--policy")] == [r.url for r in rendered.replicas]
    assert flags[flags.index("--policy") + 1] == "round_robin"
    assert flags[flags.index("--health-check-endpoint") + 1] == "/ready"
    assert gw.argv[0] == f"{gw.venv}/bin/python" and gw.argv[1] == gw.launcher
    assert gw.venv.startswith("/opt/dsv4deploy/venvs/smg-1.13.0-") and gw.lock_sha256[:12] in gw.venv


def test_no_key_anywhere_but_credentials(profile_dir):
    rendered = render(load_profile(DP2))
    argvs = [r.argv for r in rendered.replicas] + [rendered.gateway.argv]
    assert not any(w.startswith(("--api-key", "--control-plane-api-keys")) for argv in argvs for w in argv)
    gw_unit = rendered.files[rendered.gateway.unit_path]
    assert "\nLoadCredential=gateway-api-key:/etc/dsv4deploy/secrets/sglang-api-key\n" in gw_unit
    assert "\nLoadCredential=sglang-config.yaml:/etc/dsv4deploy/secrets/sglang-sglang-config.yaml\n" in rendered.unit
    for path, text in rendered.files.items():
        if path != rendered.gateway.launcher:  # (the launcher's source names the flags it refuses)
            assert "--api-key" not in text and "Bearer" not in text, path


def test_the_gateway_runs_the_shipped_launcher_and_a_change_to_it_changes_the_manifest():
    rendered = render(load_profile(DP2))
    launcher = rendered.files[rendered.gateway.launcher]
    assert launcher == open(gateway.__file__.replace("model.py", "launcher.py")).read()
    manifest = json.loads(rendered.manifest)
    assert rendered.gateway.launcher in manifest["files"]
    assert manifest["endpoint"] == {"host": "127.0.0.1", "port": 30000}
    assert [r["gpus"] for r in manifest["replicas"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_an_older_sglang_without_ready_is_probed_on_health(profile_dir):
    profile_dir.write("old", "extends: nvfp4-ctx8k-sglang0513post1\nreplicas: {count: 2}\n")
    gw = render(load_profile("old")).gateway
    assert gw.argv[gw.argv.index("--health-check-endpoint") + 1] == "/health"


def test_a_profile_without_a_key_starts_the_gateway_without_a_credential(profile_dir):
    profile_dir.write("open", "extends: nvfp4-ctx8k-dp2\nserver: {api_key: false}\n")
    rendered = render(load_profile("open"))
    assert "--key-credential" not in rendered.gateway.argv and "LoadCredential" not in rendered.gateway.unit
    assert "--config" not in rendered.replicas[0].argv and "LoadCredential" not in rendered.unit


def test_explicit_gpu_sets_and_base_port(profile_dir):
    profile_dir.write("x", "extends: nvfp4-ctx8k\nreplicas:\n  count: 2\n  gpus: [[4, 5, 6, 7], [0, 1, 2, 3]]\n"
                           "  base_port: 31001\n  gateway: {port: 31000, policy: round_robin}\n")
    rendered = render(load_profile("x"))
    assert [env_file(rendered.files[r.env_file])["CUDA_VISIBLE_DEVICES"] for r in rendered.replicas] == ["4,5,6,7",
                                                                                                      "0,1,2,3"]
    assert [instance_argv(rendered, i)[instance_argv(rendered, i).index("--port") + 1] for i in (0, 1)] == ["31001",
                                                                                                         "31002"]
    flags = rendered.gateway.argv
    assert flags[flags.index("--policy") + 1] == "round_robin" and flags[flags.index("--port") + 1] == "31000"


def test_the_template_cannot_be_read_without_the_instance():
    """A `${NAME}` the environment does not set would start SGLang with an empty --port: refused."""
    rendered = render(load_profile(DP2))
    with pytest.raises(SyntaxProblem, match="DSV4_REPLICA_PORT"):
        exec_argv(exec_start(rendered.unit), instance_specifiers("sglang", 0), {})


# --- property: any free text reaches every instance exactly, or is refused with file:line:key -------

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=16) | st.sampled_from(
    ["$", "$$", "%", "%i", "%d", "${X}", "${DSV4_REPLICA_PORT}", "\\", '"', "'", ";", " a b ", "\n", "\x00"])
FIELDS = {"extra_args": "server:\n  extra_args: [--chat-template, {}]\n",
          "env.value": "server:\n  env:\n    SGLANG_X: {}\n",
          "served_model_name": "model:\n  served_model_name: {}\n"}


@settings(max_examples=120, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@pytest.mark.slow
@given(field=st.sampled_from(sorted(FIELDS)), text=TEXT)
def test_any_text_reaches_every_instance_exactly_or_is_refused(profile_dir, field, text):
    profile_dir.write("p", "extends: nvfp4-ctx8k-dp2\n" + FIELDS[field].format(json.dumps(text)))
    try:
        report = validate(load_profile("p"))
        if report.errors:
            raise ProfileError(report.errors)
        rendered = render(report.profile)
    except ProfileError as exc:
        assert all(p.file and p.line and p.path and "\n" not in str(p) for p in exc.problems)
        return
    line = exec_start(rendered.unit)
    for i, r in enumerate(rendered.replicas):
        argv = instance_argv(rendered, i)
        assert argv == r.argv
        # a second reader: POSIX shlex on the line with the instance's specifiers and port put in
        words = [str(r.port) if w == "${DSV4_REPLICA_PORT}" else
                 f"/run/credentials/sglang@{i}.service/{w[3:]}" if w.startswith("%d/") else
                 w.replace("$$", "\0").replace("%%", "%").replace("\0", "$") for w in shlex.split(line)]
        assert words == argv
        if field == "extra_args":
            assert argv[-2:] == ["--chat-template", text]
        elif field == "served_model_name":
            assert argv[argv.index("--served-model-name") + 1] == text
