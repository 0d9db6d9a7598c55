"""Loading, merging and schema-checking profiles; every error names file, line and key."""

from __future__ import annotations

import pytest

from dsv4deploy.profile.errors import ProfileError
from checkout import list_profiles, load_profile

SHIPPED = list_profiles()


def problems_of(name: str) -> list[str]:
    with pytest.raises(ProfileError) as info:
        load_profile(name)
    return [str(p) for p in info.value.problems]


def test_the_four_required_profiles_ship():
    assert {"nvfp4-ctx8k", "fp8-ctx1m-baseline", "mxfp4-tp2-cookbook", "nvfp4-tp8-nop2p"} <= set(SHIPPED)
    assert not any(name.startswith("_") for name in SHIPPED), "bases are not deployable"


@pytest.mark.parametrize("name", SHIPPED)
def test_every_profile_names_the_schema_for_editors(name):
    from checkout import profiles_dir
    first = (profiles_dir() / f"{name}.yaml").read_text().splitlines()[0]
    assert first == "# yaml-language-server: $schema=../dsv4deploy/schema/profile.schema.json"


def test_extends_merges_and_child_wins():
    p = load_profile("nvfp4-ctx8k")
    assert p.server["context_length"] == 8192          # from the profile
    assert p.server["tp_size"] == 4                    # from _ct200-base
    assert p.data["service"]["timeout_start_s"] == 1800  # from package defaults
    assert p.files == ("profiles/_ct200-base.yaml", "profiles/nvfp4-ctx8k.yaml")
    assert p.where(("server", "context_length"))[0].endswith("nvfp4-ctx8k.yaml")
    assert p.where(("server", "tp_size"))[0].endswith("_ct200-base.yaml")


def test_content_hash_is_stable_and_changes_with_content(profile_dir):
    a = load_profile("nvfp4-ctx8k").content_hash
    assert a == load_profile("nvfp4-ctx8k").content_hash
    profile_dir.write("variant", "extends: nvfp4-ctx8k\nserver:\n  context_length: 16384\n")
    assert load_profile("variant").content_hash != a


def test_unknown_key_suggests_the_closest(profile_dir):
    profile_dir.write("typo", """
        extends: nvfp4-ctx8k
        server:
          mem_fracton_static: 0.8
        """)
    (msg,) = problems_of("typo")
    assert msg.endswith("typo.yaml:3: server.mem_fracton_static: unknown key; did you mean mem_fraction_static?")


def test_wrong_type_names_expected_and_got(profile_dir):
    profile_dir.write("wrongtype", "extends: nvfp4-ctx8k\nserver:\n  tp_size: four\n")
    (msg,) = problems_of("wrongtype")
    assert "wrongtype.yaml:3: server.tp_size: expected an integer, got string \"four\"" in msg


def test_out_of_range_number(profile_dir):
    profile_dir.write("range", "extends: nvfp4-ctx8k\nserver:\n  mem_fraction_static: 1.5\n")
    (msg,) = problems_of("range")
    assert "range.yaml:3: server.mem_fraction_static: expected a value <= 0.99, got 1.5" in msg


def test_all_errors_are_listed_at_once(profile_dir):
    profile_dir.write("many", "extends: nvfp4-ctx8k\nserver:\n  port: 0\n  bogus: 1\nnccl:\n  preset: fast\n")
    msgs = problems_of("many")
    assert len(msgs) == 3
    assert any("nccl.preset: expected one of ll-ring, p2p, nop2p" in m for m in msgs)


@pytest.mark.parametrize("where,text", [
    ("served_model_name", "model:\n  served_model_name: \"evil\\nExecStartPre=/bin/rm\"\n"),
    ("extra_args", "server:\n  extra_args: [\"--log-requests\\nUser=root\"]\n"),
    ("env", "server:\n  env:\n    SGLANG_X: \"a\\nb\"\n"),
    ("nccl", "nccl:\n  preset: ll-ring\n  overrides:\n    NCCL_DEBUG: \"INFO\\rX\"\n"),
])
def test_newline_injection_is_refused_everywhere(profile_dir, where, text):
    profile_dir.write("inject", "extends: nvfp4-ctx8k\n" + text)
    msgs = problems_of("inject")
    assert msgs and all("inject.yaml:" in m for m in msgs), msgs
    assert any("newline or control character" in m or "not valid here" in m for m in msgs), msgs


def test_malformed_yaml_names_the_line(profile_dir):
    profile_dir.write("broken", "extends: nvfp4-ctx8k\nserver:\n  tp_size: 4\n   port: 1\n")
    (msg,) = problems_of("broken")
    assert "broken.yaml:4: malformed YAML" in msg


def test_duplicate_key_is_an_error(profile_dir):
    profile_dir.write("dup", "extends: nvfp4-ctx8k\nserver:\n  tp_size: 4\n  tp_size: 8\n")
    (msg,) = problems_of("dup")
    assert "dup.yaml:4: server.tp_size: duplicate key" in msg


def test_extends_cycle_is_named(profile_dir):
    profile_dir.write("a", "extends: b\n")
    profile_dir.write("b", "extends: a\n")
    (msg,) = problems_of("a")
    assert "extends cycle: a -> b -> a" in msg and "b.yaml:1" in msg


def test_missing_profile_suggests(profile_dir):
    (msg,) = problems_of("nvfp4-ctx8")
    assert "no profile named 'nvfp4-ctx8'" in msg and "did you mean nvfp4-ctx8k?" in msg


def test_missing_parent_points_at_extends_line(profile_dir):
    profile_dir.write("orphan", "description: x\nextends: nope\n")
    (msg,) = problems_of("orphan")
    assert "orphan.yaml:2: extends: no profile named 'nope'" in msg


def test_missing_required_key(profile_dir):
    profile_dir.write("bare", "description: nothing else\n")
    msgs = problems_of("bare")
    assert any(m.endswith("profiles/bare.yaml:1: model.repo: missing required key "
                          "(Hugging Face repository id of the checkpoint)") for m in msgs), msgs
    assert any(m.endswith("profiles/bare.yaml:1: server.tp_size: missing required key "
                          "(tensor-parallel size (--tp-size))") for m in msgs), msgs


def test_patch_needs_url_or_file(profile_dir):
    profile_dir.write("patchy", "extends: nvfp4-ctx8k\nsglang:\n  patches:\n    - name: p\n      sha256: " + "a" * 64 + "\n")
    (msg,) = problems_of("patchy")
    assert "sglang.patches[0]: give exactly one of url or file" in msg
