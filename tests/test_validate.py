"""Semantic validation: errors fail with numbers, warnings are listed."""

from __future__ import annotations

import pytest

from checkout import list_profiles, load_profile
from dsv4deploy.profile.validate import validate


def report_for(profile_dir, text: str):
    profile_dir.write("case", "extends: nvfp4-ctx8k\n" + text)
    return validate(load_profile("case"))


def errors(report) -> str:
    return "\n".join(str(p) for p in report.errors)


@pytest.mark.parametrize("name", list_profiles())
def test_every_shipped_profile_is_valid(name):
    report = validate(load_profile(name))
    assert report.ok, errors(report)
    assert report.budget.fits


def test_campaign_oom_configuration_is_rejected_with_its_numbers(profile_dir):
    report = report_for(profile_dir, "server:\n  mem_fraction_static: 0.85\n")
    msg = errors(report)
    assert "case.yaml:3: server.mem_fraction_static: CUDA-graph capture would run out of GPU memory" in msg
    assert "headroom 13.3 GiB" in msg and "static 81.3" in msg and "bs 32" in msg
    assert "use mem_fraction_static <= 0.75" in msg


def test_tp_must_divide_the_heads(profile_dir):
    assert "does not divide the model's 64 attention heads" in errors(report_for(profile_dir, "server:\n  tp_size: 3\n"))


def test_tp_needs_that_many_gpus_on_the_host(profile_dir):
    msg = errors(report_for(profile_dir, "server:\n  tp_size: 16\n"))
    assert "needs 16 GPUs per host" in msg and "the host has 8" in msg


def test_context_above_the_model_max(profile_dir):
    assert "exceeds the model's maximum context 1048576" in errors(
        report_for(profile_dir, "server:\n  context_length: 2000000\n"))


def test_context_below_the_smoke_requests(profile_dir):
    msg = errors(report_for(profile_dir, "server:\n  context_length: 300\n"))
    assert "gate.levels[0]: a request of 512 tokens (input + output) exceeds context_length 300" in msg


def test_kv_pool_smaller_than_one_full_context_request(profile_dir):
    msg = errors(report_for(profile_dir, "server:\n  tp_size: 2\n  mem_fraction_static: 0.92\n"
                                         "  context_length: 1048576\n  moe_runner_backend: marlin\n"))
    assert "less than one full-context request (1,048,576)" in msg


def test_fewer_full_context_requests_than_max_running_is_a_warning():
    report = validate(load_profile("fp8-ctx1m-baseline"))
    assert report.ok
    assert any("fewer than max_running_requests 256" in str(w) for w in report.warnings)


def test_extra_args_may_not_override_a_managed_flag(profile_dir):
    msg = errors(report_for(profile_dir, "server:\n  extra_args: [--tp, '8', --context-length=4096]\n"))
    assert "extra_args[0]: SGLang 0.5.23 has no flag --tp; abbreviations are not allowed: write --tp-size" in msg
    assert "extra_args[2]: --context-length is managed by the profile (server.context_length" in msg


@pytest.mark.parametrize("value", [1, 4])
def test_num_continuous_decode_steps_is_a_warning_at_any_value(profile_dir, value):
    """SGLang 0.5.12-0.5.23 declare the flag but never read it: the key is not rendered, and an old
    profile that still sets it (even to 1) is told so, without failing."""
    from dsv4deploy.render.argv import server_args

    report = report_for(profile_dir, f"server:\n  num_continuous_decode_steps: {value}\n")
    assert report.ok, errors(report)
    warned = [str(w) for w in report.warnings if w.path == "server.num_continuous_decode_steps"]
    assert len(warned) == 1, report.warnings
    assert "case.yaml:3: warning: server.num_continuous_decode_steps: --num-continuous-decode-steps is declared by " \
           "SGLang 0.5.12-0.5.23 but never read" in warned[0] and "not rendered" in warned[0]
    assert not any("continuous" in a for a in server_args(load_profile("case")))


def test_shipped_profiles_do_not_set_num_continuous_decode_steps():
    for name in list_profiles():
        report = validate(load_profile(name))
        assert "num_continuous_decode_steps" not in load_profile(name).data["server"], name
        assert not any("continuous" in str(w) for w in report.warnings), name


@pytest.mark.parametrize("args", ["[--num-continuous-decode-steps, '4']", "['--num-continuous-decode-steps=1']"])
def test_extra_args_may_not_sneak_in_num_continuous_decode_steps(profile_dir, args):
    msg = errors(report_for(profile_dir, f"server:\n  extra_args: {args}\n"))
    assert ("extra_args[0]: --num-continuous-decode-steps is declared by SGLang 0.5.12-0.5.23 but never read"
            in msg) and "not rendered" in msg


def test_extra_args_unknown_flag(profile_dir):
    assert "has no flag --turbo" in errors(report_for(profile_dir, "server:\n  extra_args: [--turbo]\n"))


