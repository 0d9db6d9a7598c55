"""The SGLang twin server over HTTP: startup phases, endpoints, API key, streaming, real clients."""

import json
import signal
import time

import pytest
import requests

from dsv4deploy.sglang.patches import MASK_SECRETS_MARKERS
from ct200twin.server.args import has_ready_endpoint
from ct200twin.server.main import LocalTwin, nvfp4_ctx8k_argv

KEY = "sk-twin-test"
FAST = {"load_seconds": 0.3, "warmup_seconds": 0.2, "health_poll_seconds": 0.1}


def patched_sglang_tree(root) -> dict:
    """An SGLang tree carrying the mask patch's marker lines (the real patch is tested on the real
    wheel in test_sglang_mask_patch.py): the environment that puts it on the twin's path."""
    for rel, line in MASK_SECRETS_MARKERS.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(line + "\n")
    (root / "sglang" / "__init__.py").write_text("")
    return {"PYTHONPATH": str(root)}


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    t = LocalTwin(argv=[], faults=FAST, env=patched_sglang_tree(tmp_path_factory.mktemp("site")))
    cfg = t.tmp / "sglang.yaml"
    cfg.write_text(f"api-key: {KEY}\n")  # the API key travels in --config, not in argv
    t.argv = nvfp4_ctx8k_argv(str(t.model_dir), t.port) + ["--config", str(cfg)]
    with t:
        t.wait_ready()
        yield t


def auth():
    return {"Authorization": f"Bearer {KEY}"}


def get(twin, path, **kw):
    return requests.get(twin.url + path, headers=kw.pop("headers", auth()), timeout=30, **kw)


def post(twin, path, body, **kw):
    return requests.post(twin.url + path, json=body, headers=kw.pop("headers", auth()), timeout=60, **kw)


def sse(resp):
    out = []
    for line in resp.iter_lines():
        if line.startswith(b"data: "):
            p = line[6:]
            out.append(p.decode() if p == b"[DONE]" else json.loads(p))
    return out


@pytest.mark.slow
def test_startup_phases_and_sigterm():
    faults = {"load_seconds": 1.2, "warmup_seconds": 1.0, "health_poll_seconds": 0.1}
    with LocalTwin(argv=[], faults=faults) as t:
        t.argv = nvfp4_ctx8k_argv(str(t.model_dir), t.port)
        t.stop()
        t.start()
        seen = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < 20:
            code = t._get("/health")
            if not seen or seen[-1] != code:
                seen.append(code)
            if code == 200:
                break
            time.sleep(0.05)
        assert seen == [None, 503, 200], seen  # refused while loading, 503 during warmup, then up
        assert t._get("/ready") == 200
        assert t._get("/metrics") == 200
        log = t.output()
        assert ("max_total_num_tokens=1975040, chunked_prefill_size=8192, max_prefill_tokens=16384, "
                "max_running_requests=256, context_len=8192, available_gpu_mem=6.44 GB") in log
        assert "The server is fired up and ready to roll!" in log
        t0 = time.monotonic()
        t.proc.send_signal(signal.SIGTERM)
        assert t.wait_exit(5) == 0 and time.monotonic() - t0 < 3


def test_sigterm_during_load_exits_0():
    with LocalTwin(faults={"load_seconds": 30}) as t:
        t0 = time.monotonic()
        while "Load weight begin" not in t.output() and time.monotonic() - t0 < 15:
            time.sleep(0.05)
        assert t._get("/health") is None
        t.proc.send_signal(signal.SIGTERM)
        assert t.wait_exit(5) == 0


@pytest.mark.slow
def test_health_runs_a_generation(twin):
    t0 = time.monotonic()
    assert requests.get(twin.url + "/health", timeout=10).status_code == 200
    assert time.monotonic() - t0 >= 0.1  # polls for the 1-token generation
    assert requests.get(twin.url + "/health_generate", timeout=10).status_code == 200
    assert requests.get(twin.url + "/ready", timeout=10).status_code == 200


