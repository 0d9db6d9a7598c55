"""The bench_serving runner: command shape (key never in the command), JSONL parsing on samples
with the documented fields (reference/sglang.md 3.4), the partial-failure rule, non-zero exits,
the floor time limit; end to end through run_gate with a stand-in `python -m sglang.benchmark.serving`
(or the older `sglang.bench_serving` where the new module is absent)."""

import json
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dsv4deploy.gate import bench_serving as bs
from dsv4deploy.gate.inputs import GateHost, GateOptions, GateServer
from dsv4deploy.gate.result import BUDGET, EARLY_STOP, FAILED, OK, SKIPPED
from dsv4deploy.gate.runner import PROBE_TIMEOUT_S, local_execute, run_gate
from dsv4deploy.gate.spec import GateSpec, LevelSpec

# sglang.md 3.4: keys in this exact order (server_info embeds /server_info, trimmed here)
KEYS = ("tag backend dataset_name request_rate max_concurrency sharegpt_output_len random_input_len "
        "random_output_len random_range_ratio server_info duration completed total_input_tokens "
        "total_input_text_tokens total_input_vision_tokens total_output_tokens total_output_tokens_retokenized "
        "request_throughput input_throughput output_throughput total_throughput mean_e2e_latency_ms "
        "median_e2e_latency_ms std_e2e_latency_ms p90_e2e_latency_ms p95_e2e_latency_ms p99_e2e_latency_ms "
        "mean_ttft_ms median_ttft_ms std_ttft_ms p90_ttft_ms p95_ttft_ms p99_ttft_ms mean_tpot_ms median_tpot_ms "
        "std_tpot_ms p90_tpot_ms p95_tpot_ms p99_tpot_ms mean_itl_ms median_itl_ms std_itl_ms p90_itl_ms "
        "p95_itl_ms p99_itl_ms concurrency accept_length max_output_tokens_per_s max_concurrent_requests").split()

# The run printed in sglang.md 3.3 (C=4, 8 prompts, 256/256 against a loopback fake server).
SAMPLE = dict(zip(KEYS, [
    None, "sglang", "random-ids", float("inf"), 4, None, 256, 256, 1.0,
    {"version": "0.5.23", "model_path": "/srv/models/x", "tp_size": 4}, 0.83, 8, 2048, 2048, 0, 2048, 2048,
    9.64, 2468.42, 2468.42, 4936.83, 407.93, 408.05, 1.2, 409.56, 410.13, 410.58,
    8.06, 8.00, 1.1, 10.23, 10.86, 11.36, 1.57, 1.57, 0.0, 1.57, 1.57, 1.57,
    1.57, 1.46, 0.5, 2.09, 2.46, 3.82, 3.93, None, 2048.0, 8]))


def record(c, n, tput, completed=None, out_len=256, in_len=256):
    completed = n if completed is None else completed
    d = dict(SAMPLE, max_concurrency=c, random_input_len=in_len, random_output_len=out_len, completed=completed,
             total_input_tokens=completed * in_len, total_output_tokens=completed * out_len)
    d["duration"] = completed * out_len / tput if completed else 1.0
    d["output_throughput"] = tput if completed else 0.0
    d["request_throughput"] = completed / d["duration"]
    return d


def jsonl(*records):
    # json.dumps writes Infinity for request_rate inf, as bench_serving's json.dump does
    return "\n".join(json.dumps(r) for r in records) + "\n"


def test_parse_documented_sample():
    lv = LevelSpec(4, 8)
    res = bs.parse_jsonl(jsonl(SAMPLE), lv)
    assert list(SAMPLE) == KEYS and res.status == OK and res.completed == 8 and res.failed == 0
    assert (res.duration_s, res.output_throughput, res.total_throughput, res.request_throughput) == \
        (0.83, 2468.42, 4936.83, 9.64)
    assert (res.ttft_ms.mean, res.ttft_ms.median, res.ttft_ms.p90, res.ttft_ms.p99) == (8.06, 8.0, 10.23, 11.36)
    assert (res.tpot_ms.p99, res.itl_ms.p95, res.e2e_ms.p99, res.e2e_ms.std) == (1.57, 2.46, 410.58, 1.2)
    assert res.peak_output_throughput == 2048.0 and res.max_in_flight == 8
    assert res.extra["server_version"] == "0.5.23" and "server_info" not in res.extra


def test_last_line_wins_and_partial_failure_fails():
    lv = LevelSpec(64, 128)
    text = jsonl(record(64, 128, 100.0), record(64, 128, 531.7, completed=125))
    res = bs.parse_jsonl(text, lv)
    assert res.output_throughput == 531.7 and res.completed == 125 and res.failed == 3
    assert "completed 125/128" in res.reason
    r = bs.level_from_run(lv, bs.BenchRun(0, text, ""), warmup_requests=2)
    assert r.status == OK and r.failed == 3    # exit 0, but the verdict fails it (max_failed 0)
    from dsv4deploy.gate.result import GateResult
    from dsv4deploy.gate.verdict import judge
    v = judge(GateSpec(levels=(LevelSpec(64, 128, min_output_throughput=400),)), GateResult("bench_serving", [r]))
    assert v.failures == ["C=64 failed requests 3 > max 0"]


