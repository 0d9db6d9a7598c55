"""host/checks.py: the rollback's generation probe and the health wait with its identity check,
as the commands they send, run here with `sh -c` against a loopback HTTP server standing in for
SGLang (`systemctl` and `ss` answered by small scripts on PATH), and their answers judged."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dsv4deploy.render import layout
from dsv4deploy.sglang.health import HealthError
from dsv4deploy.host import checks
from dsv4deploy.host.checks import PROBE_MARK, probe_command, probe_problems
from checkout import load_profile
from dsv4deploy.release.rollout import Target

KEY = "sk-probe-test"


class Generate(BaseHTTPRequestHandler):
    in_flight = 0
    most = 0
    auth: list[str] = []
    lock = threading.Lock()
    server_info: dict = {}

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path == "/health":
            body = b""
        elif self.path == "/server_info" and self.headers.get("Authorization") == f"Bearer {KEY}":
            body = json.dumps(type(self).server_info).encode()
        else:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802 - http.server's name
        cls = type(self)
        with cls.lock:
            cls.in_flight += 1
            cls.most = max(cls.most, cls.in_flight)
            cls.auth.append(self.headers.get("Authorization", ""))
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(0.3)                                   # a short generation
        out = json.dumps({"text": "x", "meta_info": {"completion_tokens": body["sampling_params"]["max_new_tokens"]}})
        with cls.lock:
            cls.in_flight -= 1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(out.encode())

    def log_message(self, *args):
        pass


@pytest.fixture()
def target(tmp_path, monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Generate)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(layout, "ETC", str(tmp_path))
    data = load_profile("nvfp4-ctx8k").data
    data["server"]["port"] = server.server_address[1]
    t = Target.of(data)
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / f"{t.layout.service}-api-key").write_text(KEY + "\n")
    yield t
    server.shutdown()


def test_the_probe_sends_its_requests_at_once_with_the_key_and_reads_every_answer(target):
    Generate.most, Generate.auth = 0, []
    out = subprocess.run(["sh", "-c", probe_command(target, requests=3, tokens=8)], capture_output=True,
                         text=True, timeout=30).stdout
    assert probe_problems(out, requests=3, tokens=8) == []
    assert Generate.most == 3                                        # in flight together: one generation's time
    assert Generate.auth == [f"Bearer {KEY}"] * 3
    assert KEY not in probe_command(target)                          # read on the host, never on a command line


def test_each_bad_answer_is_named():
    out = (f"{PROBE_MARK} 1\n" + json.dumps({"meta_info": {"completion_tokens": 8}}) + "\n"
           f"{PROBE_MARK} 2\n" + json.dumps({"meta_info": {"completion_tokens": 3}}) + "\n"
           f"{PROBE_MARK} 3\nInternal Server Error\n")
    assert probe_problems(out, requests=4, tokens=8) == [
        "probe request 2/4 returned 3 tokens, expected 8",
        "probe request 3/4 failed: Internal Server Error",
        "probe request 4/4 failed: no answer"]


SHIMS = {
    # the unit's state (observe_command) and its MainPID alone (identity_command)
    "systemctl": 'case "$*" in *--value*) echo "$MAIN_PID";; '
                 '*) printf "ActiveState=active\\nSubState=running\\nMainPID=%s\\nNRestarts=0\\n" "$MAIN_PID";; esac',
    "ss": 'echo "LISTEN 0 128 127.0.0.1:30000 0.0.0.0:* users:((\\"python\\",pid=$PORT_PID,fd=7))"',
}


@pytest.fixture()
def on_host(tmp_path, monkeypatch):
    """checks.sh running each command here with the shims first on PATH; the commands it got."""
    for name, body in SHIMS.items():
        (tmp_path / name).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / name).chmod(0o755)
    sent: list[str] = []
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "MAIN_PID": "4242", "PORT_PID": "4242"}

    def sh(h, command, timeout=None):
        sent.append(command)
        out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30, env=env)
        return out.returncode == 0, out.stdout
    monkeypatch.setattr(checks, "sh", sh)
    return env, sent


def test_the_poll_that_sees_health_proves_the_server_is_this_releases_in_the_same_command(target, on_host):
    env, sent = on_host
    Generate.server_info = dict(target.expected_server_info)
    checks.confirm(None, target, budget_s=10, poll_s=0.5)
    assert len(sent) == 1                                            # health and identity: one round trip
    assert KEY not in sent[0]

    env["PORT_PID"] = "999"                                          # a stale server holds the port
    with pytest.raises(HealthError, match="held by PID 999, not by the unit's MainPID 4242"):
        checks.confirm(None, target, budget_s=10, poll_s=0.5)
    env["PORT_PID"] = "4242"
    Generate.server_info = {**target.expected_server_info, "tp_size": 1}    # another release's args
    with pytest.raises(HealthError, match="/server_info tp_size is 1, expected 4"):
        checks.confirm(None, target, budget_s=10, poll_s=0.5)


def test_a_journal_line_of_16_kb_is_cut_so_the_reason_above_it_stays_readable(monkeypatch):
    from dsv4deploy.host import checks
    server_args = "server_args=ServerArgs(" + "x" * 16500 + ")"
    monkeypatch.setattr(checks, "sh", lambda h, cmd: (True, f"Loading weights\n{server_args}\nbind failed\n"))
    tail = checks.journal_tail(None, Target.of(load_profile("nvfp4-ctx8k").data)).splitlines()
    assert tail[0] == "Loading weights" and tail[2] == "bind failed"
    assert tail[1].startswith("server_args=ServerArgs(xxx") and tail[1].endswith(" ... (16524 characters)")
    assert len(tail[1]) < 500


def test_what_the_server_wrote_to_its_journal_cannot_drive_the_operators_terminal(monkeypatch):
    """Model code runs in the server and writes its journal: a line that clears the screen or
    rewrites itself with a carriage return is shown escaped, on its own line; tabs stay."""
    from dsv4deploy.host import checks
    journal = "Loading weights\n\x1b[2J\x1b]0;owned\x07ok\n50%\rdone\u202etxt.exe\n\tat line 3\n"
    monkeypatch.setattr(checks, "sh", lambda h, cmd: (True, journal))
    tail = checks.journal_tail(None, Target.of(load_profile("nvfp4-ctx8k").data))
    assert tail.split("\n") == ["Loading weights", "\\x1b[2J\\x1b]0;owned\\x07ok", "50%\\rdone\\u202etxt.exe",
                                 "\tat line 3"]
    assert tail.replace("\n", "").replace("\t", "").isprintable()


def test_a_probe_answer_is_quoted_escaped():
    out = (f"{PROBE_MARK} 1\n\x1b[31mInternal Server Error\x1b[0m\n"
           f"{PROBE_MARK} 2\n" + json.dumps({"meta_info": {"completion_tokens": "8\x1b[2J"}}) + "\n")
    assert probe_problems(out, requests=2, tokens=8) == [
        "probe request 1/2 failed: \\x1b[31mInternal Server Error\\x1b[0m",
        "probe request 2/2 returned 8\\x1b[2J tokens, expected 8"]


def test_a_unit_that_fails_while_the_host_polls_ends_the_window_at_once(tmp_path):
    """The window's loop reads the unit's state every few polls, not only at its end: a crash
    during a 30 s window answers within a few seconds, with the state read after it."""
    import socket
    data = load_profile("nvfp4-ctx8k").data
    with socket.socket() as free:                        # nothing listens on its port: curl says 000
        free.bind(("127.0.0.1", 0))
        data["server"]["port"] = free.getsockname()[1]
    t = Target.of(data)
    shim = tmp_path / "systemctl"
    shim.write_text("#!/bin/sh\nif [ -e \"$(dirname \"$0\")/crashed\" ]; then s=failed; else s=activating; fi\n"
                    "printf 'ActiveState=%s\\nSubState=x\\nMainPID=7\\nNRestarts=0\\n' \"$s\"\n")
    shim.chmod(0o755)
    threading.Timer(0.5, lambda: (tmp_path / "crashed").touch()).start()
    start = time.monotonic()
    out = subprocess.run(["sh", "-c", checks.observe_command(t, window_s=30)], capture_output=True, text=True,
                         timeout=60, env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    obs = checks.parse_observation(out.stdout)
    assert obs.active_state == "failed" and obs.http == 0
    assert time.monotonic() - start < 10