def test_info_endpoints(twin):
    mi = get(twin, "/model_info").json()
    assert mi["model_path"] == str(twin.model_dir) and mi["is_generation"] is True
    assert mi["architectures"] == ["DeepseekV4ForCausalLM"]
    assert get(twin, "/get_model_info").json() == mi
    si = get(twin, "/server_info").json()
    assert si["model_path"] == str(twin.model_dir) and si["tp_size"] == 4
    assert si["context_length"] == 8192 and si["mem_fraction_static"] == 0.7
    # The profile no longer renders --num-continuous-decode-steps (SGLang never reads it); SGLang
    # still reports the parsed value of a declared flag, so with no flag: the default, 1.
    assert si["cuda_graph_max_bs_decode"] == 32 and si["num_continuous_decode_steps"] == 1
    assert si["moe_runner_backend"] == "marlin" and si["max_running_requests"] == 256
    assert si["version"] == "0.5.23" and si["max_total_num_tokens"] == 1975040
    assert si["pid"] == twin.proc.pid and si["served_model_name"] == "deepseek-v4-flash"
    assert "--tp-size 4" in si["launch_command"] and "--api-key <redacted>" in si["launch_command"]
    assert si["api_key"] == "<redacted>" and KEY not in json.dumps(si)
    assert "api_key='<redacted>'" in twin.output() and KEY not in twin.output()
    assert get(twin, "/get_server_info").json()["pid"] == twin.proc.pid
    models = get(twin, "/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == "deepseek-v4-flash" and models["data"][0]["max_model_len"] == 8192
    assert get(twin, "/v1/models/deepseek-v4-flash").status_code == 200
    assert get(twin, "/v1/models/other").status_code == 404
    assert get(twin, "/ping").status_code == 200
    assert get(twin, "/nope").status_code == 404


def test_flush_cache_and_metrics(twin):
    r = post(twin, "/flush_cache", {})
    assert r.status_code == 200 and r.text.startswith("Cache flushed.")
    post(twin, "/generate", {"text": "count me", "sampling_params": {"max_new_tokens": 3}})
    m = requests.get(twin.url + "/metrics", timeout=10)  # no key needed
    assert m.status_code == 200
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput",
                 "sglang:generation_tokens_total", "sglang:prompt_tokens_total", "sglang:token_usage",
                 "sglang:max_total_num_tokens", "sglang:e2e_request_latency_seconds_bucket"):
        assert name in m.text
    gen = [ln for ln in m.text.splitlines() if ln.startswith("sglang:generation_tokens_total")]
    assert float(gen[0].split()[-1]) >= 3


def test_api_key_rules(twin):
    for path in ("/model_info", "/server_info", "/v1/models", "/ping", "/flush_cache"):
        r = requests.get(twin.url + path, timeout=10)
        assert r.status_code == 401 and r.json() == {"error": "Unauthorized"}, path
    r = requests.post(twin.url + "/generate", json={"text": "x"}, timeout=10)
    assert r.status_code == 401
    r = requests.get(twin.url + "/model_info", headers={"Authorization": "Bearer wrong"}, timeout=10)
    assert r.status_code == 401
    r = requests.get(twin.url + "/model_info", headers={"Authorization": KEY}, timeout=10)
    assert r.status_code == 401  # API_KEY style header without "Bearer" is rejected
    r = requests.get(twin.url + "/model_info", headers={"Authorization": f"bearer {KEY}"}, timeout=10)
    assert r.status_code == 200
    for path in ("/health", "/health_generate", "/ready", "/metrics"):
        assert requests.get(twin.url + path, timeout=10).status_code == 200, path


def test_generate_non_stream(twin):
    body = {"text": "The capital city of France is", "sampling_params": {"max_new_tokens": 5}}
    a = post(twin, "/generate", body).json()
    b = post(twin, "/generate", body).json()
    assert a["text"] == b["text"] and len(a["text"].split()) == 5 and len(a["output_ids"]) == 5
    mi = a["meta_info"]
    assert mi["prompt_tokens"] == 6 and mi["completion_tokens"] == 5
    assert mi["finish_reason"] == {"type": "length", "length": 5} and mi["e2e_latency"] > 0
    r = post(twin, "/generate", {"input_ids": list(range(300)), "sampling_params": {"max_new_tokens": 2,
                                                                                      "ignore_eos": True}})
    assert r.json()["meta_info"]["prompt_tokens"] == 300
    batch = post(twin, "/generate", {"text": ["a b", "c d e"], "sampling_params": {"max_new_tokens": 2}}).json()
    assert [x["meta_info"]["prompt_tokens"] for x in batch] == [2, 3]