def test_nonzero_exit_and_timeouts():
    lv = LevelSpec(64, 128, min_output_throughput=400)
    err = "Traceback (most recent call last):\n  ...\nValueError: Warmup failed - Please make sure benchmark arguments are correctly specified. Error: 401"
    r = bs.level_from_run(lv, bs.BenchRun(1, "", err), warmup_requests=2)
    assert r.status == FAILED and r.reason.startswith("bench_serving exited 1: ValueError: Warmup failed")
    assert "Traceback" in r.extra["stderr_tail"] and r.failed == 128
    r = bs.level_from_run(lv, bs.BenchRun(0, "", ""), warmup_requests=2)
    assert r.status == FAILED and "no usable JSONL" in r.reason
    r = bs.level_from_run(lv, bs.BenchRun(124, "", ""), warmup_requests=2, limit_kind="floor",
                          limit_s=bs.floor_limit_s(lv))
    assert r.status == EARLY_STOP and r.reason.startswith("cannot reach the floor: 32768 tokens at 400 tok/s take 82 s")
    # the outer bound: seconds after bench_serving started
    assert r.reason.endswith("bench_serving still running after 202 s (incl. 120 s start-up)")
    assert r.early_stop == {"rule": "bound", "at_s": 201.92, "since": "start"}
    # the watcher's bound: seconds after the measured run began
    r = bs.level_from_run(lv, bs.BenchRun(124, "", ""), warmup_requests=2, limit_kind="run",
                          limit_s=bs.run_bound_s(bs.floor_time_s(lv)))
    assert r.status == EARLY_STOP and r.reason == ("cannot reach the floor: 32768 tokens at 400 tok/s take 82 s; "
                                                   "bench_serving's measured run was still running after 87 s")
    assert r.early_stop == {"rule": "bound", "at_s": 86.92, "since": "measured run"}
    r = bs.level_from_run(lv, bs.BenchRun(137, "", ""), warmup_requests=2, limit_kind="budget", limit_s=30,
                          budget_s=1800)
    assert r.status == BUDGET and r.reason == "gate budget 1800 s exhausted during C=64"
    assert bs.floor_limit_s(lv) == 32768 / 400 + bs.STARTUP_ALLOWANCE_S and bs.floor_limit_s(LevelSpec(1, 1)) is None


def test_command_shape_and_secret_handling():
    lv = LevelSpec(16, 48, 256, 256)
    server = GateServer("http://127.0.0.1:30000", "/srv/models/DeepSeek-V4-Flash",
                        "/opt/dsv4deploy/venvs/sglang-0.5.23/bin/python", "/etc/dsv4deploy/secrets/sglang-api-key")
    cmd = bs.build_command(lv, server, warmup_requests=2, bound=bs.Bound(300), run_as="dsv4deploy-gate")
    assert cmd.startswith("if [ -s /etc/dsv4deploy/secrets/sglang-api-key ]; then OPENAI_API_KEY=$(cat "
                          "/etc/dsv4deploy/secrets/sglang-api-key); export OPENAI_API_KEY; fi; ")
    assert cmd.count("OPENAI_API_KEY") == 2                         # one place hands the key over
    # the gate's user writes only in its own $d/out; stdout and stderr are root's files in root's $d
    assert 'chmod 711 "$d" && chown dsv4deploy-gate "$d/out" "$d/out/home" && ' in cmd
    # its home and caches: its own folder of the run, offline
    assert ('export HOME="$d/out/home" XDG_CACHE_HOME="$d/out/home/.cache" HF_HOME="$d/out/home/.cache/huggingface" '
            'TRANSFORMERS_CACHE="$d/out/home/.cache/huggingface/hub" SGLANG_CACHE_DIR="$d/out/home/.cache/sglang" '
            'TMPDIR="$d/out/home" USER=dsv4deploy-gate LOGNAME=dsv4deploy-gate HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1; '
            'timeout ') in cmd
    assert 'chown dsv4deploy-gate "$d" ' not in cmd and 'chown dsv4deploy-gate "$d";' not in cmd
    assert ("setpriv --reuid=dsv4deploy-gate --regid=dsv4deploy-gate --clear-groups --no-new-privs -- "
            'tail -n 1 "$d/out/bench.jsonl"') in cmd
    assert ("timeout -k 10 300 setpriv --reuid=dsv4deploy-gate --regid=dsv4deploy-gate --clear-groups --no-new-privs -- "
            "/opt/dsv4deploy/venvs/sglang-0.5.23/bin/python -I -u -m sglang.benchmark.serving --backend sglang "
            "--host 127.0.0.1 --port 30000 --model /srv/models/DeepSeek-V4-Flash --tokenizer /srv/models/DeepSeek-V4-Flash "
            "--dataset-name random-ids --tokenize-prompt --random-input-len 256 --random-output-len 256 --random-range-ratio 1.0 "
            "--num-prompts 48 --max-concurrency 16 --warmup-requests 2 --output-file \"$d/out/bench.jsonl\" --disable-tqdm") in cmd
    assert "mktemp -d" in cmd       # a fresh output file every run
    assert "sglang.bench_serving" not in cmd   # the deprecated shim only where the module is absent
    legacy = bs.build_command(lv, GateServer("http://127.0.0.1:30000", "/m", "/v/bin/python"), warmup_requests=2,
                              bound=bs.Bound(300), module="sglang.bench_serving")
    assert "/v/bin/python -I -u -m sglang.bench_serving --backend sglang " in legacy
    with pytest.raises(ValueError, match="not a bench_serving module"):
        bs.bench_argv(lv, venv_python="/v", base_url="http://h:1", model_path="/m", warmup_requests=0,
                      output_file="/o", module="os; rm -rf /")
    sec = bs.split_output(f"noise\n{bs.MARK} rc=0\n{bs.MARK} jsonl\n{json.dumps(SAMPLE)}\n\n{bs.MARK} stderr\nwarn\n"
                          f"{bs.MARK} stdout\nok\n")
    assert sec["rc"] == 0 and json.loads(sec["jsonl"])["completed"] == 8 and sec["stderr"] == "warn"


