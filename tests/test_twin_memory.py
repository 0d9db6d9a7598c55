"""The twin's own memory model and the simulated CUDA-graph capture OOM."""

import pytest
import requests

from ct200twin.server import memory as m
from ct200twin.server.main import LocalTwin, nvfp4_ctx8k_argv

FAST = {"load_seconds": 0.3, "warmup_seconds": 0.2, "health_poll_seconds": 0.1}
GPU = 97887


def plan(**kw):
    return m.plan_memory(m.MemoryInputs(gpu_mem_mib=GPU, **kw))


def test_campaign_cells():
    oom = plan(tp=4, mem_fraction_static=0.85, cuda_graph_max_bs_decode=32)
    assert oom.oom is not None and oom.allreduce == "nccl"
    assert 12.5 < oom.headroom_gib < 14  # the campaign saw ~12.9 GB left
    assert oom.graph_reserve_gib - oom.headroom_gib > 5  # and capture needing several GB more
    ok = plan(tp=4, mem_fraction_static=0.70, cuda_graph_max_bs_decode=32)
    assert ok.fits and ok.max_total_num_tokens == 1975040
    assert 37 < ok.weights_gib < 38
    cookbook = plan(tp=2, mem_fraction_static=0.92, cuda_graph_max_bs_decode=32)
    assert cookbook.fits and cookbook.allreduce == "custom"
    assert not plan(tp=2, mem_fraction_static=0.92, cuda_graph_max_bs_decode=32,
                    disable_custom_all_reduce=True).fits
    assert plan(tp=4, mem_fraction_static=0.85, graphs_disabled=True).fits


def test_kv_pool_error():
    with pytest.raises(m.KVCacheError, match="Loaded weights leave no GPU memory for the KV cache under "
                                             r"--mem-fraction-static=0.8"):
        plan(tp=1, mem_fraction_static=0.8)


def test_capture_list_and_defaults():
    assert m.decode_capture_batch_sizes(32) == [1, 2, 4, 8, 12, 16, 24, 32]
    assert m.decode_capture_batch_sizes(20) == [1, 2, 4, 8, 12, 16, 20]
    assert m.default_gpu_settings(GPU, 4) == (8192, 512)
    assert m.default_mem_fraction(GPU, 4, 1, 8192, 256, True) == pytest.approx(0.843, abs=1e-3)


def test_085_tp4_bs32_crashes_at_graph_capture():
    with LocalTwin(faults=FAST) as t:
        t.argv = nvfp4_ctx8k_argv(str(t.model_dir), t.port, mem_fraction_static=0.85)
        t.stop()
        t.start()
        assert t.wait_exit(20) != 0
        out = t.output()
        assert "Capture target decode CUDA graph begin" in out
        tb = out[out.index("Traceback (most recent call last):"):].splitlines()
        last = [ln for ln in tb if not ln.startswith(("  ", "Traceback"))][0]
        assert last.startswith("Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate ")
        assert "Uvicorn running" not in out
        assert t._get("/health") is None


@pytest.mark.slow
def test_070_tp4_bs32_starts():
    with LocalTwin(faults=FAST) as t:  # default LocalTwin argv = nvfp4-ctx8k (0.70)
        t.wait_ready()
        si = requests.get(t.url + "/server_info", timeout=10).json()
        assert si["max_total_num_tokens"] == 1975040 and si["twin"]["allreduce"] == "nccl"
        assert "available_gpu_mem=6.44 GB" in t.output()


def test_kv_error_at_startup():
    with LocalTwin(faults=FAST) as t:
        t.argv = nvfp4_ctx8k_argv(str(t.model_dir), t.port, tp=1, mem_fraction_static=0.8)
        t.stop()
        t.start()
        assert t.wait_exit(20) == 1
        assert ("ValueError: Loaded weights leave no GPU memory for the KV cache under "
                "--mem-fraction-static=0.8") in t.output()
