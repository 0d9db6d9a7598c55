"""The GPU-memory budget: the campaign's OOM is caught, its working settings pass."""

from __future__ import annotations

import pytest

from dsv4deploy.profile import catalog
from dsv4deploy.profile.memory import budget

RTX = catalog.gpu("rtx-pro-6000-blackwell")
FLASH = catalog.model("nvidia/DeepSeek-V4-Flash-NVFP4")


def server(**kw):
    base = {"tp_size": 4, "mem_fraction_static": 0.70, "cuda_graph_max_bs_decode": 32,
            "context_length": 8192, "max_running_requests": 64}
    base.update(kw)
    return base


def test_weights_per_gpu_at_tp4_match_the_campaign():
    b = budget(server(), RTX, FLASH)
    assert 36.5 <= b.weights_gib <= 38.0  # about 37 GiB per GPU at TP4 (36.5 GB observed)
    assert b.capacity_gib == pytest.approx(97887 / 1024)


def test_tp4_085_bs32_does_not_fit_but_070_does():
    assert not budget(server(mem_fraction_static=0.85), RTX, FLASH).fits
    assert budget(server(mem_fraction_static=0.70), RTX, FLASH).fits


def test_cookbook_tp2_092_bs32_fits():
    assert budget(server(tp_size=2, mem_fraction_static=0.92, context_length=262144), RTX, FLASH).fits


def test_reserve_grows_with_the_decode_graph_batch():
    small = budget(server(cuda_graph_max_bs_decode=8), RTX, FLASH)
    large = budget(server(cuda_graph_max_bs_decode=64), RTX, FLASH)
    assert large.reserve_gib > small.reserve_gib
    assert budget(server(mem_fraction_static=0.85, cuda_graph_max_bs_decode=8), RTX, FLASH).fits


def test_disabling_custom_all_reduce_at_tp2_costs_graph_memory():
    on = budget(server(tp_size=2), RTX, FLASH)
    off = budget(server(tp_size=2, disable_custom_all_reduce=True), RTX, FLASH)
    assert (on.allreduce_path, off.allreduce_path) == ("custom", "nccl")
    assert off.graph_gib > on.graph_gib


def test_kv_tokens_follow_the_calibration():
    default = budget(server(), RTX, FLASH)
    measured = budget(server(), RTX, FLASH, {"kv_bytes_per_token": 31800})
    assert measured.kv_tokens == pytest.approx(default.kv_tokens / 2, rel=1e-3)


def test_a_measured_graph_reserve_replaces_the_model():
    b = budget(server(mem_fraction_static=0.85), RTX, FLASH, {"graph_reserve_mib": 4096})
    assert b.fits and b.reserve_source == "calibration.graph_reserve_mib"


def test_max_safe_fraction_is_consistent_with_fits():
    b = budget(server(mem_fraction_static=0.85), RTX, FLASH)
    assert budget(server(mem_fraction_static=round(b.max_safe_fraction - 0.005, 3)), RTX, FLASH).fits
    assert not budget(server(mem_fraction_static=round(b.max_safe_fraction + 0.005, 3)), RTX, FLASH).fits