FAKE = r'''#!{python}
import json, os, sys, time
cfg = json.load(open({cfg!r}))
assert sys.argv[1] == "-I", sys.argv    # isolated: the login's PYTHONPATH and directory are not the unit's
if sys.argv[2] == "-c":           # the runner's probe: which module this venv has
    print(cfg["module"] or "")
    sys.exit(0 if cfg["module"] else 3)
assert sys.argv[2:5] == ["-u", "-m", cfg["module"] or "sglang.benchmark.serving"], sys.argv
sys.stdout.reconfigure(write_through=True)    # what -u does: a print reaches the file at once
a = sys.argv[5:]
opt = {{a[i]: a[i + 1] for i in range(len(a) - 1) if a[i].startswith("--") and not a[i + 1].startswith("--")}}
with open({log!r}, "a") as f:
    f.write(json.dumps({{"argv": sys.argv, "key": os.environ.get("OPENAI_API_KEY"),
                        "offline": os.environ.get("HF_HUB_OFFLINE"), "sid": os.getsid(0)}}) + "\n")
# a behaviour for "C/n" (C's run of n prompts: an early pass's first round) before the one for "C"
beh = cfg["levels"].get(opt["--max-concurrency"] + "/" + opt["--num-prompts"]) or cfg["levels"][opt["--max-concurrency"]]
if "start" in beh:                # SGLang's words once its warm-up is done, then its 1 s pause
    time.sleep(beh["start"])
    print(f"Warmup completed with {{opt['--warmup-requests']}} sequences. Starting main benchmark run...")
time.sleep(beh.get("sleep", 0))
if beh.get("rc"):
    sys.stderr.write(beh.get("stderr", ""))
    sys.exit(beh["rc"])
assert not os.path.exists(opt["--output-file"])
with open(opt["--output-file"], "a") as f:
    f.write(json.dumps(beh["record"]) + "\n")
'''


def fake_venv(tmp_path, levels, module="sglang.benchmark.serving"):
    cfg, log = tmp_path / "cfg.json", tmp_path / "calls.jsonl"
    cfg.write_text(json.dumps({"module": module, "levels": levels}))
    py = tmp_path / "venv" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text(FAKE.format(python=sys.executable, cfg=str(cfg), log=str(log)))
    py.chmod(0o755)
    secrets = tmp_path / "api-key"
    secrets.write_text("s3cret-key\n")
    secrets.chmod(0o600)
    return py, log, secrets


