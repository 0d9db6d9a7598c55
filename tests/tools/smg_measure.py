#!/usr/bin/env python3
"""Measure the real smg gateway in front of two twin servers, on loopback only, and record what
it answers: docs/replicas.md ("smg, as measured") quotes the transcript, tests/fixtures/smg/
holds the API answers dsv4deploy.gateway.model parses (the key scrubbed to <KEY>).

    python3 -m venv .cache/smg-venv && .cache/smg-venv/bin/pip install smg==1.13.0
    .venv/bin/python tests/tools/smg_measure.py --smg-python .cache/smg-venv/bin/python \\
        [--fixtures tests/fixtures/smg] [--transcript .cache/smg-transcript.txt]

Ports: twins 127.0.0.1:31001 and :31002, the gateway :31000, its metrics :31009 (never 30000).
The gateway runs through dsv4deploy/gateway/launcher.py with dsv4deploy.gateway.model.launch_flags,
the key in a credentials folder, as the rendered unit runs it.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import requests

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from dsv4deploy.gateway import model as gateway  # noqa: E402
from ct200twin.server.main import LocalTwin, nvfp4_ctx8k_argv  # noqa: E402

def urllib_http(method: str, url: str, headers: dict, body: bytes | None, timeout: float) -> tuple[int, bytes]:
    """gateway.model's HTTP callable over urllib (no proxies: the gateway and replicas are local);
    the deploy's own goes over SSH (host/gateway_http.py)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    req = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except urllib.error.URLError as exc:
        raise OSError(str(exc.reason)) from None


HC: dict = {}                  # the control-plane key's header (main sets it)
KEYS: gateway.Keys | None = None
GW, GW_PORT, METRICS_PORT, PORTS = "http://127.0.0.1:31000", 31000, 31009, (31001, 31002)
FAST = {"load_seconds": 0.3, "warmup_seconds": 0.2, "health_poll_seconds": 0.1}


class Recorder:
    def __init__(self, key: str, transcript: Path, fixtures: Path | None):
        self.key, self.t0, self.lines, self.secrets = key, time.monotonic(), [], []
        self.transcript, self.fixtures = transcript, fixtures

    def scrub(self, text: str) -> str:
        for other in self.secrets:
            text = text.replace(other, "<CONTROL-KEY>")
        return text.replace(self.key, "<KEY>")

    def log(self, *parts) -> None:
        line = self.scrub(f"[{time.monotonic() - self.t0:6.2f}s] " + " ".join(str(p) for p in parts))
        print(line, flush=True)
        self.lines.append(line)

    def fixture(self, name: str, status: int, body: bytes) -> None:
        if self.fixtures:
            doc = {"status": status, "body": json.loads(self.scrub(body.decode()))}
            (self.fixtures / name).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")

    def save(self) -> None:
        self.transcript.write_text("\n".join(self.lines) + "\n")


def start_twin(port: int, cfg_dir: Path, key: str) -> LocalTwin:
    t = LocalTwin(argv=[], faults=FAST)
    t.port = port
    cfg = cfg_dir / f"sglang-{port}.yaml"
    cfg.write_text(f"api-key: {key}\n")
    t.argv = nvfp4_ctx8k_argv(str(t.model_dir), port) + ["--config", str(cfg)]
    return t.start()


