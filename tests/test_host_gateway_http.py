"""The gateway's HTTP callable that runs on the host: each key is swapped in on the host, from its
0600 file, and is in no argv; the control-plane key authenticates /workers and the inference key
rides in the body of an add; answers and transport failures come back as gateway.py expects."""

from __future__ import annotations

import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dsv4deploy.gateway import model as gateway
from dsv4deploy.host.gateway_http import CONTROL_KEY, KEY, key_files, parse_answer, request_command

SECRET = "k3y-Abc_123"
CONTROL_SECRET = "c0ntrol-Xyz_789"


class _Handler(BaseHTTPRequestHandler):
    seen: list = []
    accepts = SECRET       # the key /workers takes (smg with control-plane keys: only those)

    def _answer(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.seen.append((self.command, self.path, self.headers.get("Authorization"), body))
        if self.headers.get("Authorization") != f"Bearer {self.accepts}":
            self.send_response(401)
            self.end_headers()
            self.wfile.write(b'{"error": {"code": "invalid_api_key", "message": "Invalid API key"}}')
            return
        self.send_response(200 if self.command == "GET" else 202)
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(json.dumps({"workers": [{"id": "w1", "url": "http://127.0.0.1:30001",
                                                      "status": "ready", "is_healthy": True, "load": 0}],
                                         "total": 1}).encode())
        else:
            self.wfile.write(json.dumps({"status": "accepted", "worker_id": "w2"}).encode())

    do_GET = do_POST = _answer

    def log_message(self, *a):
        pass


@pytest.fixture()
def server():
    _Handler.seen, _Handler.accepts = [], SECRET
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def local_http(key_file):
    """The callable as host_http builds it, with the shell run here instead of over SSH; KEY_FILE:
    the inference key's file, or request_command's placeholder -> files."""
    files = key_file if isinstance(key_file, dict) else {KEY: [key_file]} if key_file else {}

    def http(method, url, headers, body, timeout):
        cmd = request_command(method, url, headers, body, timeout, files)
        assert SECRET not in cmd and CONTROL_SECRET not in cmd
        out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=60).stdout
        return parse_answer(out)
    return http


def test_the_key_is_read_on_the_host_and_swapped_into_headers_and_body(server, tmp_path):
    key_file = tmp_path / "api-key"
    key_file.write_text(SECRET + "\n")
    key_file.chmod(0o600)
    http = local_http(str(key_file))
    workers = gateway.list_workers(http, server, KEY)
    assert [(w.id, w.url, w.routable) for w in workers] == [("w1", "http://127.0.0.1:30001", True)]
    assert gateway.add_worker(http, server, KEY, "http://127.0.0.1:30002") == "w2"
    method, path, auth, body = _Handler.seen[-1]
    assert (method, path, auth) == ("POST", "/workers", f"Bearer {SECRET}")
    assert json.loads(body) == {"url": "http://127.0.0.1:30002", "api_key": SECRET}


def test_a_wrong_key_is_the_gateways_error_not_a_crash(server, tmp_path):
    key_file = tmp_path / "api-key"
    key_file.write_text("wrong\n")
    with pytest.raises(gateway.GatewayError, match="401"):
        gateway.list_workers(local_http(str(key_file)), server, KEY)


def test_nothing_listening_is_an_oserror(tmp_path):
    with pytest.raises(OSError):
        local_http(None)("GET", "http://127.0.0.1:9/workers", {}, None, 2)


def test_a_module_in_the_working_directory_never_sees_the_key(server, tmp_path, monkeypatch):
    """Root runs the callable from the SSH login's directory: a json.py planted there, or a
    PYTHONPATH the login sets, is not what the program imports (it runs isolated: -I -S)."""
    key_file = tmp_path / "api-key"
    key_file.write_text(SECRET + "\n")
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "json.py").write_text(f"open({str(tmp_path / 'stolen')!r}, 'w').write('imported')\n"
                                     "raise SystemExit(9)\n")
    monkeypatch.chdir(planted)
    monkeypatch.setenv("PYTHONPATH", str(planted))
    workers = gateway.list_workers(local_http(str(key_file)), server, KEY)
    assert [w.id for w in workers] == ["w1"] and not (tmp_path / "stolen").exists()


def _two_keys(tmp_path) -> dict:
    (tmp_path / "api-key").write_text(SECRET + "\n")
    (tmp_path / "control-key").write_text(CONTROL_SECRET + "\n")
    return key_files(str(tmp_path / "api-key"), str(tmp_path / "control-key"))


def test_the_control_key_opens_workers_and_the_inference_key_rides_in_the_body(server, tmp_path):
    _Handler.accepts = CONTROL_SECRET
    http = local_http(_two_keys(tmp_path))
    keys = gateway.Keys(control=CONTROL_KEY, worker=KEY)
    assert [w.id for w in gateway.list_workers(http, server, keys)] == ["w1"]
    assert gateway.add_worker(http, server, keys, "http://127.0.0.1:30002") == "w2"
    method, path, auth, body = _Handler.seen[-1]
    assert (method, path, auth) == ("POST", "/workers", f"Bearer {CONTROL_SECRET}")
    assert json.loads(body) == {"url": "http://127.0.0.1:30002", "api_key": SECRET}
    assert all(a != f"Bearer {SECRET}" for _, _, a, _ in _Handler.seen)   # the inference key never opened /workers


def test_a_gateway_started_before_the_control_key_gets_the_inference_key_after_a_401(server, tmp_path):
    """A set deployed with one key: its running gateway takes the inference key on /workers until
    the deploy restarts it with the two credentials."""
    _Handler.accepts = SECRET
    http = local_http(_two_keys(tmp_path))
    assert [w.id for w in gateway.list_workers(http, server, gateway.Keys(CONTROL_KEY, KEY))] == ["w1"]
    assert [a for _, _, a, _ in _Handler.seen] == [f"Bearer {CONTROL_SECRET}", f"Bearer {SECRET}"]