def test_run_gate_auto_picks_bench_serving_and_passes(tmp_path):
    # every level clears its floor by more than the early-pass margin: one first round each
    py, log, secrets = fake_venv(tmp_path, {"1/2": {"record": record(1, 2, 23.9)}, "16/16": {"record": record(16, 16, 250.0)},
                                            "64/64": {"record": record(64, 64, 531.7)}})
    seen = []

    def execute(cmd, timeout_s):
        seen.append((cmd, timeout_s))
        return local_execute(cmd, timeout_s)

    spec = GateSpec.from_profile({"gate": {"levels": [
        {"concurrency": 1, "num_prompts": 8, "min_output_throughput": 10},
        {"concurrency": 16, "num_prompts": 48, "min_output_throughput": 120},
        {"concurrency": 64, "num_prompts": 128, "min_output_throughput": 400}]}})
    out = run_gate(spec,
                   GateHost(execute),
                   GateServer("http://127.0.0.1:30000", "/srv/models/m", str(py), api_key_file=str(secrets)))
    assert out.result.runner == "bench_serving" and out.passed, out.verdict.failures
    assert [lv.concurrency for lv in out.result.levels] == [64, 16, 1]
    assert out.result.level(64).output_throughput == 531.7
    calls = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(calls) == 3 and all(c["key"] == "s3cret-key" and c["offline"] == "1" for c in calls)
    assert [c["argv"][c["argv"].index("--num-prompts") + 1] for c in calls] == ["64", "16", "2"]
    assert all("s3cret-key" not in c for c, _ in seen)            # never in the command text
    assert all("s3cret-key" not in " ".join(c["argv"]) for c in calls)
    assert seen[0][1] == PROBE_TIMEOUT_S                           # the probe
    assert all(c["argv"][1:5] == ["-I", "-u", "-m", "sglang.benchmark.serving"] for c in calls)
    assert out.result.client["module"] == "sglang.benchmark.serving"
    assert "has sglang.benchmark.serving" in out.result.client["runner_choice"]
    assert all(t <= 1800 + bs.SSH_SLACK_S for _, t in seen[1:])    # each level: limit + slack


def test_run_gate_falls_back_to_the_old_module_only_where_the_new_one_is_absent(tmp_path):
    """A release before sglang.benchmark.serving existed (0.5.14 and before) has only sglang.bench_serving."""
    levels = {"1": {"record": record(1, 8, 23.9)}}
    spec = GateSpec(levels=(LevelSpec(1, 8, min_output_throughput=10),))
    for runner in ("auto", "bench_serving"):
        d = tmp_path / runner
        d.mkdir()
        py, log, secrets = fake_venv(d, levels, module="sglang.bench_serving")
        out = run_gate(spec,
                       GateHost(local_execute),
                       GateServer("http://127.0.0.1:30000", "/m", str(py), api_key_file=str(secrets)),
                       GateOptions(runner=runner))
        assert out.passed and out.result.runner == "bench_serving", out.verdict.failures
        assert [json.loads(x)["argv"][4] for x in log.read_text().splitlines()] == ["sglang.bench_serving"]
        assert out.result.client["module"] == "sglang.bench_serving"
        assert "sglang.benchmark.serving is absent" in out.result.client["runner_choice"]
    # neither module: auto takes the built-in client; the explicit runner tries the new module
    d = tmp_path / "none"
    d.mkdir()
    py, log, secrets = fake_venv(d, levels, module=None)
    out = run_gate(spec,
                   GateHost(local_execute),
                   GateServer("http://127.0.0.1:30000", "/m", str(py), api_key_file=str(secrets)),
                   GateOptions(runner="bench_serving"))
    assert [json.loads(x)["argv"][4] for x in log.read_text().splitlines()] == ["sglang.benchmark.serving"]
    assert "has neither sglang.benchmark.serving nor sglang.bench_serving" in out.result.client["runner_choice"]


def test_run_gate_bench_serving_failures_fail_fast(tmp_path):
    py, log, secrets = fake_venv(tmp_path, {
        "64": {"record": record(64, 128, 531.7, completed=120)},     # exit 0, partial failure
        "16": {"record": record(16, 48, 250.0)}, "1": {"record": record(1, 8, 20.0)}})
    spec = GateSpec.from_profile({"levels": [{"concurrency": c, "num_prompts": n} for c, n in ((1, 8), (16, 48), (64, 128))]})
    out = run_gate(spec,
                   GateHost(local_execute),
                   GateServer("http://127.0.0.1:30000", "/m", str(py), api_key_file=str(secrets)),
                   GateOptions(runner="bench_serving"))
    assert not out.passed and out.verdict.failures == ["C=64 failed requests 8 > max 0"]
    assert [lv.status for lv in out.result.levels] == [OK, SKIPPED, SKIPPED]
    assert len(log.read_text().splitlines()) == 1

    (tmp_path / "b").mkdir()
    py2, _, _ = fake_venv(tmp_path / "b", {"64": {"rc": 1, "stderr": "Traceback\nValueError: Warmup failed - boom"}})
    out = run_gate(spec,
                   GateHost(local_execute),
                   GateServer("http://127.0.0.1:30000", "/m", str(py2), api_key_file=str(secrets)),
                   GateOptions(runner="bench_serving"))
    assert out.verdict.failures[0] == "C=64 failed: bench_serving exited 1: ValueError: Warmup failed - boom"