def counts(port: int) -> tuple[float, int]:
    """(requests the replica served in all, running + queued now) from its /metrics."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    total = next(float(l.split()[-1]) for l in text.splitlines() if l.startswith("sglang:num_requests_total"))
    return total, gateway.replica_in_flight(text) or 0


def stream(rec: Recorder, headers: dict, tag: str, tokens: int, out: dict) -> None:
    body = {"text": f"stream {tag}", "stream": True, "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}
    chunks, done, err, last = 0, False, None, None
    try:
        with requests.post(GW + "/generate", headers=headers, json=body, stream=True, timeout=120) as r:
            out["status"] = r.status_code
            for line in r.iter_lines():
                if line == b"data: [DONE]":
                    done = True
                elif line.startswith(b"data: "):
                    chunks += 1
                    last = line[6:]
    except requests.RequestException as exc:
        err = f"{type(exc).__name__}: {str(exc)[:160]}"
    try:
        doc = json.loads(last) if last else {}
    except ValueError:
        doc = {"unparsed": last[:200].decode(errors="replace")}
    finish = (doc.get("meta_info") or {}).get("finish_reason") if isinstance(doc, dict) else None
    out.update(chunks=chunks, done=done, error=err, ended=time.monotonic() - rec.t0)
    rec.log(f"stream {tag}: HTTP {out.get('status')}, {chunks} of {tokens} chunks, [DONE] {'seen' if done else 'MISSING'}, "
            f"last chunk finish_reason={json.dumps(finish)}" + (f", error {err}" if err else "")
            + ("" if finish or not doc else f", last chunk {json.dumps(doc)[:300]}"))


def listing(rec: Recorder, headers: dict) -> list[gateway.Worker]:
    r = requests.get(GW + "/workers", headers=headers, timeout=5)
    ws = gateway.parse_workers(r.content)
    rec.log("GET /workers ->", r.status_code, [(w.url.rsplit(":", 1)[1], w.status, w.healthy, w.load) for w in ws])
    return ws


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smg-python", required=True, help="python of a venv with smg installed")
    ap.add_argument("--fixtures", type=Path, help="write the recorded API answers here")
    ap.add_argument("--transcript", type=Path, default=REPO / ".cache" / "smg-transcript.txt")
    ap.add_argument("--policy", default="round_robin", choices=gateway.POLICIES)
    args = ap.parse_args(argv)
    key = "sk-measure-" + secrets.token_hex(12)
    rec = Recorder(key, args.transcript, args.fixtures)
    if args.fixtures:
        args.fixtures.mkdir(parents=True, exist_ok=True)
    H = {"Authorization": f"Bearer {key}"}
    control = "sk-measure-control-" + secrets.token_hex(12)     # /workers takes only this one
    global HC, KEYS
    HC, KEYS = {"Authorization": f"Bearer {control}"}, gateway.Keys(control=control, worker=key)
    rec.secrets.append(control)
    tmp = Path(tempfile.mkdtemp(prefix="smg-measure-"))
    creds = tmp / "creds"
    creds.mkdir(mode=0o700)
    (creds / gateway.KEY_CREDENTIAL).write_text(key + "\n")
    (creds / gateway.CONTROL_CREDENTIAL).write_text(control + "\n")
    version = subprocess.run([args.smg_python, "-m", "smg", "--version"], capture_output=True, text=True).stdout.strip()
    rec.log("smg --version ->", version)
    twins = {p: start_twin(p, tmp, key) for p in PORTS}
    for t in twins.values():
        t.wait_ready()
    urls = [f"http://127.0.0.1:{p}" for p in PORTS]
    flags = gateway.launch_flags(urls, "127.0.0.1", GW_PORT, args.policy, METRICS_PORT, "/ready", 5)
    argv = gateway.launcher_argv(args.smg_python, str(REPO / "dsv4deploy" / "gateway" / "launcher.py"), flags, keyed=True)
    rec.log("gateway argv:", " ".join(argv))
    log = open(tmp / "smg.log", "w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "CREDENTIALS_DIRECTORY": str(creds), "NO_COLOR": "1"})
    try:
        run(rec, H, proc, twins, tmp, key)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        for t in twins.values():
            t.stop()
        smg_log = (tmp / "smg.log").read_text(errors="replace")
        rec.log(f"key in smg's log: {key in smg_log} ({len(smg_log.splitlines())} lines)")
        rec.save()
    return 0


def run(rec: Recorder, H: dict, proc, twins: dict, tmp: Path, key: str) -> None:
    # 1. start-up: /health answers before the workers are registered
    t_start = time.monotonic()
    while True:
        try:
            r = requests.get(GW + "/health", timeout=1)
            break
        except requests.ConnectionError:
            time.sleep(0.05)
    rec.log(f"/health -> {r.status_code} after {time.monotonic() - t_start:.2f}s; "
            f"GET /workers total={requests.get(GW + '/workers', headers=HC).json().get('total')}")
    got = gateway.wait_for(lambda: len(gateway.list_workers(urllib_http, GW, KEYS)) == 2, 30, 0.1)
    rec.log(f"both workers listed after {time.monotonic() - t_start:.2f}s: {bool(got)}")
    r = requests.get(GW + "/workers", headers=HC)
    rec.fixture("workers_two_ready.json", r.status_code, r.content)
    listing(rec, HC)

    # 2. listeners and keys
    ss = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout
    rec.log("listening:", sorted({l.split()[3] for l in ss.splitlines()[1:] if f"pid={proc.pid}," in l}))
    cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    environ = Path(f"/proc/{proc.pid}/environ").read_bytes()
    rec.log(f"/proc/PID/cmdline: {cmdline.strip()!r}; key in cmdline: {key in cmdline}; "
            f"key in environ: {key.encode() in environ}")
    for name, path, hdr in (("no key", "/workers", {}), ("wrong key", "/workers", {"Authorization": "Bearer wrong"}),
                            ("no key", "/v1/models", {}), ("no key", "/health", {})):
        r = requests.get(GW + path, headers=hdr, timeout=5)
        rec.log(f"GET {path} ({name}) -> {r.status_code} {r.text[:160]}")
        if path == "/workers":
            rec.fixture(f"workers_{name.replace(' ', '_')}.json", r.status_code, r.content)
    r = requests.post(GW + "/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 2}}, timeout=10)
    rec.log(f"POST /generate (no key) -> {r.status_code} {r.text[:160]}")
    m = requests.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=5)
    rec.log(f"GET :{METRICS_PORT}/metrics (no key) -> {m.status_code}, {len(m.text.splitlines())} lines")

    # 3. routing: both APIs, spread over both replicas
    before = {p: counts(p)[0] for p in twins}
    for i in range(4):
        r = requests.post(GW + "/v1/chat/completions", headers=H, timeout=30, json={
            "model": "deepseek-v4-flash", "messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 4})
        rec.log(f"POST /v1/chat/completions -> {r.status_code} finish={r.json()['choices'][0]['finish_reason']} "
                f"usage={r.json()['usage']['completion_tokens']}")
        r = requests.post(GW + "/generate", headers=H, timeout=30,
                          json={"text": f"hello {i}", "sampling_params": {"max_new_tokens": 4}})
        rec.log(f"POST /generate -> {r.status_code} completion_tokens={r.json()['meta_info']['completion_tokens']}")
    rec.log("requests per replica:", {p: counts(p)[0] - before[p] for p in twins})

    # 4. remove a worker with streams in flight: what smg does, what the streams see
    outs = [{}, {}]
    threads = [threading.Thread(target=stream, args=(rec, H, f"s{i}", 300, outs[i])) for i in range(2)]
    for th in threads:
        th.start()
        time.sleep(0.3)
    time.sleep(1.0)
    busy = {p: counts(p)[1] for p in twins}
    rec.log("in flight per replica (its /metrics):", busy)
    victim = max(busy, key=busy.get)
    metrics_fixture(rec, victim, "replica_metrics_busy.txt")
    ws = listing(rec, HC)
    wid = gateway.find(ws, f"http://127.0.0.1:{victim}").id
    r = requests.delete(f"{GW}/workers/{wid}", headers=HC, timeout=5)
    t_del = time.monotonic()
    rec.log(f"DELETE /workers/<{victim}> -> {r.status_code} {r.text}")
    rec.fixture("delete_accepted.json", r.status_code, r.content)
    r = requests.get(GW + "/workers", headers=HC)
    rec.fixture("workers_one_draining.json", r.status_code, r.content)
    new_before = {p: counts(p)[0] for p in twins}
    seen_gone, sent = None, 0
    while time.monotonic() - t_del < 12:
        ws = listing(rec, HC)
        if gateway.find(ws, f"http://127.0.0.1:{victim}") is None and seen_gone is None:
            seen_gone = time.monotonic() - t_del
            rec.fixture("workers_one_removed.json", 200, requests.get(GW + "/workers", headers=HC).content)
            rec.log(f"removed from the list {seen_gone:.2f}s after DELETE; replica {victim} in flight: {counts(victim)[1]}")
            rec.log(f"{sent} new requests sent while draining, served per replica (the streams still running):",
                    {p: counts(p)[0] - new_before[p] for p in twins})
        if seen_gone is None:
            requests.post(GW + "/generate", headers=H, json={"text": "during drain", "sampling_params": {"max_new_tokens": 2}})
            sent += 1
        time.sleep(1.0)
    for th in threads:
        th.join()
    rec.log("replica in flight after the streams ended:", {p: counts(p)[1] for p in twins})

    # 5. stop a removed replica while a stream still runs on it: what the client sees
    out = {}
    busy_port = [p for p in twins if p != victim][0]
    th = threading.Thread(target=stream, args=(rec, H, "cut", 300, out))
    th.start()
    time.sleep(2.0)
    wid = gateway.find(listing(rec, HC), f"http://127.0.0.1:{busy_port}").id
    rec.log(f"DELETE /workers/<{busy_port}> -> {requests.delete(f'{GW}/workers/{wid}', headers=HC).status_code}")
    gateway.wait_for(lambda: gateway.find(gateway.list_workers(urllib_http, GW, KEYS),
                                          f"http://127.0.0.1:{busy_port}") is None, 15, 0.25)
    rec.log(f"replica {busy_port} removed, in flight {counts(busy_port)[1]}: SIGTERM to it now")
    twins[busy_port].stop()
    th.join()
    r = requests.post(GW + "/generate", headers=H, json={"text": "none left", "sampling_params": {"max_new_tokens": 2}})
    rec.log(f"POST /generate with no worker -> {r.status_code} {r.text[:200]}")

    # 6. add workers back: the key in the body, 202, pending, ready; a second add is 409
    twins[busy_port] = start_twin(busy_port, tmp, key)
    twins[busy_port].wait_ready()
    for port in (victim, busy_port):
        url = f"http://127.0.0.1:{port}"
        r = requests.post(GW + "/workers", headers=HC, json={"url": url, "api_key": key}, timeout=5)
        t_add = time.monotonic()
        rec.log(f"POST /workers {{url: {url}, api_key: <KEY>}} -> {r.status_code} {r.text}")
        rec.fixture("add_accepted.json", r.status_code, r.content)
        wid = gateway.parse_accepted(r.content, "POST")
        r = requests.get(f"{GW}/workers/{wid}", headers=HC)
        rec.log(f"GET /workers/<id> -> {r.status_code} {r.text[:300]}")
        if port == victim:
            rec.fixture("worker_pending.json", r.status_code, r.content)
        r = requests.post(GW + "/workers", headers=HC, json={"url": url, "api_key": key}, timeout=5)
        rec.log(f"POST /workers again -> {r.status_code} {r.text}")
        if port == victim:
            rec.fixture("add_conflict_in_progress.json", r.status_code, r.content)
        ok = gateway.wait_for(lambda: (w := gateway.find(gateway.list_workers(urllib_http, GW, KEYS), url))
                              and w.routable, 30, 0.1)
        rec.log(f"{url} routable {time.monotonic() - t_add:.2f}s after POST: {bool(ok)}")
    r = requests.post(GW + "/workers", headers=HC, json={"url": f"http://127.0.0.1:{victim}", "api_key": key})
    rec.log(f"POST /workers for a registered URL -> {r.status_code} {r.text}")
    rec.fixture("add_conflict_exists.json", r.status_code, r.content)
    r = requests.delete(f"{GW}/workers/00000000-0000-0000-0000-000000000000", headers=HC)
    rec.log(f"DELETE /workers/<unknown uuid> -> {r.status_code} {r.text}")
    rec.fixture("delete_unknown.json", r.status_code, r.content)
    r = requests.delete(f"{GW}/workers/not-a-uuid", headers=HC)
    rec.log(f"DELETE /workers/not-a-uuid -> {r.status_code} {r.text}")
    before = {p: counts(p)[0] for p in twins}
    for i in range(4):
        requests.post(GW + "/generate", headers=H, json={"text": f"back {i}", "sampling_params": {"max_new_tokens": 2}})
    rec.log("requests per replica after the adds:", {p: counts(p)[0] - before[p] for p in twins})
    metrics_fixture(rec, victim, "replica_metrics_idle.txt")

    # 7. an add without the key: smg accepts it, then cannot register the keyed replica
    wid = gateway.find(listing(rec, HC), f"http://127.0.0.1:{victim}").id
    requests.delete(f"{GW}/workers/{wid}", headers=HC)
    gateway.wait_for(lambda: gateway.find(gateway.list_workers(urllib_http, GW, KEYS),
                                          f"http://127.0.0.1:{victim}") is None, 15, 0.25)
    r = requests.post(GW + "/workers", headers=HC, json={"url": f"http://127.0.0.1:{victim}"})
    rec.log(f"POST /workers without api_key -> {r.status_code}")
    wid = gateway.parse_accepted(r.content, "POST")
    for wait in (1, 3, 4):
        time.sleep(wait)
        r = requests.get(f"{GW}/workers/{wid}", headers=HC)
        rec.log(f"GET /workers/<id> -> {r.status_code} {r.text[:400]}")
        if r.status_code == 200:
            rec.fixture("worker_pending_without_key.json", r.status_code, r.content)
    listing(rec, HC)
    r = requests.post(GW + "/workers", headers=HC, json={"url": f"http://127.0.0.1:{victim}", "api_key": key})
    rec.log(f"POST /workers with the key now -> {r.status_code} {r.text[:300]}")
    t_add = time.monotonic()
    ok = gateway.wait_for(lambda: (w := gateway.find(gateway.list_workers(urllib_http, GW, KEYS),
                                                     f"http://127.0.0.1:{victim}")) and w.routable, 30, 0.25)
    rec.log(f"routable {time.monotonic() - t_add:.2f}s later: {bool(ok)}")
    listing(rec, HC)


def metrics_fixture(rec: Recorder, port: int, name: str) -> None:
    r = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    if rec.fixtures:
        lines = [l for l in r.text.splitlines() if l.startswith(("# HELP sglang:num_", "# TYPE sglang:num_",
                                                                "sglang:num_running", "sglang:num_queue"))]
        (rec.fixtures / name).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
