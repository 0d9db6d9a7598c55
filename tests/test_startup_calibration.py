"""The host's own numbers: SGLang 0.5.23's startup lines parsed, kept as a release's `startup`,
turned into the host's calibration, and `validate --host` judging with it and naming its source."""

from __future__ import annotations

import json

from checkout import load_profile
from dsv4deploy.cli.main import main
from dsv4deploy.profile import calibration
from dsv4deploy.profile.validate import validate
from dsv4deploy.release import startup_log

# rank 0's lines as SGLang 0.5.23 prints them (model_runner.py, kv_cache_configurator.py,
# cuda_graph_setup.py, scheduler.py); TP1's lines must not count
STARTED = """\
[2026-12-05 10:00:00 TP0] Load weight begin. avail mem=94.59 GB
[2026-12-05 10:09:00 TP1] Load weight end. elapsed=540.00 s, type=DeepseekV4ForCausalLM, avail mem=50.00 GB, mem usage=40.00 GB.
[2026-12-05 10:09:00 TP0] Load weight end. elapsed=540.01 s, type=DeepseekV4ForCausalLM, avail mem=56.92 GB, mem usage=37.67 GB.
[2026-12-05 10:09:05 TP0] Memory pool end. avail mem=27.68 GB
[2026-12-05 10:10:00 TP0] Capture target decode CUDA graph end. bs=[1, 2, 4, 8, 12, 16, 24, 32], elapsed=55.10 s, mem usage=25.58 GB, avail mem=2.10 GB.
[2026-12-05 10:10:01] max_total_num_tokens=1975040, chunked_prefill_size=8192, max_prefill_tokens=16384, max_running_requests=64, context_len=8192, available_gpu_mem=2.10 GB
"""
OOM = """\
[2026-12-05 11:00:00 TP0] Load weight begin. avail mem=94.59 GB
[2026-12-05 11:09:05 TP0] Memory pool end. avail mem=13.34 GB
Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.20 GiB. GPU 0 has a total capacity of 95.59 GiB of which 900.00 MiB is free. Including non-PyTorch memory, this process has 94.71 GiB memory in use.
"""


def test_sglangs_startup_lines_are_read():
    fig = startup_log.parse(STARTED)
    assert fig == {"weights_gib": 37.67, "pool_avail_gib": 27.68, "capture_gib": 25.58, "capture_avail_gib": 2.10,
                   "max_total_num_tokens": 1975040, "available_gpu_mem_gib": 2.10}
    oom = startup_log.parse(STARTED + OOM)["oom"]      # the last start's, with torch's units
    assert oom == {"tried_gib": 2.2, "capacity_gib": 95.59, "free_gib": round(900 / 1024, 4)}
    assert startup_log.parse("no memory lines here\n") == {}


def _record(number, text, fraction, started):
    data = load_profile("nvfp4-ctx8k").data
    data = {**data, "server": {**data["server"], "mem_fraction_static": fraction}}
    from dsv4deploy.profile import catalog
    from dsv4deploy.profile.memory import budget

    b = budget(data["server"], catalog.gpu("rtx-pro-6000-blackwell"), catalog.model(data["model"]["repo"]))
    return {"release": number, "profile": "nvfp4-ctx8k",
            "startup": calibration.startup_entry(data, b, startup_log.parse(text), started)}


def test_a_measured_start_moves_the_boundary_and_names_its_release():
    doc = calibration.derive("ct200", [_record(42, STARTED, 0.70, True)])
    report = validate(load_profile("nvfp4-ctx8k"), doc)
    b = report.budget
    assert b.measured and b.max_safe_text == "0.71"        # 0.70 + (2.10 - 1 GiB margin) / 95.59
    assert b.reserve_source == "ct200: release 0042's capture left 2.1 GiB at 0.7"


def test_an_oom_at_start_refuses_that_fraction_with_its_evidence(tmp_path):
    doc = calibration.derive("ct200", [_record(7, OOM, 0.70, False)])
    assert doc["evidence"][0]["kind"] == "oom"
    path = calibration.path_for(tmp_path / "reports", "ct200")
    calibration.write(path, doc)
    report = validate(load_profile("nvfp4-ctx8k"), calibration.read(path))
    msg = "\n".join(str(p) for p in report.errors)
    assert "use mem_fraction_static <= 0.67" in msg
    assert ("max safe fraction 0.67 on ct200: release 0007 ran out of GPU memory at start at 0.7 "
            "(asked 2.20 GiB, 0.88 GiB free)") in msg
    # without the host's calibration, the model's boundary holds
    assert validate(load_profile("nvfp4-ctx8k")).ok


def test_a_bad_calibration_file_or_host_name_exits_2(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "calibration.json"
    bad.write_text("{not json")
    try:
        calibration.read(bad)
    except calibration.CalibrationError as exc:
        assert str(exc).startswith(f"{bad}:1: not JSON")
    else:
        raise AssertionError("read a broken file")
    assert main(["validate", "nvfp4-ctx8k", "--host", "../etc"]) == 2
    assert "--host '../etc': expected an inventory host name" in capsys.readouterr().err
    assert json.loads(json.dumps(calibration.derive("h", []))) == {"host": "h", "evidence": []}