EARLY = GateSpec.from_profile({"gate": {"levels": [
    {"concurrency": 1, "num_prompts": 8, "min_output_throughput": 10},
    {"concurrency": 16, "num_prompts": 48, "min_output_throughput": 120},
    {"concurrency": 64, "num_prompts": 128, "min_output_throughput": 400, "max_p99_ttft_ms": 3000}]}})


def prompts_sent(log):
    """(concurrency, prompts) of each bench_serving run, in order."""
    calls = [json.loads(x)["argv"] for x in log.read_text().splitlines()]
    return [(int(a[a.index("--max-concurrency") + 1]), int(a[a.index("--num-prompts") + 1])) for a in calls]


def gate_with(tmp_path, levels, spec=EARLY, options=GateOptions()):
    py, log, secrets = fake_venv(tmp_path, levels)
    out = run_gate(spec, GateHost(local_execute),
                   GateServer("http://127.0.0.1:30000", "/m", str(py), api_key_file=str(secrets)), options)
    return out, prompts_sent(log)


def test_a_clear_first_round_passes_the_level_early_as_the_built_in_client_marks_it(tmp_path):
    out, sent = gate_with(tmp_path, {"64/64": {"record": record(64, 64, 531.7)}, "16/16": {"record": record(16, 16, 266.0)},
                                     "1/2": {"record": record(1, 2, 24.2)}})
    assert out.passed and sent == [(64, 64), (16, 16), (1, 2)]          # one run of k prompts per level
    c64 = out.result.level(64)
    assert (c64.status, c64.completed, c64.num_prompts, c64.failed) == (OK, 64, 128, 0)
    assert c64.early_stop["rule"] == "pass" and c64.passed_early and c64.output_throughput == 531.7
    assert c64.reason.startswith("passed early: 531.7 tok/s over 64/128 completed requests >= 1.25 x floor 400 tok/s")
    rows = {r.metric: r for r in out.verdict.levels[2].rows}
    assert rows["completed"].observed == "64/128" and rows["completed"].note == c64.reason
    assert out.result.client["early_pass"] == {"margin": 0.25, "min_requests": None}


def test_a_first_round_that_is_not_a_clear_pass_runs_the_whole_level_and_only_that_run_counts(tmp_path):
    """C=64 at 480 tok/s (1.2 x floor), C=16 with a failed request, C=1 with p99 TTFT over
    ceiling / 1.25: each runs in full; the level's figures are the full run's alone."""
    slow_ttft = dict(record(1, 2, 24.0), p99_ttft_ms=2500.0)
    spec = GateSpec(levels=EARLY.levels[1:] + (LevelSpec(1, 8, min_output_throughput=10, max_p99_ttft_ms=3000),))
    out, sent = gate_with(tmp_path, {"64/64": {"record": record(64, 64, 480.0)}, "64": {"record": record(64, 128, 470.0)},
                                     "16/16": {"record": record(16, 16, 266.0, completed=15)},
                                     "16": {"record": record(16, 48, 260.0)},
                                     "1/2": {"record": slow_ttft}, "1": {"record": record(1, 8, 23.0)}}, spec)
    assert out.passed and sent == [(64, 64), (64, 128), (16, 16), (16, 48), (1, 2), (1, 8)]
    for c, n, tput, why in ((64, 128, 470.0, "480.0 tok/s < 1.25 x floor 400 tok/s"),
                            (16, 48, 260.0, "15/16 requests completed"),
                            (1, 8, 23.0, "p99 TTFT 2500.0 ms > ceiling 3000 ms / 1.25")):
        lv = out.result.level(c)
        assert (lv.completed, lv.num_prompts, lv.output_throughput, lv.early_stop) == (n, n, tput, None)
        assert not lv.passed_early and lv.extra["first_round"]["why_not"] == why
        assert lv.ttft_ms.p99 == record(c, n, tput)["p99_ttft_ms"]          # the full run's, not merged


def test_without_early_pass_or_without_a_floor_a_level_runs_once_in_full(tmp_path):
    levels = {"64": {"record": record(64, 128, 531.7)}, "16": {"record": record(16, 48, 266.0)}, "1": {"record": record(1, 8, 24.2)}}
    (tmp_path / "a").mkdir()
    out, sent = gate_with(tmp_path / "a", levels, options=GateOptions(early_pass=False))
    assert out.passed and sent == [(64, 128), (16, 48), (1, 8)] and out.result.client["early_pass"]["margin"] is None
    floorless = GateSpec(levels=tuple(LevelSpec(c, n) for c, n in ((1, 8), (16, 48), (64, 128))))
    (tmp_path / "b").mkdir()
    out, sent = gate_with(tmp_path / "b", levels, spec=floorless)
    assert out.passed and sent == [(64, 128), (16, 48), (1, 8)]


