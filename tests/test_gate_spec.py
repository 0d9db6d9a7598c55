"""GateSpec from profiles: levels, defaults, floors and ceilings, run order."""

import pytest

from dsv4deploy.gate.spec import GateSpec, LevelSpec
from checkout import load_profile


def test_from_profile_reads_floors_and_defaults():
    spec = GateSpec.from_profile(load_profile("fp8-ctx1m-baseline").data)
    assert [(lv.concurrency, lv.num_prompts, lv.input_len, lv.output_len, lv.min_output_throughput)
            for lv in spec.levels] == [(1, 8, 256, 256, 10), (16, 48, 256, 256, 120), (64, 128, 256, 256, 400)]
    assert spec.runner == "auto" and spec.max_failed_requests == 0 and spec.warmup_requests == 2
    assert spec.budget_s == 1800
    assert spec.level(64).label == "C=64" and spec.level(64).total_output_tokens == 128 * 256


def test_gate_section_alone_and_level_defaults():
    spec = GateSpec.from_profile({"levels": [{"concurrency": 8, "num_prompts": 16, "max_p99_ttft_ms": 900,
                                              "max_p99_tpot_ms": 80}], "budget_s": 60, "runner": "builtin",
                                  "max_failed_requests": 1, "warmup_requests": 0})
    (lv,) = spec.levels
    assert (lv.input_len, lv.output_len) == (256, 256)           # default 256/256
    assert lv.min_output_throughput is None and lv.max_p99_ttft_ms == 900 and lv.max_p99_tpot_ms == 80
    assert (spec.runner, spec.budget_s, spec.max_failed_requests, spec.warmup_requests) == ("builtin", 60, 1, 0)


def test_missing_gate_gives_the_campaign_levels():
    spec = GateSpec.from_profile({})
    assert [(lv.concurrency, lv.num_prompts) for lv in spec.levels] == [(1, 8), (16, 48), (64, 128)]


def test_run_order_and_roundtrip():
    spec = GateSpec.from_profile(load_profile("nvfp4-ctx8k").data)
    assert [lv.concurrency for lv in spec.run_order()] == [64, 16, 1]
    assert [lv.concurrency for lv in spec.run_order("asis")] == [1, 16, 64]
    again = GateSpec.from_profile({"gate": spec.to_dict()})
    assert again == spec
    with pytest.raises(ValueError):
        GateSpec(runner="vllm")
    assert LevelSpec(4, 4).to_dict() == {"concurrency": 4, "num_prompts": 4, "input_len": 256, "output_len": 256}