def test_extra_args_known_flag_passes(profile_dir):
    assert report_for(profile_dir, "server:\n  extra_args: [--watchdog-timeout, '600']\n").ok


def test_unknown_sglang_version_is_refused(profile_dir):
    assert "no flag data for SGLang 0.4.0" in errors(report_for(profile_dir, "sglang:\n  version: 0.4.0\n"))


def test_moe_backend_without_sm120_kernels(profile_dir):
    msg = errors(report_for(profile_dir, "server:\n  moe_runner_backend: flashinfer_trtllm_routed\n"))
    assert "has no kernels for NVIDIA RTX PRO 6000" in msg


def test_nop2p_requires_disabling_custom_all_reduce(profile_dir):
    msg = errors(report_for(profile_dir, "nccl:\n  preset: nop2p\n"))
    assert "nop2p NCCL preset needs disable_custom_all_reduce: true" in msg


# Every spelling the renderer turns into NCCL_P2P_DISABLE=1, or that NCCL reads as 1 (strtol, base 0).
P2P_OFF = ["1", "'1'", '"1"', "0x1", "001", "'01'", "'0x1'", "'+1'"]


@pytest.mark.parametrize("spelling", P2P_OFF)
def test_p2p_off_needs_custom_all_reduce_off_in_every_spelling(profile_dir, spelling):
    """Issue 37: `NCCL_P2P_DISABLE: 1` (a YAML integer) passed while "1" was refused."""
    report = report_for(profile_dir, f"nccl:\n  preset: ll-ring\n  overrides:\n    NCCL_P2P_DISABLE: {spelling}\n")
    assert [(p.path, p.line) for p in report.errors] == [("nccl.overrides.NCCL_P2P_DISABLE", 5)]
    assert "P2P off (NCCL_P2P_DISABLE=" in report.errors[0].message


@pytest.mark.parametrize("spelling", P2P_OFF)
def test_p2p_off_with_custom_all_reduce_off_passes_in_every_spelling(profile_dir, spelling):
    report = report_for(profile_dir, "server:\n  disable_custom_all_reduce: true\n"
                        f"nccl:\n  preset: ll-ring\n  overrides:\n    NCCL_P2P_DISABLE: {spelling}\n")
    assert report.ok, errors(report)


@pytest.mark.parametrize("spelling", ["0", "'0'", "'00'", "'0x0'"])
def test_nop2p_with_p2p_back_on_needs_nothing(profile_dir, spelling):
    """The rule reads the value nccl.env will hold, the preset's and the override's together."""
    report = report_for(profile_dir, f"nccl:\n  preset: nop2p\n  overrides:\n    NCCL_P2P_DISABLE: {spelling}\n")
    assert report.ok, errors(report)


@pytest.mark.parametrize("spelling", P2P_OFF)
def test_nop2p_with_p2p_off_again_blames_the_override(profile_dir, spelling):
    report = report_for(profile_dir, f"nccl:\n  preset: nop2p\n  overrides:\n    NCCL_P2P_DISABLE: {spelling}\n")
    assert [p.path for p in report.errors] == ["nccl.overrides.NCCL_P2P_DISABLE"]


def test_rules_read_env_and_nccl_values_as_rendered(profile_dir):
    """Normalized once at load: YAML 1 / "1" / true are the string "1", 0x10 is "16", false is "0"."""
    profile_dir.write("case", "extends: nvfp4-ctx8k\nserver:\n  env: {A: 1, B: '1', C: true, D: false, E: 0x10}\n"
                      "nccl:\n  preset: ll-ring\n  overrides: {NCCL_X: 1, NCCL_Y: '1', NCCL_Z: 0x10}\n")
    data = load_profile("case").data
    assert data["server"]["env"] == {"A": "1", "B": "1", "C": "1", "D": "0", "E": "16"}
    assert data["nccl"]["overrides"] == {"NCCL_X": "1", "NCCL_Y": "1", "NCCL_Z": "16"}


def test_old_driver_branch(profile_dir):
    assert "needs driver branch >= 570" in errors(report_for(profile_dir, "driver:\n  branch: 535\n"))


def test_an_api_key_needs_the_mask_patch(profile_dir):
    """SGLang logs the key at startup: without the shipped mask patch, an API key is refused."""
    msg = errors(report_for(profile_dir, "sglang:\n  patches: []\n"))
    assert "case.yaml:3: sglang.patches: server.api_key needs the mask patch" in msg
    assert "sha256: 0aedb3019048320fad4e53a8d787be443a8fefe6565aa502a774c8b8ecc53cc9" in msg
    assert report_for(profile_dir, "sglang:\n  patches: []\nserver:\n  api_key: false\n").ok
    older = errors(report_for(profile_dir, "sglang:\n  version: '0.5.22'\n"))
    assert "server.api_key: SGLang 0.5.22 writes the API key into the journal" in older
