"""dsv4deploy.gateway.model against the real smg binary, in front of two local twin servers on loopback:
the drain a rolling update runs lets an in-flight stream finish, and readmit brings the replica
back. Opt-in: needs a venv with smg (DSV4_SMG_PYTHON=.cache/smg-venv/bin/python; see
tests/tools/smg_measure.py for how it was made); skipped otherwise."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

from dsv4deploy.gateway import model as gateway
from ct200twin.server.main import LocalTwin, free_port, nvfp4_ctx8k_argv
from tools.smg_measure import urllib_http

SMG_PYTHON = os.environ.get("DSV4_SMG_PYTHON")
# Not marked slow: that marker starts the twin/parser prebuilds (tests/conftest.py), which this needs neither of.
pytestmark = pytest.mark.skipif(not SMG_PYTHON, reason="DSV4_SMG_PYTHON (a python with smg installed) not set")
KEY = "sk-live-test-5d1c0e7a"
CONTROL = "sk-live-control-9b2f4c61"
KEYS = gateway.Keys(control=CONTROL, worker=KEY)     # /workers: the control-plane key; workers: the inference key
FAST = {"load_seconds": 0.3, "warmup_seconds": 0.2, "health_poll_seconds": 0.1}
LAUNCHER = Path(gateway.__file__).with_name("launcher.py")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("smg")
    (tmp / "creds").mkdir()
    (tmp / "creds" / gateway.KEY_CREDENTIAL).write_text(KEY + "\n")
    (tmp / "creds" / gateway.CONTROL_CREDENTIAL).write_text(CONTROL + "\n")
    twins = []
    for _ in range(2):
        t = LocalTwin(argv=[], faults=FAST)
        (t.tmp / "k.yaml").write_text(f"api-key: {KEY}\n")
        t.argv = nvfp4_ctx8k_argv(str(t.model_dir), t.port) + ["--config", str(t.tmp / "k.yaml")]
        twins.append(t.start())
    for t in twins:
        t.wait_ready()
    port, metrics = free_port(), free_port()
    flags = gateway.launch_flags([t.url for t in twins], "127.0.0.1", port, "round_robin", metrics, "/ready", 5)
    proc = subprocess.Popen(gateway.launcher_argv(SMG_PYTHON, str(LAUNCHER), flags, keyed=True),
                            stdout=open(tmp / "smg.log", "w"), stderr=subprocess.STDOUT,
                            env={**os.environ, "CREDENTIALS_DIRECTORY": str(tmp / "creds")})
    url = f"http://127.0.0.1:{port}"
    ok = gateway.wait_for(lambda: _listed(url) == 2, 30, 0.2)
    assert ok, (tmp / "smg.log").read_text()[-2000:]
    yield url, twins
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    for t in twins:
        t.stop()


def _listed(url) -> int:
    try:
        return len(gateway.list_workers(urllib_http, url, KEYS))
    except gateway.GatewayError:
        return 0


def test_drain_waits_for_the_stream_in_flight_then_readmit_routes_to_it_again(stack):
    url, twins = stack
    done = {}

    def stream():
        with requests.post(url + "/generate", headers={"Authorization": f"Bearer {KEY}"}, stream=True, timeout=60,
                           json={"text": "x", "stream": True, "sampling_params": {"max_new_tokens": 200,
                                                                                    "ignore_eos": True}}) as r:
            lines = [l for l in r.iter_lines() if l.startswith(b"data: ")]
        done.update(chunks=len(lines) - 1, last=lines[-1], at=time.monotonic())

    threads = [threading.Thread(target=stream) for _ in range(2)]  # round robin: one on each replica
    for th in threads:
        th.start()
        time.sleep(0.3)
    time.sleep(1.0)
    victim = twins[0].url
    started = time.monotonic()
    drained = gateway.drain(urllib_http, url, KEYS, victim, timeout_s=60, poll_s=0.25)
    for th in threads:
        th.join()
    assert drained.idle_s is not None and drained.in_flight == 0
    assert drained.removed_s >= 4.5          # smg's 5 s settle time, not the stream's length
    assert drained.idle_s > drained.removed_s  # the stream outlived the removal: the drain waited on it
    assert done["last"] == b"data: [DONE]" and done["chunks"] == 200
    assert gateway.find(gateway.list_workers(urllib_http, url, KEYS), victim) is None
    assert started + drained.idle_s <= time.monotonic()

    w = gateway.readmit(urllib_http, url, KEYS, victim, timeout_s=30, poll_s=0.25)
    assert w.routable
    served = []
    for _ in range(4):
        r = requests.post(url + "/generate", headers={"Authorization": f"Bearer {KEY}"}, timeout=30,
                          json={"text": "y", "sampling_params": {"max_new_tokens": 2}})
        served.append(r.status_code)
    assert served == [200] * 4
    assert gateway.replica_in_flight(requests.get(victim + "/metrics", timeout=5).text) == 0


def test_each_key_opens_its_own_plane_only(stack):
    """smg with the launcher's two keys: /workers refuses the inference key, the API refuses the
    control-plane key (one key per power: a client key cannot add a worker URL)."""
    url, _ = stack
    with pytest.raises(gateway.GatewayError, match="401"):
        gateway.list_workers(urllib_http, url, KEY)
    assert len(gateway.list_workers(urllib_http, url, CONTROL)) == 2
    ask = lambda key: requests.post(url + "/generate", headers={"Authorization": f"Bearer {key}"}, timeout=30,  # noqa: E731
                                    json={"text": "z", "sampling_params": {"max_new_tokens": 2}}).status_code
    assert (ask(CONTROL), ask(KEY)) == (401, 200)
