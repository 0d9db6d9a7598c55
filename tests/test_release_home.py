"""Fresh state per release (issue 37, item 7): the server's HOME and JIT caches are its venv's own
folder, so a restart of the same venv keeps its compiled kernels, a new venv (a new release's
code) starts empty, and nothing one release's model code writes is read by another's; NCCL reads
no conf file from the account's persistent home. Each is read back from the rendered unit."""

from __future__ import annotations

import pytest

from checkout import load_profile
from dsv4deploy.profile.errors import ProfileError
from dsv4deploy.profile.validate import validate
from dsv4deploy.render import unitcheck
from dsv4deploy.render.layout import HOMES, Layout, venv_of_home
from dsv4deploy.render.systemd import unit_specifiers
from dsv4deploy.render.unit import check_round_trip, render
from dsv4deploy.render.unitcheck import env_file, environment_assignments, unit_directives
from dsv4deploy.sglang.flags import HOME_ENV


def _service(unit: str) -> tuple[dict[str, list[str]], dict[str, str]]:
    """([Service] settings by key, the environment Environment= gives) as systemd reads them."""
    settings: dict[str, list[str]] = {}
    env: dict[str, str] = {}
    for d in unit_directives(unit):
        if d.section == "Service":
            settings.setdefault(d.key, []).append(d.value)
            if d.key == "Environment":
                env.update(environment_assignments(d.value, unit_specifiers("sglang")))
    return settings, env


@pytest.mark.parametrize("name", ["nvfp4-ctx8k", "nvfp4-ctx8k-dp2"])
def test_the_server_keeps_its_home_and_caches_in_its_venvs_own_folder(name):
    data = load_profile(name).data
    layout = Layout.of(data)
    home = layout.home
    assert home == f"{HOMES}/sglang/{layout.venv.rsplit('/', 1)[1]}" and home != layout.state_dir
    settings, env = _service(render(load_profile(name)).unit)
    assert settings["StateDirectory"] == [home.removeprefix("/var/lib/")] and settings["StateDirectoryMode"] == ["0700"]
    assert settings["WorkingDirectory"] == [home] and env["HOME"] == home
    # every cache the libraries pick by themselves, and then nothing else is writable
    for name_ in HOME_ENV:
        assert env[name_] == home or env[name_].startswith(home + "/"), name_
    assert {"TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE", "HF_HOME",
            "XDG_CACHE_HOME", "SGLANG_CACHE_DIR", "CUDA_CACHE_PATH", "TVM_FFI_CACHE_DIR"} <= set(HOME_ENV)
    assert "ReadWritePaths" not in settings and settings["ProtectSystem"] == ["strict"]
    assert "/models/" not in env["HF_HOME"]          # the weights stay where they are


def test_a_new_venv_starts_empty_and_the_same_venv_keeps_its_caches(profile_dir):
    profile_dir.write("tuned", "extends: nvfp4-ctx8k\nserver: {mem_fraction_static: 0.66}\n")
    profile_dir.write("older", "extends: nvfp4-ctx8k-sglang0513post1\n")
    same, tuned, older = (Layout.of(load_profile(n).data) for n in ("nvfp4-ctx8k", "tuned", "older"))
    assert tuned.venv == same.venv and tuned.home == same.home          # a restart with other flags: warm
    assert older.venv != same.venv and older.home != same.home          # another venv: its own, empty
    assert venv_of_home(same.home) == same.venv and venv_of_home(older.home) == older.venv


def test_venv_of_home_names_only_a_home():
    assert venv_of_home(f"{HOMES}/sglang/sglang-0.5.23-abc") == "/opt/dsv4deploy/venvs/sglang-0.5.23-abc"
    for other in (f"{HOMES}/sglang", f"{HOMES}/sglang/x/y", "/var/lib/dsv4deploy/sglang", f"{HOMES}//x", "/x"):
        assert venv_of_home(other) is None, other


def test_nccl_reads_no_conf_file_from_the_accounts_home():
    """NCCL reads ~/.nccl.conf from the passwd home (not $HOME) unless NCCL_CONF_FILE names a file."""
    rendered = render(load_profile("nvfp4-ctx8k"))
    assert env_file(rendered.nccl_env)["NCCL_CONF_FILE"] == "/dev/null"
    dp2 = render(load_profile("nvfp4-ctx8k-dp2"))
    for r in dp2.replicas:
        assert env_file(dp2.files[r.nccl_env_file])["NCCL_CONF_FILE"] == "/dev/null"


def test_a_unit_that_lets_the_server_write_elsewhere_is_refused():
    profile = load_profile("nvfp4-ctx8k")
    rendered = render(profile)
    layout = Layout.of(profile.data)
    args = (rendered.argv, {**_service(rendered.unit)[1]}, env_file(rendered.nccl_env), ["localhost"])
    check_round_trip(profile, rendered.unit, rendered.nccl_env, *args)        # as rendered: passes
    doctored = {
        "ReadWritePaths": rendered.unit.replace("ProtectSystem=strict\n",
                                                f"ProtectSystem=strict\nReadWritePaths={layout.state_dir}\n"),
        "StateDirectory": rendered.unit.replace(f"StateDirectory={layout.state_directory}",
                                                "StateDirectory=dsv4deploy/sglang"),
        "WorkingDirectory": rendered.unit.replace(f"WorkingDirectory={layout.home}",
                                                  f"WorkingDirectory={layout.state_dir}"),
    }
    for key, unit in doctored.items():
        with pytest.raises(ProfileError, match=key):
            check_round_trip(profile, unit, rendered.nccl_env, *args)
    found = unitcheck.check_home(rendered.unit.replace(f"Environment=HOME={layout.home}",
                                                       f"Environment=HOME={layout.state_dir}"),
                                 layout.home, HOME_ENV, unit_specifiers("sglang"))
    assert [msg for _, msg in found] == [f"Environment= gives HOME='{layout.state_dir}', not the venv's own home "
                                         f"{layout.home} or under it"]


@pytest.mark.parametrize("key", ["HOME", "XDG_CACHE_HOME", "TRITON_CACHE_DIR", "HF_HOME", "FLASHINFER_WORKSPACE_BASE"])
def test_a_profile_cannot_point_the_home_or_a_cache_elsewhere(profile_dir, key):
    profile_dir.write("p", f"extends: nvfp4-ctx8k\nserver:\n  env:\n    {key}: /var/lib/dsv4deploy/sglang\n")
    report = validate(load_profile("p"))
    assert [p.path for p in report.errors] == [f"server.env.{key}"]
    assert "release's own folder" in report.errors[0].message


def test_a_profile_cannot_give_nccl_a_conf_file(profile_dir):
    profile_dir.write("p", "extends: nvfp4-ctx8k\nnccl:\n  overrides:\n    NCCL_CONF_FILE: /var/lib/dsv4deploy/sglang/x\n")
    report = validate(load_profile("p"))
    assert [p.path for p in report.errors] == ["nccl.overrides.NCCL_CONF_FILE"]