@pytest.mark.parametrize("args", [
    "[--lora-paths, a, b, --watchdog-timeout, '600']",
    "[--cuda-graph-bs-decode, '1', '2', '4', --enable-lora]",
    "[--model-checksum]",
    "[--model-checksum, abc, --random-seed, '-1']",
    "['--watchdog-timeout=600', --lora-paths]",
])
def test_extra_args_take_what_each_flag_takes(profile_dir, args):
    report = report_for(profile_dir, f"server:\n  extra_args: {args}\n")
    assert report.ok, errors(report)


@pytest.mark.parametrize("version", ["0.5.13.post1", "0.5.17", "0.5.20", "0.5.22", "0.5.23"])
def test_arity_data_covers_exactly_the_flags(version):
    from dsv4deploy.sglang.versions import facts
    f = facts(version)
    assert set(f.arity) == set(f.flags) and set(f.arity.values()) <= {"0", "1", "?", "*", "+"}
    assert f.takes("--tp-size") == "1" and f.takes("--enable-metrics") == "0" and f.takes("-h") == "0"
    assert f.min_driver_branch == 580


# --- PR #25820 (NVFP4 MoE for DeepSeek-V4): in every wheel from 0.5.14 on ----------------------

PR_OLD = "extends: nvfp4-ctx8k-sglang0513post1\n"


def test_pr25820_floor_is_0_5_14_for_every_known_release():
    """versions.yaml's nvfp4_dsv4_moe is the floor, release by release; a release below it names
    the backport made for it, one at or above it names none."""
    from dsv4deploy.sglang.patches import PR25820_PATCH, PR25820_SINCE
    from dsv4deploy.sglang.versions import facts, known_versions, version_key
    assert PR25820_SINCE == "0.5.14"
    assert "0.5.13.post1" in known_versions()
    for version in known_versions():
        f = facts(version)
        assert f.nvfp4_dsv4_moe == (version_key(version) >= version_key(PR25820_SINCE)), version
        assert (f.nvfp4_dsv4_moe_patch is None) == f.nvfp4_dsv4_moe, version
    assert facts("0.5.13.post1").nvfp4_dsv4_moe_patch == PR25820_PATCH["sha256"]
    assert version_key("0.5.13.post1") > version_key("0.5.13") and version_key("0.5.13.post1") < version_key("0.5.14")


def test_pre_pr25820_release_needs_its_backport(profile_dir):
    profile_dir.write("case", PR_OLD + "sglang:\n  patches: []\n")
    msg = errors(validate(load_profile("case")))
    assert "sglang.patches: SGLang 0.5.13.post1 predates PR #25820" in msg
    assert "sha256: d0a053912d877c43f9ed23af89b9429a095ba11adcd28b6bf9a8d915381b0fd2, strip: 2" in msg


def test_the_upstream_diff_is_not_the_backport(profile_dir):
    """Any patch used to satisfy the check; now only the backport made for that release does
    (the upstream diff itself does not apply to 0.5.13.post1)."""
    from dsv4deploy.sglang.patches import PR25820_UPSTREAM
    profile_dir.write("case", PR_OLD + "sglang:\n  patches:\n    - {name: up, file: " + PR25820_UPSTREAM["file"]
                      + ", sha256: " + PR25820_UPSTREAM["sha256"] + ", strip: 2}\n")
    assert "predates PR #25820" in errors(validate(load_profile("case")))


def test_a_release_with_pr25820_refuses_the_backport(profile_dir):
    from dsv4deploy.sglang.patches import PR25820_PATCH, profile_entry
    e = profile_entry(PR25820_PATCH)
    msg = errors(report_for(profile_dir, "server:\n  api_key: false\nsglang:\n  patches:\n"
                                         f"    - {{name: {e['name']}, file: {e['file']}, sha256: {e['sha256']}, strip: 2}}\n"))
    assert "sglang.patches: SGLang 0.5.23 already includes PR #25820 (every release from 0.5.14 on)" in msg


def test_pre_pr25820_profile_with_an_api_key_is_refused(profile_dir):
    """No mask patch exists for 0.5.13.post1, so its profile runs without a key."""
    profile_dir.write("case", PR_OLD + "server:\n  api_key: true\n")
    assert "server.api_key: SGLang 0.5.13.post1 writes the API key into the journal" in errors(
        validate(load_profile("case")))


def test_root_and_the_ssh_user_cannot_be_the_service_user(profile_dir):
    """root is refused by name for every inventory; the inventory's SSH user (the deploy's own
    login: the deploy would set its shell to nologin) when the inventory names it."""
    from dsv4deploy.profile.validate import ssh_user_problem

    assert "dedicated unprivileged user" in errors(report_for(profile_dir, "service:\n  user: root\n"))
    report = report_for(profile_dir, "service:\n  user: deploy\n")
    assert report.ok                                    # no inventory named: only the host can tell
    problem = ssh_user_problem(report.profile, "deploy")
    assert problem.path == "service.user" and "the inventory's SSH user" in str(problem)
    assert ssh_user_problem(report.profile, "ops") is None and ssh_user_problem(report.profile, None) is None