def test_the_first_round_takes_the_built_in_clients_size():
    spec = GateSpec(levels=(LevelSpec(64, 128, min_output_throughput=400),), early_pass_min_requests=8)
    assert bs.first_round(spec.levels[0], spec, GateOptions()).num_prompts == 8
    assert bs.first_round(LevelSpec(1, 8, min_output_throughput=10), EARLY, GateOptions()).num_prompts == 2
    assert bs.first_round(LevelSpec(16, 16, min_output_throughput=10), EARLY, GateOptions()) is None  # k >= n
    assert bs.first_round(LevelSpec(16, 48, min_output_throughput=10), GateSpec(early_pass_margin=None),
                          GateOptions()) is None


def left_in_session(sid):
    """PIDs still alive in session SID: local_execute runs each level's command in a session of its own."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, _pgrp, session = stat.read_text().rsplit(")", 1)[1].split()[:4]
        except (OSError, ValueError):
            continue
        if int(session) == sid and state != "Z":
            pids.append(int(stat.parent.name))
    return pids


def sessions(log):
    return [json.loads(x)["sid"] for x in log.read_text().splitlines()]


@pytest.mark.slow
def test_bench_serving_floor_limit_stops_a_slow_level(tmp_path, monkeypatch):
    """A run that never says its measured run began (or hangs before it) is stopped at the outer
    bound: the floor time plus the start-up allowance."""
    monkeypatch.setattr(bs, "STARTUP_ALLOWANCE_S", 1.0)
    py, log, secrets = fake_venv(tmp_path, {"4": {"sleep": 30, "record": record(4, 8, 5.0, out_len=4)}})
    spec = GateSpec(levels=(LevelSpec(4, 8, 16, 4, min_output_throughput=32),))   # 32 tokens / 32 tok/s = 1 s
    t0 = time.monotonic()
    out = run_gate(spec,
                   GateHost(local_execute),
                   GateServer("http://127.0.0.1:1", "/m", str(py), api_key_file=str(secrets)),
                   GateOptions(runner="bench_serving"))
    assert time.monotonic() - t0 < 8
    assert out.result.levels[0].status == EARLY_STOP
    (failure,) = out.verdict.failures          # the stop lands on the limit, give or take the machine's load
    # its first round of 4 prompts (the early pass) ran past the time all 8 may take: no second run
    assert re.fullmatch(r"C=4 stopped early after 2\.\d s: cannot reach the floor: 32 tokens at 32 tok/s take 1 s; "
                        r"a first round of 4 of its 8 prompts was still running after 2 s \(incl\. 1 s start-up\)",
                        failure), failure
    assert out.result.levels[0].num_prompts == 8 and len(log.read_text().splitlines()) == 1
    # without the early pass, the whole level is stopped at the same limit
    out = run_gate(spec, GateHost(local_execute),
                   GateServer("http://127.0.0.1:1", "/m", str(py), api_key_file=str(secrets)),
                   GateOptions(runner="bench_serving", early_pass=False))
    assert re.fullmatch(r"C=4 stopped early after 2\.\d s: cannot reach the floor: 32 tokens at 32 tok/s take 1 s; "
                        r"bench_serving still running after 2 s \(incl\. 1 s start-up\)", out.verdict.failures[0])
    assert out.result.levels[0].early_stop == {"rule": "bound", "at_s": 2.0, "since": "start"}
    assert all(left_in_session(sid) == [] for sid in sessions(log))      # nothing of either run left


FAST_WATCH = {"MAIN_RUN_PAUSE_S": 0.1, "BOUND_SLACK_S": 0.1, "WATCH_POLL_S": 0.1, "STARTUP_ALLOWANCE_S": 60.0}


@pytest.mark.slow
def test_the_floor_bound_counts_from_the_measured_run_not_from_the_start(tmp_path, monkeypatch):
    """bench_serving says when its warm-up is done and its measured run begins: a level still
    running its floor time after that is stopped then, not after the start-up allowance; the
    whole run (timeout, bench_serving, the watcher) is gone when the level's command returns."""
    for name, value in FAST_WATCH.items():
        monkeypatch.setattr(bs, name, value)
    start, floor_s = 0.5, 1.0                  # a start-up of 0.5 s; 32 tokens at 32 tok/s: 1 s
    py, log, secrets = fake_venv(tmp_path, {"4": {"start": start, "sleep": 30, "record": record(4, 8, 5.0, out_len=4)}})
    spec = GateSpec(levels=(LevelSpec(4, 8, 16, 4, min_output_throughput=32),))
    server = GateServer("http://127.0.0.1:1", "/m", str(py), api_key_file=str(secrets))
    for options, still in ((GateOptions(runner="bench_serving"),
                            "a first round of 4 of its 8 prompts was still running 1 s after its measured run began"),
                           (GateOptions(runner="bench_serving", early_pass=False),
                            "bench_serving's measured run was still running after 1 s")):
        t0 = time.monotonic()
        out = run_gate(spec, GateHost(local_execute), server, options)
        took = time.monotonic() - t0
        lv = out.result.levels[0]
        assert lv.status == EARLY_STOP and lv.num_prompts == 8, lv
        assert lv.reason == "cannot reach the floor: 32 tokens at 32 tok/s take 1 s; " + still
        assert lv.early_stop == {"rule": "bound", "at_s": floor_s + 0.1, "since": "measured run"}
        # never before its measured run has had its floor time; long before the outer bound (61 s)
        assert start + 0.1 + floor_s <= took < 15, took
        assert out.verdict.failures[0].startswith("C=4 stopped early after ")
    assert len(sessions(log)) == 2 and all(left_in_session(sid) == [] for sid in sessions(log))


