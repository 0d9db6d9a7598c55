#!/usr/bin/env python3
"""How smg's policies spread load over two local twin servers (127.0.0.1:31001/31002, the gateway
on :31000): 64 requests at C=32, with distinct prompts and with a shared 580-character prefix.
docs/replicas.md quotes it.

    .venv/bin/python tests/tools/smg_policy.py .cache/smg-venv/bin/python cache_aware round_robin power_of_two
"""
import os, random, string, subprocess, sys, tempfile, time, signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import requests
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO)); sys.path.insert(0, str(REPO / "tests" / "tools"))
from dsv4deploy.gateway import model as gateway
from smg_measure import start_twin, counts, urllib_http
key = "sk-policy-test-1234"; H = {"Authorization": f"Bearer {key}"}
tmp = Path(tempfile.mkdtemp()); (tmp/"c").mkdir(); (tmp/"c"/gateway.KEY_CREDENTIAL).write_text(key)
control = "sk-policy-control-5678"; (tmp/"c"/gateway.CONTROL_CREDENTIAL).write_text(control)   # /workers only
twins = {p: start_twin(p, tmp, key) for p in (31001, 31002)}
import atexit; atexit.register(lambda: [t.stop() for t in twins.values()])
for t in twins.values(): t.wait_ready()
for policy in sys.argv[2:]:
    flags = gateway.launch_flags([t.url for t in twins.values()], "127.0.0.1", 31000, policy, 31009, "/ready", 5)
    proc = subprocess.Popen(gateway.launcher_argv(sys.argv[1], str(REPO / "dsv4deploy" / "gateway" / "launcher.py"), flags, True),
                            stdout=open(tmp/"smg.log","w"), stderr=subprocess.STDOUT, env={**os.environ, "CREDENTIALS_DIRECTORY": str(tmp/"c")})
    def listed():
        try:
            return len(gateway.list_workers(urllib_http, "http://127.0.0.1:31000", control)) == 2
        except gateway.GatewayError:
            return False
    assert gateway.wait_for(listed, 30, 0.2)
    time.sleep(0.5)
    for label, prompt in (("distinct", lambda i: "".join(random.choices(string.ascii_lowercase + " ", k=400))),
                          ("shared prefix", lambda i: "You are a helpful assistant. " * 20 + f"question {i}")):
        before = {p: counts(p)[0] for p in twins}
        def one(i):
            return requests.post("http://127.0.0.1:31000/generate", headers=H, timeout=120,
                                 json={"text": prompt(i), "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}}).status_code
        t0 = time.monotonic()
        with ThreadPoolExecutor(32) as ex: codes = list(ex.map(one, range(64)))
        print(f"{policy:12} {label:14} 64 requests, C=32: per replica {{{', '.join(f'{p}: {int(counts(p)[0]-before[p])}' for p in twins)}}} "
              f"in {time.monotonic()-t0:.1f}s, statuses {sorted(set(codes))}", flush=True)
    proc.send_signal(signal.SIGTERM); proc.wait(30)
for t in twins.values(): t.stop()
