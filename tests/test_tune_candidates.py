"""Pruning: every candidate goes through the real validator and memory budget; refused ones
carry the validator's own reason and point at the line that asked for the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkout import load_profile
from dsv4deploy.tune.candidates import build_candidates
from dsv4deploy.tune.space import build_space
from dsv4deploy.profile.validate import validate

REPO = Path(__file__).resolve().parent.parent


def candidates(name, sets=None):
    base = load_profile(name)
    return build_candidates(base, build_space(base, sets))


@pytest.fixture
def fp8_bare(profile_dir):
    """fp8-ctx1m-baseline without its tune: block, so --set alone makes the space."""
    profile_dir.write("fp8-bare", """
        extends: _ct200-base
        model:
          repo: deepseek-ai/DeepSeek-V4-Flash
          revision: "0000000000000000000000000000000000000000"
        server:
          moe_runner_backend: flashinfer_mxfp4
    """)
    return "fp8-bare"


def by_overrides(cands, **overrides):
    wanted = {k.replace("__", "."): v for k, v in overrides.items()}
    return next(c for c in cands if c.overrides == wanted)


def test_the_campaigns_085_at_tp4_is_refused_by_the_memory_budget():
    """0.85 OOMed in the campaign; 0.80 crashes on the twin's model too (memory_facts' reading of
    that OOM), so only 0.70 is tried."""
    cands = candidates("fp8-ctx1m-baseline")
    too_high = [c for c in cands if c.overrides.get("server.mem_fraction_static") in (0.80, 0.85)]
    assert too_high and all(c.refused for c in too_high)
    for c in too_high:
        assert c.errors[0].path == "server.mem_fraction_static"
        assert "CUDA-graph capture would run out of GPU memory" in c.reasons[0]
    assert not any(c.refused for c in cands if c.overrides.get("server.mem_fraction_static") not in (0.80, 0.85))


def test_a_refusal_points_at_the_tune_line_that_asked_for_the_value():
    cands = candidates("fp8-ctx1m-baseline")
    refused = next(c for c in cands if c.refused)
    problem = refused.errors[0]
    text = (REPO / "profiles" / "fp8-ctx1m-baseline.yaml").read_text().splitlines()
    assert problem.file.endswith("fp8-ctx1m-baseline.yaml")
    assert text[problem.line - 1].lstrip().startswith("server.mem_fraction_static:")


def test_the_reason_is_exactly_what_validate_says_about_the_same_profile_file(profile_dir):
    cands = candidates("fp8-ctx1m-baseline", ["server.context_length=8192", "server.mem_fraction_static=0.85"])
    refused = by_overrides(cands, server__context_length=8192, server__mem_fraction_static=0.85)
    profile_dir.write("by-hand", """
        extends: fp8-ctx1m-baseline
        server:
          context_length: 8192
          mem_fraction_static: 0.85
    """)
    report = validate(load_profile("by-hand"))
    assert [p.message for p in report.errors] == [p.message for p in refused.errors]


def test_weights_that_do_not_fit_and_backends_without_sm120_kernels_are_refused(fp8_bare):
    cands = candidates(fp8_bare, ["server.tp_size=2,4,8", "server.mem_fraction_static=0.7",
                                              "server.moe_runner_backend=flashinfer_mxfp4,auto"])
    tp2 = by_overrides(cands, server__tp_size=2)
    assert tp2.refused and "no room for the KV cache" in tp2.reasons[0]
    assert not by_overrides(cands, server__tp_size=8).refused
    auto = by_overrides(cands, server__moe_runner_backend="auto")
    assert auto.refused and "has no kernels for" in " ".join(auto.reasons)


def test_a_kv_pool_smaller_than_one_full_context_request_is_refused(fp8_bare):
    cands = candidates(fp8_bare, ["server.mem_fraction_static=0.5,0.7"])
    low = by_overrides(cands, server__mem_fraction_static=0.5)
    assert low.refused and "less than one full-context request" in low.reasons[0]


def test_knobs_are_checked_together_nop2p_needs_custom_all_reduce_off():
    cands = candidates("nvfp4-ctx8k", ["nccl.preset=ll-ring,nop2p", "server.disable_custom_all_reduce=false,true"])
    assert by_overrides(cands, nccl__preset="nop2p").refused
    assert not by_overrides(cands, nccl__preset="nop2p", server__disable_custom_all_reduce=True).refused


def test_the_base_comes_first_and_values_equal_to_the_base_are_not_candidates_again(fp8_bare):
    cands = candidates(fp8_bare, ["server.mem_fraction_static=0.7,0.8"])
    assert cands[0].is_base and cands[0].overrides == {} and not cands[0].refused
    assert [c.overrides for c in cands[1:]] == [{"server.mem_fraction_static": 0.8}]
    assert len({c.key for c in cands}) == len(cands)


def test_a_candidate_is_the_base_plus_its_overrides_and_nothing_else():
    base = load_profile("fp8-ctx1m-baseline")
    cands = build_candidates(base, build_space(base))
    c = by_overrides(cands, server__context_length=8192)
    assert c.profile.data["server"]["context_length"] == 8192
    assert "context_length" not in base.data["server"]          # the base was not changed
    rest = {k: v for k, v in c.profile.data["server"].items() if k != "context_length"}
    assert rest == base.data["server"]


def test_the_layout_is_a_knob_one_replica_is_the_single_server(fp8_bare):
    """replicas.count=1 is the profile as it is (no gateway), 2 is a set of two TP4 servers on all
    8 GPUs that the validator accepts; 3 sets of 4 GPUs do not fit CT200 and are refused with the
    validator's reason; the deployed document and the tuned profile carry the block."""
    from dsv4deploy.tune.rollout_backend import candidate_document
    from dsv4deploy.tune.objective import Level
    from dsv4deploy.tune.tuned import tuned_text

    cands = candidates(fp8_bare, ["server.context_length=8192", "replicas.count=1,2,3"])
    assert sorted(tuple(sorted(c.overrides.items())) for c in cands[1:]) == [
        (("replicas.count", 2), ("server.context_length", 8192)),
        (("replicas.count", 3), ("server.context_length", 8192)),
        (("server.context_length", 8192),)]
    two = by_overrides(cands, server__context_length=8192, replicas__count=2)
    three = by_overrides(cands, server__context_length=8192, replicas__count=3)
    assert not two.refused and two.profile.data["replicas"] == {"count": 2}
    assert three.refused and three.errors[0].path.startswith("replicas")
    doc = candidate_document(load_profile(fp8_bare), two, Level(0, 64, 64, 256, 256, False, 400.0))
    assert doc["replicas"] == {"count": 2} and doc["server"] == {"context_length": 8192}
    assert "replicas:\n  count: 2\n" in tuned_text(fp8_bare, two, description="d", notes=[])