@pytest.mark.slow
def test_a_level_that_ends_just_within_its_floor_time_is_not_stopped(tmp_path, monkeypatch):
    for name, value in FAST_WATCH.items():
        monkeypatch.setattr(bs, name, value)
    # the measured run (after the phrase and the pause) takes 1.5 s of its 2 s floor time
    py, log, secrets = fake_venv(tmp_path, {"4": {"start": 0.2, "sleep": 0.1 + 1.5,
                                                  "record": record(4, 8, 43.0, out_len=8)}})
    spec = GateSpec(levels=(LevelSpec(4, 8, 16, 8, min_output_throughput=32),))    # 64 tokens / 32 tok/s = 2 s
    out = run_gate(spec, GateHost(local_execute), GateServer("http://127.0.0.1:1", "/m", str(py), api_key_file=str(secrets)),
                   GateOptions(runner="bench_serving", early_pass=False))
    lv = out.result.levels[0]
    assert out.passed and lv.status == OK and lv.early_stop is None and lv.extra["exit_code"] == 0, out.verdict.failures
    assert lv.output_throughput == 43.0 and lv.completed == 8
    assert all(left_in_session(sid) == [] for sid in sessions(log))


def test_the_watcher_is_only_in_a_command_with_a_floor():
    lv = LevelSpec(4, 8, 16, 4, min_output_throughput=32)
    server = GateServer("http://127.0.0.1:1", "/m", "/v/bin/python")
    plain = bs.build_command(lv, server, warmup_requests=2, bound=bs.Bound(30))
    watched = bs.build_command(lv, server, warmup_requests=2, bound=bs.Bound(30, bs.floor_time_s(lv)))
    assert "$d/bound" not in plain and 'timeout -k 10 30 /v/bin/python -I -u -m ' in plain
    assert "grep -qF 'Starting main benchmark run' \"$d/stdout\"" in watched
    assert watched.count("timeout -k 10 30 ") == 1          # the outer bound stays as it was
    sec = bs.split_output(f"{bs.MARK} bound=run\n{bs.MARK} rc=124\n{bs.MARK} jsonl\n\n{bs.MARK} stderr\nTerminated\n")
    assert sec["run_bound"] and sec["rc"] == 124
    assert not bs.split_output(f"{bs.MARK} rc=124\n")["run_bound"]


HOSTILE = r'''#!/usr/bin/python3
# bench_serving's stand-in as a compromised model repository's tokenizer code would act, run as the
# gate's user: it tries to make root read a root-only file back into the gate's output
import os, sys
a = sys.argv
out = a[a.index("--output-file") + 1]
d = os.path.dirname(os.path.dirname(out))               # root's private folder around out/
for name in ("stderr", "stdout"):
    try:
        os.replace(os.path.join(d, name), os.path.join(d, name + ".old"))
        os.symlink({secret!r}, os.path.join(d, name))
        print("replaced", name, file=sys.__stdout__)
    except OSError as exc:
        print("cannot replace", name, type(exc).__name__, file=sys.__stderr__)
os.symlink({secret!r}, out)                               # its own file: a link to the secret
sys.exit(0)
'''


@pytest.mark.skipif(os.geteuid() != 0, reason="drops privileges to the system user daemon: needs root")
def test_tokenizer_code_run_as_the_gate_user_cannot_make_root_read_a_secret_back():
    """bench_serving loads the repository's tokenizer code (trust_remote_code): as the gate's user it
    can write in its own output folder only, and what root prints back from there is read as that
    user, so a link to a root-only file yields nothing."""
    work = Path(tempfile.mkdtemp(prefix="gate-hostile-"))
    try:
        work.chmod(0o755)
        secret = work / "root-only-secret"
        secret.write_text("TOPSECRET-hf-token\n")
        secret.chmod(0o600)
        py = work / "python"
        py.write_text(HOSTILE.format(secret=str(secret)))
        py.chmod(0o755)
        cmd = bs.build_command(LevelSpec(1, 1, 8, 8), GateServer("http://127.0.0.1:30000", "/m", str(py)),
                               warmup_requests=0, bound=bs.Bound(30), run_as="daemon")
        rc, out, err = local_execute(f"TMPDIR={work}; export TMPDIR; {cmd}", 60)
        assert rc == 0 and f"{bs.MARK} rc=0" in out, (out, err)
        assert "TOPSECRET" not in out + err
        sec = bs.split_output(out)
        assert sec["jsonl"] == "" and "cannot replace stderr PermissionError" in sec["stderr"]
        assert "replaced" not in out
        assert not list(work.glob("dsv4deploy-gate.*"))            # root's folder removed after the run
    finally:
        shutil.rmtree(work, ignore_errors=True)


