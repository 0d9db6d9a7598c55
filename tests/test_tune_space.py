"""The search space: the profile's tune: block (schema-checked with file and line) and --set."""

from __future__ import annotations

import pytest

from dsv4deploy.profile.errors import ProfileError
from checkout import load_profile
from dsv4deploy.tune.knobs import KNOBS, parse_set
from dsv4deploy.tune.space import MAX_CANDIDATES, build_space


def test_the_shipped_baseline_searches_context_length_and_memory_fraction_at_c64():
    space = build_space(load_profile("fp8-ctx1m-baseline"))
    assert 8192 in space.values["server.context_length"]
    assert 0.85 in space.values["server.mem_fraction_static"]
    assert space.concurrency == 64
    file, line = space.origins["server.context_length"]
    assert file.endswith("fp8-ctx1m-baseline.yaml") and line


def test_an_unknown_knob_in_the_tune_block_is_refused_with_file_line_and_a_hint(profile_dir):
    profile_dir.write("typo", """
        extends: fp8-ctx1m-baseline
        tune:
          space:
            server.contxt_length: [8192]
    """)
    with pytest.raises(ProfileError) as exc:
        load_profile("typo")
    text = str(exc.value)
    assert "typo.yaml:4" in text and "unknown key" in text and "did you mean server.context_length" in text


def test_unknown_keys_of_the_tune_block_itself_are_refused(profile_dir):
    profile_dir.write("typo", """
        extends: fp8-ctx1m-baseline
        tune:
          budget: 60
    """)
    with pytest.raises(ProfileError) as exc:
        load_profile("typo")
    assert "typo.yaml:3" in str(exc.value) and "tune.budget: unknown key" in str(exc.value)


def test_a_tune_value_is_bounded_exactly_as_the_key_it_sets(profile_dir):
    profile_dir.write("bad", """
        extends: fp8-ctx1m-baseline
        tune:
          space:
            server.mem_fraction_static: [0.7, 1.5]
            nccl.preset: [ll-ring, fast]
    """)
    with pytest.raises(ProfileError) as exc:
        load_profile("bad")
    text = str(exc.value)
    assert 'tune.space["server.mem_fraction_static"][1]: expected a value <= 0.99' in text
    assert 'tune.space["nccl.preset"][1]: expected one of ll-ring, p2p, nop2p' in text


def test_set_replaces_the_profiles_values_for_that_knob_only():
    base = load_profile("fp8-ctx1m-baseline")
    space = build_space(base, ["server.context_length=4096,8192"], concurrency=16, budget_s=600)
    assert space.values["server.context_length"] == (4096, 8192)
    assert space.values["server.mem_fraction_static"] == tuple(base.data["tune"]["space"]["server.mem_fraction_static"])
    assert space.origins["server.context_length"] == ("<command line>", None)
    assert space.concurrency == 16 and space.budget_s == 600
    assert any("replaces" in n for n in space.notes)


@pytest.mark.parametrize("word, key, words", [
    ("server.contxt_length=8192", "--set server.contxt_length", "did you mean server.context_length"),
    ("server.context_length=8k", "--set server.context_length", "plain integer"),
    ("server.mem_fraction_static=0.7,abc", "--set server.mem_fraction_static", "decimal number"),
    ("server.mem_fraction_static=0", "--set server.mem_fraction_static", "out of range"),
    ("server.moe_runner_backend=marlln", "--set server.moe_runner_backend", "did you mean marlin"),
    ("server.disable_custom_all_reduce=yes", "--set server.disable_custom_all_reduce", "true or false"),
    ("server.context_length=8192,,4096", "--set server.context_length", "empty value"),
    ("server.context_length", "--set", "KNOB=VALUE"),
])
def test_bad_set_names_the_key(word, key, words):
    with pytest.raises(ProfileError) as exc:
        parse_set(word)
    problem = exc.value.problems[0]
    assert problem.file == "<command line>" and problem.path == key and words in problem.message


def test_set_values_are_typed_by_the_schema():
    assert parse_set("server.mem_fraction_static=0.70,.8") == (KNOBS["server.mem_fraction_static"], [0.7, 0.8])
    assert parse_set("server.disable_custom_all_reduce=true")[1] == [True]
    assert parse_set("nccl.preset=nop2p,ll-ring")[1] == ["nop2p", "ll-ring"]


def test_a_profile_without_a_space_and_no_set_has_nothing_to_search():
    with pytest.raises(ProfileError) as exc:
        build_space(load_profile("nvfp4-ctx8k"))
    assert "nothing to search" in str(exc.value) and "nvfp4-ctx8k.yaml" in str(exc.value)


def test_too_many_combinations_are_refused_before_anything_is_checked():
    base = load_profile("nvfp4-ctx8k")
    sets = [f"server.context_length={','.join(str(4096 * i) for i in range(1, 17))}",
            f"server.max_running_requests={','.join(str(i) for i in range(1, 17))}"]
    assert build_space(base, sets).size == 256 == MAX_CANDIDATES
    with pytest.raises(ProfileError) as exc:
        build_space(base, sets + ["server.mem_fraction_static=0.6,0.7"])
    assert f"512 combinations" in str(exc.value) and f"at most {MAX_CANDIDATES}" in str(exc.value)


def test_default_concurrency_is_the_highest_gate_level():
    assert build_space(load_profile("nvfp4-ctx8k"), ["server.context_length=8192"]).concurrency == 64
