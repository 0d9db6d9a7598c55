"""Fault knobs of the SGLang twin (the knob file the harness writes) and hard startup failures."""

import json
import time

import pytest

import requests

from ct200twin.server.faults import Faults, load_faults
from ct200twin.server.main import LocalTwin, nvfp4_ctx8k_argv

FAST = {"load_seconds": 0.3, "warmup_seconds": 0.2, "health_poll_seconds": 0.1}


def gen(url, n=4, stream=False):
    return requests.post(url + "/generate", json={"text": "a b c", "stream": stream,
                                                  "sampling_params": {"max_new_tokens": n}},
                         timeout=30, stream=stream)


def test_knob_file_parsing(tmp_path):
    assert load_faults(tmp_path / "missing.json") == Faults()
    p = tmp_path / "f.json"
    p.write_text(json.dumps({"error_rate": 0.25, "crash_after_requests": 3, "stale_model_path": "/old"}))
    f = load_faults(p)
    assert f.error_rate == 0.25 and f.crash_after_requests == 3 and f.stale_model_path == "/old"
    assert [f.fails(i) for i in range(40)] == [f.fails(i) for i in range(40)]  # deterministic
    assert 4 <= sum(f.fails(i) for i in range(40)) <= 16
    p.write_text(json.dumps({"eror_rate": 1}))
    try:
        load_faults(p)
        raise AssertionError("unknown key accepted")
    except Exception as e:
        assert "unknown keys" in str(e)


def test_crash_on_start():
    with LocalTwin(faults={**FAST, "crash_on_start": True}) as t:
        assert t.wait_exit(20) == 1
        out = t.output()
        assert "max_total_num_tokens=" in out and "twin fault: crash_on_start" in out
        assert "Uvicorn running" not in out


@pytest.mark.slow
def test_never_healthy():
    with LocalTwin(faults={**FAST, "never_healthy": True}) as t:
        t.wait_status("/health", 503)
        time.sleep(1.0)
        assert t._get("/health") == 503 and t._get("/ready") == 503
        assert "fired up" not in t.output()


@pytest.mark.slow
def test_slow_start():
    with LocalTwin(faults={"load_seconds": 2.0, "warmup_seconds": 1.0, "health_poll_seconds": 0.1}) as t:
        t0 = time.monotonic()
        t.wait_status("/health", 503)
        bound = time.monotonic() - t0
        t.wait_status("/health", 200)
        assert bound >= 1.8 and time.monotonic() - t0 >= bound + 0.9


@pytest.mark.slow
def test_error_rate_http_500_and_stream_error_chunk():
    faults = {**FAST, "error_rate": 0.5, "error_seed": 7}
    expected = [Faults(error_rate=0.5, error_seed=7).fails(i) for i in range(8)]
    assert any(expected) and not all(expected)
    with LocalTwin(faults=faults) as t:
        t.wait_ready()
        codes = [gen(t.url).status_code for _ in range(8)]
        assert codes == [500 if f else 200 for f in expected]
    with LocalTwin(faults={**FAST, "error_rate": 1.0}) as t:
        t.wait_ready()
        r = gen(t.url, n=6, stream=True)
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith(b"data: ")]
        assert lines[-1] == b"[DONE]"
        err = json.loads(lines[-2])
        assert err["error"]["code"] == 500 and "error_rate" in err["error"]["message"]
        tokens = [json.loads(x) for x in lines[:-2]]
        assert 1 <= len(tokens) < 6  # it fails mid-stream, after some tokens
        assert all(c["meta_info"]["finish_reason"] is None for c in tokens)
        assert requests.get(t.url + "/health", timeout=10).status_code == 200  # health is not a user request


@pytest.mark.slow
def test_crash_after_requests():
    with LocalTwin(faults={**FAST, "crash_after_requests": 2}) as t:
        t.wait_ready()
        assert gen(t.url).status_code == 200
        assert gen(t.url).status_code == 200
        assert t.wait_exit(10) == 1
        assert "crash_after_requests=2" in t.output()


@pytest.mark.slow
def test_stale_server_holds_the_port_and_reports_another_model():
    stale_path = "/srv/dsv4deploy/models/deepseek-ai--DeepSeek-V4-Flash/old-rev"
    with LocalTwin(faults={"load_seconds": 30, "stale_model_path": stale_path}) as stale:
        t0 = time.monotonic()
        stale.wait_status("/health", 200)
        assert time.monotonic() - t0 < 10  # no load, no warmup
        mi = requests.get(stale.url + "/model_info", timeout=10).json()
        si = requests.get(stale.url + "/server_info", timeout=10).json()
        assert mi["model_path"] == stale_path and si["model_path"] == stale_path
        assert stale_path in si["launch_command"]
        # the new server cannot bind the port the stale one holds
        with LocalTwin(faults=FAST) as new:
            new.argv = nvfp4_ctx8k_argv(str(new.model_dir), stale.port)
            new.stop()
            new.start()
            assert new.wait_exit(20) == 1
            assert "address already in use" in new.output()
        assert requests.get(stale.url + "/model_info", timeout=10).json()["model_path"] == stale_path


def test_missing_nvidia_smi_fails_clearly():
    with LocalTwin(faults=FAST, nvidia_smi=False) as t:
        assert t.wait_exit(20) == 1
        assert "nvidia-smi not found on PATH" in t.output()


def test_too_few_gpus():
    with LocalTwin(faults=FAST, gpus=2) as t:  # TP4 on a 2-GPU host
        assert t.wait_exit(20) == 1
        assert "invalid device ordinal" in t.output()


def test_context_longer_than_model_max():
    with LocalTwin(faults=FAST) as t:
        t.argv = nvfp4_ctx8k_argv(str(t.model_dir), t.port, context_length=2097152)
        t.stop()
        t.start()
        assert t.wait_exit(20) == 1
        assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" in t.output()


@pytest.mark.slow
def test_multinode_worker_waits_for_rank0_on_sigterm():
    import signal
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dist = f"127.0.0.1:{s.getsockname()[1]}"
    with LocalTwin(faults=FAST) as r0, LocalTwin(faults=FAST) as r1:
        for t, rank in ((r0, 0), (r1, 1)):
            t.argv = nvfp4_ctx8k_argv(str(t.model_dir), t.port, tp=8) + [
                "--nnodes", "2", "--node-rank", str(rank), "--dist-init-addr", dist]
            t.stop()
        r0.start()
        r1.start()
        r0.wait_ready()
        r1.wait_status("/health", 200)
        r1.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert r1.proc.poll() is None and "waiting for the rank-0 ShutdownReq" in r1.output()
        r0.proc.send_signal(signal.SIGTERM)
        assert r0.wait_exit(5) == 0 and r1.wait_exit(5) == 0