CACHE_WRITER = r'''#!/usr/bin/python3
# bench_serving's stand-in as transformers and SGLang act at start: each writes in its cache folder
# (a trust_remote_code module copy, a hub lookup, SGLang's JIT caches), then the JSONL
import json, os, sys
a = sys.argv
import getpass, tempfile
for var in ("HOME", "XDG_CACHE_HOME", "HF_HOME", "TRANSFORMERS_CACHE", "SGLANG_CACHE_DIR"):
    os.makedirs(os.path.join(os.environ[var], "probe"), exist_ok=True)
    open(os.path.join(os.environ[var], "probe", "written"), "w").close()
# CUTLASS's DSL: $TMPDIR/$USER/cutlass_python_cache
os.makedirs(os.path.join(tempfile.gettempdir(), getpass.getuser(), "cutlass_python_cache"))
home = os.environ["HOME"]
with open(a[a.index("--output-file") + 1], "w") as f:
    f.write(json.dumps(json.loads({record!r}) | {{"home_owner_uid": os.stat(home).st_uid, "uid": os.getuid(),
                                    "offline": [os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE")],
                                    "fresh": sorted(os.listdir(home))}}) + "\n")
'''


@pytest.mark.skipif(os.geteuid() != 0, reason="drops privileges to the system user daemon: needs root")
def test_the_gate_user_writes_its_caches_in_a_folder_of_its_own_removed_after_the_run():
    """The gate account has no home (/nonexistent): bench_serving as that user still writes every
    cache it needs (HOME, XDG, Hugging Face, transformers, SGLang) in a fresh folder it owns, offline,
    and nothing of it is left after the level."""
    work = Path(tempfile.mkdtemp(prefix="gate-caches-"))
    try:
        work.chmod(0o755)
        py = work / "python"
        py.write_text(CACHE_WRITER.format(record=json.dumps(record(1, 1, 12.0))))
        py.chmod(0o755)
        cmd = bs.build_command(LevelSpec(1, 1, 8, 8), GateServer("http://127.0.0.1:30000", "/m", str(py)),
                               warmup_requests=0, bound=bs.Bound(30), run_as="daemon")
        rc, out, err = local_execute(f"TMPDIR={work}; export TMPDIR HOME=/root USER=root; {cmd}", 60)
        sec = bs.split_output(out)
        assert rc == 0 and sec["rc"] == 0, (out, err)
        doc = json.loads(sec["jsonl"])
        assert doc["uid"] == doc["home_owner_uid"] != 0
        assert doc["offline"] == ["1", "1"] and doc["fresh"] == [".cache", "daemon", "probe"]
        # nothing left in the host's TMPDIR (root's folder of the run is removed)
        assert sorted(p.name for p in work.iterdir()) == ["python"]
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_on_the_host_bench_serving_reaches_the_server_alone():
    """bench_serving holds the inference key in its environment and runs the model repository's
    tokenizer code: on the host it runs in a scope whose IP traffic may reach only the server's
    address, and the key is in no property of that scope (systemctl show shows them to anyone)."""
    lv = LevelSpec(16, 48, 256, 256)
    server = GateServer("http://127.0.0.1:30000", "/m", "/v/bin/python", "/etc/dsv4deploy/secrets/sglang-api-key")
    cmd = bs.build_command(lv, server, warmup_requests=2, bound=bs.Bound(300), run_as="dsv4deploy-gate", confined=True)
    assert ("timeout -k 10 300 systemd-run --quiet --scope --collect --property=IPAddressDeny=any "
            "--property=IPAddressAllow=127.0.0.1 -- setpriv --reuid=dsv4deploy-gate") in cmd
    assert cmd.count("OPENAI_API_KEY") == 2 and "--setenv" not in cmd   # the key: root's shell, inherited
    assert bs.no_egress("http://[::1]:30000")[-2:] == ["--property=IPAddressAllow=::1", "--"]
    assert bs.no_egress("http://localhost:30000")[-2] == "--property=IPAddressAllow=localhost"
    # the deploy's gate host confines it; the tests' local hosts (no systemd) do not
    from dsv4deploy.host.gate import gate_host
    assert gate_host(object()).confined is True
    assert "systemd-run" not in bs.build_command(lv, server, warmup_requests=2, bound=bs.Bound(300), run_as="dsv4deploy-gate")