def test_generate_errors(twin):
    r = post(twin, "/generate", {"input_ids": [1] * 8192, "sampling_params": {"max_new_tokens": 1}})
    assert r.status_code == 400 and "longer than the model's context length (8192 tokens)" in r.text
    r = post(twin, "/generate", {"input_ids": [1] * 8000, "sampling_params": {"max_new_tokens": 500}})
    assert r.status_code == 400 and "maximum context length of 8192" in r.text
    assert post(twin, "/generate", {"sampling_params": {}}).status_code == 400


def test_generate_stream_cumulative(twin):
    body = {"input_ids": [7] * 256, "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}, "stream": True}
    with requests.post(twin.url + "/generate", json=body, headers=auth(), stream=True, timeout=30) as r:
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        chunks = sse(r)
    assert chunks[-1] == "[DONE]"
    data = chunks[:-1]
    # cumulative, like SGLang's tokenizer manager: each chunk carries the latest state, so under load two
    # decode steps can arrive in one chunk (it yields out_list[-1]); the counts only grow and end at 6
    counts = [c["meta_info"]["completion_tokens"] for c in data]
    assert counts[-1] == 6 and all(a < b for a, b in zip(counts, counts[1:])) and len(data) >= 2, counts
    for prev, cur in zip(data, data[1:]):
        assert cur["text"].startswith(prev["text"]) and len(cur["text"]) > len(prev["text"])
    assert all(c["meta_info"]["finish_reason"] is None and "e2e_latency" not in c["meta_info"] for c in data[:-1])
    last = data[-1]["meta_info"]
    assert last["finish_reason"] == {"type": "length", "length": 6} and last["e2e_latency"] > 0
    assert last["prompt_tokens"] == 256 and last["id"]


@pytest.mark.slow
def test_a_client_gone_mid_stream_is_one_log_line_and_its_request_is_aborted(twin):
    """A gate that stops a level early closes its streams: SGLang logs one line per request and
    aborts it; no aiohttp traceback buries the journal's last lines (which a failed deploy prints)."""
    for path, body in (("/generate", {"input_ids": [7] * 64, "stream": True,
                                      "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}}),
                       ("/v1/completions", {"model": "deepseek-v4-flash", "prompt": "hi", "max_tokens": 2000,
                                            "stream": True})):
        before = len(twin.output())
        with requests.post(twin.url + path, json=body, headers=auth(), stream=True, timeout=30) as r:
            next(r.iter_lines())                                     # a first chunk, then hang up
        for _ in range(50):
            log = twin.output()[before:]
            if "disconnected from the client side" in log:
                break
            time.sleep(0.1)
        assert log.count("Request is disconnected from the client side (type 3). Abort request") == 1, log[-2000:]
        assert "Traceback" not in log and "ClientConnectionResetError" not in log
        assert get(twin, "/health").status_code == 200              # and it serves on


@pytest.mark.slow
def test_openai_client(twin):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=twin.url + "/v1", api_key=KEY)
    assert [m.id for m in client.models.list()] == ["deepseek-v4-flash"]
    c = client.completions.create(model="deepseek-v4-flash", prompt="Hello there", max_tokens=4)
    assert c.choices[0].finish_reason == "length" and len(c.choices[0].text.split()) == 4
    assert c.usage.prompt_tokens == 2 and c.usage.completion_tokens == 4 and c.usage.total_tokens == 6
    stream = client.completions.create(model="deepseek-v4-flash", prompt="Hello there", max_tokens=4,
                                       stream=True, stream_options={"include_usage": True})
    text, finish, usage = "", None, None
    for ch in stream:
        if ch.choices:
            text += ch.choices[0].text
            finish = ch.choices[0].finish_reason or finish
        if ch.usage:
            usage = ch.usage
    assert text == c.choices[0].text and finish == "length" and usage.completion_tokens == 4
    chat = client.chat.completions.create(model="deepseek-v4-flash", max_tokens=3,
                                          messages=[{"role": "user", "content": "hi"}])
    assert len(chat.choices[0].message.content.split()) == 3
    bad = openai.OpenAI(base_url=twin.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="deepseek-v4-flash", prompt="x", max_tokens=1)


def test_ready_endpoint_is_versioned():
    assert has_ready_endpoint("0.5.23") and has_ready_endpoint("0.5.20")
    assert not has_ready_endpoint("0.5.17")


@pytest.mark.slow
def test_metrics_absent_without_flag_and_missing_model_path(tmp_path):
    with LocalTwin(faults=FAST) as t:
        t.argv = [a for a in t.argv if a != "--enable-metrics"]
        t.stop()
        t.start()
        t.wait_ready()
        assert t._get("/metrics") == 404
    with LocalTwin(faults=FAST) as t:
        t.argv[t.argv.index("--model-path") + 1] = str(tmp_path / "absent")
        t.stop()
        t.start()
        assert t.wait_exit(20) == 1
        assert "OSError: Can't load the configuration of" in t.output()


@pytest.mark.slow
def test_server_info_without_config_json(tmp_path):
    empty = tmp_path / "ckpt"
    empty.mkdir()
    with LocalTwin(faults=FAST) as t:
        # An old launch with --num-continuous-decode-steps still starts: SGLang declares the flag
        # (and shows its parsed value) but never reads it.
        t.argv = nvfp4_ctx8k_argv(str(empty), t.port, context_length=None) + ["--num-continuous-decode-steps", "4"]
        t.stop()
        t.start()
        t.wait_ready()
        si = requests.get(t.url + "/server_info", timeout=10).json()
        assert si["context_length"] == 1048576 and si["model_path"] == str(empty)
        assert si["num_continuous_decode_steps"] == 4
        assert si["launch_command"].split()[:2] == ["--model-path", str(empty)]   # SGLang's: args only


@pytest.mark.slow
def test_without_the_mask_patch_the_key_shows_as_sglang_0523_shows_it(tmp_path):
    """Upstream 0.5.23 logs the key and returns it in /server_info: so does the twin when the
    SGLang tree next to it lacks the patch (the validator refuses an API key without it)."""
    t = LocalTwin(argv=[], faults=FAST)
    cfg = t.tmp / "sglang.yaml"
    cfg.write_text(f"api-key: {KEY}\n")
    t.argv = nvfp4_ctx8k_argv(str(t.model_dir), t.port) + ["--config", str(cfg)]
    with t:
        t.wait_ready()
        si = get(t, "/server_info").json()
        out = t.output()
    assert si["api_key"] == KEY and f"--api-key {KEY}" in si["launch_command"]
    assert f"api_key='{KEY}'" in out


def test_an_admin_key_takes_the_admin_endpoints_from_the_api_key(tmp_path):
    """SGLang 0.5.23 with --admin-api-key: its management endpoints take only that key, the API
    key no more; the API takes only the API key (srt/utils/auth.py). The twin does the same."""
    admin = "sk-admin-" + "b" * 20
    t = LocalTwin(argv=[], faults=FAST, env=patched_sglang_tree(tmp_path / "site"))
    cfg = t.tmp / "sglang.yaml"
    cfg.write_text(f'api-key: "{KEY}"\nadmin-api-key: "{admin}"\n')
    t.argv = nvfp4_ctx8k_argv(str(t.model_dir), t.port) + ["--config", str(cfg)]
    with t:
        t.wait_ready()
        bearer = lambda k: {"Authorization": f"Bearer {k}"}   # noqa: E731
        assert post(t, "/flush_cache", {}, headers=bearer(KEY)).status_code == 401
        assert post(t, "/flush_cache", {}, headers=bearer(admin)).status_code == 200
        assert get(t, "/v1/models", headers=bearer(admin)).status_code == 401
        assert get(t, "/v1/models", headers=bearer(KEY)).status_code == 200
        si = get(t, "/server_info").json()
    assert admin not in json.dumps(si) and si["admin_api_key"] == "<redacted>"
