"""The fleet rollout's logic and the isolated twins' parts, without a twin (docs/fleet.md):
batches, outcomes read from release records, stopping at the first failure (with a scripted pyinfra
and host store), bad input (exit 2, nothing run), the twin's HTTP proxy, the /30 allocation, the
names and files of an isolated twin. The real thing on three twins: tests/test_fleet_twin.py.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from checkout import settings
from dsv4deploy.cli import main as cli, fleet
from dsv4deploy.cli.settings import CHECKOUT
from dsv4deploy.profile.errors import ProfileError
from ct200twin.host import host_env, layout, netns, proxy, proxyctl
from ct200twin.host.errors import SimError
from ct200twin.host.twin_host import SimHost, existing_hosts

SIM = {"stand_ins": {"sglang": {}}, "weights_source": {"type": "rsync"}}


# --- batches and outcomes ------------------------------------------------------------------------

def test_the_canary_goes_first_then_the_rest_in_batches():
    hosts = [(f"h{i}", dict(SIM)) for i in range(1, 6)]
    assert fleet.plan_batches(hosts, 1) == [["h1"], ["h2"], ["h3"], ["h4"], ["h5"]]
    assert fleet.plan_batches(hosts, 2) == [["h1"], ["h2", "h3"], ["h4", "h5"]]
    assert fleet.plan_batches(hosts, 10) == [["h1"], ["h2", "h3", "h4", "h5"]]
    marked = [(n, {**d, "canary": n in ("h3", "h5")}) for n, d in hosts]
    assert fleet.plan_batches(marked, 2) == [["h3", "h5"], ["h1", "h2"], ["h4"]]
    assert fleet.plan_batches(marked, 1, canaries=["h2"]) == [["h2"], ["h1"], ["h3"], ["h4"], ["h5"]]
    assert fleet.plan_batches(hosts[:1], 3) == [["h1"]]
    with pytest.raises(ProfileError, match="--batch: must be at least 1"):
        fleet.plan_batches(hosts, 0)
    with pytest.raises(ProfileError, match="--canary nope: no such host"):
        fleet.plan_batches(hosts, 1, canaries=["nope"])


def test_data_words_are_checked_before_they_reach_pyinfra():
    assert fleet.data_args(["health_poll_s=0.5", "allow_reboot=true"]) == [
        "--data", "health_poll_s=0.5", "--data", "allow_reboot=true"]
    for bad, why in (("noequals", "expected key=value"), ("Key=1", "expected key=value"),
                     ("profile=x", "the profile is this command's first argument"),
                     ("x=a\nb", "contains a newline"), ("x=\u202e", "RIGHT-TO-LEFT")):
        with pytest.raises(ProfileError, match=why):
            fleet.data_args([bad])


def rec(n, profile, status, kind="deploy", restores=None, reason=None, tput=None):
    return {"release": n, "kind": kind, "profile": profile, "status": status, "restores": restores,
            "reason": reason, "gate": {"passed": status == "deployed", "level": "C=64", "output_throughput": tput}
            if tput else None}


def test_what_a_host_ended_on_is_read_from_its_records():
    good = [rec(1, "a", "deployed", tput=530.0)]
    ok = fleet.outcome("h", 0, "b", good, [rec(1, "a", "superseded"), rec(2, "b", "deployed", tput=529.9)])
    assert (ok.state, ok.release, ok.serving) == ("deployed", 2, "b")
    assert ok.detail == "release 0002 (b) deployed, gate passed: C=64 529.9 tok/s"
    early = rec(2, "b", "deployed", tput=529.9)
    early["gate"].update(passed_early=True, completed=64, num_prompts=128)
    assert fleet.outcome("h", 0, "b", good, [rec(1, "a", "superseded"), early]).detail == (
        "release 0002 (b) deployed, gate passed: C=64 529.9 tok/s (passed early: 64 of 128 requests)")
    same = fleet.outcome("h", 0, "a", good, good)
    assert same.state == "deployed" and "already serving a (release 0001), nothing changed" in same.detail
    rolled = fleet.outcome("h", 1, "b", good, [rec(1, "a", "superseded"), rec(2, "b", "failed", reason="gate: slow"),
                                                rec(3, "a", "deployed", kind="rollback", restores=1)])
    assert rolled.state == "failed" and (rolled.release, rolled.serving) == (3, "a")
    assert rolled.detail == ("release 0002 (b) failed: gate: slow; rolled back: release 0003 (restores 0001, "
                             "profile a) is serving")
    refused = fleet.outcome("h", 1, "b", good, good)
    assert refused.state == "failed" and refused.detail.startswith("no release recorded: refused")
    assert "serving release 0001 (a)" in refused.detail
    dead = fleet.outcome("h", 1, "b", [], [rec(1, "b", "failed", reason="crashed")])
    assert dead.state == "failed" and dead.detail.endswith("NOTHING IS SERVING")


class Hosts:
    """A scripted fleet: each host's release records, and a pyinfra that deploys or fails per host."""

    def __init__(self, names, fails=(), start="a"):
        self.recs = {n: [rec(1, start, "deployed", tput=530.0)] for n in names}
        self.fails = set(fails)
        self.runs: list[list[str]] = []
        self.reads: list[list[str]] = []

    def hosts_of(self, inventory):
        return [(n, dict(SIM)) for n in self.recs]

    def reader(self, inventory, names):
        self.reads.append(list(names))
        return {n: [dict(r) for r in self.recs[n]] for n in names}

    def runner(self, argv):
        limit = [argv[i + 1] for i, a in enumerate(argv) if a == "--limit"]
        profile = next(a.split("=", 1)[1] for a in argv if a.startswith("profile="))
        self.runs.append(limit)
        for n in limit:
            recs = self.recs[n]
            live = recs[-1]
            num = live["release"] + 1
            if n in self.fails:
                recs += [rec(num, profile, "failed", reason="smoke gate failed"),
                         rec(num + 1, live["profile"], "deployed", kind="rollback", restores=live["release"])]
            else:
                recs.append(rec(num, profile, "deployed", tput=531.0))
            for r in recs[:-1]:
                if r["status"] == "deployed":
                    r["status"] = "superseded"
        return 1 if self.fails & set(limit) else 0

    def run(self, **kw):
        return fleet.run_fleet(fleet.FleetRequest("nvfp4-ctx8k", "inv.py", **kw), settings(), say=lambda text: None,
                               effects=fleet.FleetEffects(hosts_of=self.hosts_of, reader=self.reader,
                                                          runner=self.runner))


def test_a_good_rollout_reaches_every_host_batch_by_batch():
    h = Hosts(["h1", "h2", "h3", "h4", "h5"])
    result = h.run(batch=2)
    assert result.exit_code == 0 and result.stopped_at is None
    assert h.runs == [["h1"], ["h2", "h3"], ["h4", "h5"]]
    assert {n: r.state for n, r in result.hosts.items()} == dict.fromkeys(h.recs, "deployed")
    lines = fleet.summary(result)
    assert lines[-1] == "fleet: nvfp4-ctx8k is deployed on all 5 host(s)"


def test_a_canary_that_fails_leaves_every_other_host_unread_and_untouched():
    h = Hosts(["h1", "h2", "h3"], fails=["h1"])
    result = h.run()
    assert result.exit_code == 1 and result.stopped_at == 0
    assert h.runs == [["h1"]] and h.reads == [["h1"], ["h1"]]        # never connected to h2, h3
    assert [r.state for r in result.hosts.values()] == ["failed", "untouched", "untouched"]
    assert "rolled back: release 0003 (restores 0001, profile a) is serving" in result.hosts["h1"].detail
    text = "\n".join(fleet.summary(result))
    assert "untouched        h2               batch 1   not deployed: the rollout stopped at the canary" in text
    assert "fleet: stopped at the canary; the hosts after it were not touched (exit 1)" in text
    assert result.as_dict()["hosts"]["h3"]["state"] == "untouched"


def test_the_first_failing_batch_stops_the_rollout():
    h = Hosts(["h1", "h2", "h3", "h4", "h5"], fails=["h3"])
    result = h.run(batch=2)
    assert result.exit_code == 1 and result.stopped_at == 1
    assert h.runs == [["h1"], ["h2", "h3"]]
    assert [r.state for r in result.hosts.values()] == ["deployed", "deployed", "failed", "untouched", "untouched"]
    assert "not deployed: the rollout stopped at batch 1" in "\n".join(fleet.summary(result))


def test_a_deploy_that_exits_non_zero_stops_even_if_the_records_look_fine():
    h = Hosts(["h1", "h2"])
    runner = h.runner
    h.runner = lambda argv: runner(argv) or 1
    result = h.run()
    assert result.exit_code == 1 and result.stopped_at == 0 and h.runs == [["h1"]]
    assert result.hosts["h1"].detail.endswith("(but the deploy exited 1)")


def test_a_run_the_inventory_refuses_is_bad_input_and_stops():
    h = Hosts(["h1", "h2"])
    h.runner = lambda argv: h.runs.append(argv) or 2                   # refused while loading: nothing changed
    result = h.run()
    assert result.exit_code == 2 and result.stopped_at == 0 and len(h.runs) == 1
    assert result.hosts["h1"].state == "refused" and result.hosts["h1"].detail.startswith("refused before any change")
    assert result.hosts["h2"].state == "untouched"


def test_an_unreadable_host_is_not_deployed():
    h = Hosts(["h1", "h2"])
    h.reader = lambda inv, names: {n: "cannot reach h1 over SSH: refused" for n in names}
    result = h.run()
    assert h.runs == [] and result.hosts["h1"].state == "unknown" and result.exit_code == 1


def test_a_placeholder_revision_is_refused_for_hosts_without_a_weights_stand_in():
    h = Hosts(["h1", "h2"])
    h.hosts_of = lambda inv: [("h1", {}), ("h2", {})]       # a real inventory: no stand-ins
    with pytest.raises(ProfileError, match="placeholder revision"):
        h.run()
    assert h.runs == [] and h.reads == []


def test_batch_argv_names_each_host_exactly():
    argv = fleet.batch_argv("/x/inv.py", "p", ["a-1", "b-2"], ["--data", "k=v"], CHECKOUT)
    assert argv[1:] == ["-y", "/x/inv.py", "deploy/serve.py", "--data", "profile=p", "--data", "k=v",
                        "--limit", "a-1", "--limit", "b-2"]
    assert fleet.batch_argv(str(CHECKOUT / "inventory/fleet-sim.py"), "p", ["a"], [], CHECKOUT)[2] == \
        "inventory/fleet-sim.py"


def test_the_command_refuses_bad_input_with_exit_2_and_runs_nothing(monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(fleet, "inventory_hosts", lambda inv: [("h1", dict(SIM)), ("h2", dict(SIM))])
    monkeypatch.setattr(fleet, "read_records", lambda *a: ran.append(a) or {})
    monkeypatch.setattr(fleet.subprocess, "run", lambda *a, **k: ran.append(a))
    for argv, why in ((["nope"], "no profile named 'nope'"), (["../x"], "profile '../x'"),
                      (["nvfp4-ctx8k", "--batch", "0"], "must be at least 1"),
                      (["nvfp4-ctx8k", "--canary", "h9"], "--canary h9: no such host"),
                      (["nvfp4-ctx8k", "--data", "profile=x"], "first argument")):
        assert cli.main(["fleet", "deploy", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert why in err and "Traceback" not in err, err
    assert ran == []
    assert cli.main(["fleet", "deploy", "nvfp4-ctx8k", "--plan", "--batch", "2"]) == 0
    assert "canary: h1; batch 1: h2" in capsys.readouterr().err and ran == []


def test_an_inventory_that_does_not_load_is_exit_1_without_a_traceback(tmp_path, capsys):
    assert cli.main(["fleet", "deploy", "nvfp4-ctx8k", "--inventory", str(tmp_path / "none.py")]) == 1
    err = capsys.readouterr().err
    assert "no such inventory file" in err and "Traceback" not in err


# --- the isolated twin's proxy -------------------------------------------------------------------

def test_the_proxy_refuses_loopback_other_ports_and_the_fleets_own_network():
    pol = proxy.Policy((80, 443), ["10.213.0.0/16", "192.0.2.2/32"])
    for host, port, why in (("127.0.0.1", 443, "loopback"), ("localhost", 443, "loopback"),
                            ("foo.localhost", 80, "loopback"), ("::1", 443, "loopback"),
                            ("::ffff:127.0.0.1", 443, "loopback"), ("169.254.1.1", 80, "loopback"),
                            ("10.213.0.1", 443, "fleet's own"), ("192.0.2.2", 443, "fleet's own"),
                            ("example.org", 22, "port 22 is not allowed"), ("example.org", 30000, "not allowed")):
        with pytest.raises(proxy.Refused, match=why):
            pol.destination(host, port)
    assert pol.destination("8.8.8.8", 443) == ("8.8.8.8", 443)
    assert proxy.split_host_port("[::1]:443", None) == ("::1", 443)
    assert proxy.split_host_port("deb.debian.org", 80) == ("deb.debian.org", 80)
    for bad in ("a:b", "a:0", "a:70000", "[::1", "[::1]x"):
        with pytest.raises(proxy.Refused):
            proxy.split_host_port(bad, 80)


class _Origin(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        body = json.dumps({"path": self.path, "headers": dict(self.headers)}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class _ToOrigin(proxy.Policy):
    """The rules, then every allowed destination sent to the local test origin (loopback is refused
    for real destinations: that is the point)."""

    def __init__(self, origin, **kw):
        super().__init__((80, 443), ["10.213.0.0/16"], **kw)
        self.origin = origin

    def destination(self, host, port):
        if host == "origin.test":
            return self.origin
        return super().destination(host, port)


@pytest.fixture
def origin():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Origin)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address
    srv.shutdown()


def _serve(policy, log):
    srv = proxy.Server(("127.0.0.1", 0), policy, log=log)
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return srv


def _ask(address, raw: bytes) -> bytes:
    with socket.create_connection(address, timeout=5) as s:
        s.sendall(raw)
        chunks = []
        while data := s.recv(65536):
            chunks.append(data)
    return b"".join(chunks)


def test_the_proxy_forwards_http_and_tunnels_connect(origin, tmp_path):
    log = open(tmp_path / "proxy.log", "w")
    srv = _serve(_ToOrigin(origin), log)
    try:
        got = _ask(srv.server_address, b"GET http://origin.test/debian/dists?x=1 HTTP/1.1\r\nHost: origin.test\r\n"
                                       b"Proxy-Connection: keep-alive\r\nProxy-Authorization: x\r\n\r\n")
        assert got.startswith(b"HTTP/1.0 200") or got.startswith(b"HTTP/1.1 200")
        seen = json.loads(got.split(b"\r\n\r\n", 1)[1])
        assert seen["path"] == "/debian/dists?x=1" and seen["headers"]["Connection"] == "close"
        assert "Proxy-Authorization" not in seen["headers"] and "Proxy-Connection" not in seen["headers"]
        with socket.create_connection(srv.server_address, timeout=5) as s:
            s.sendall(b"CONNECT origin.test:443 HTTP/1.1\r\nHost: origin.test:443\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 200 Connection established")
            s.sendall(b"GET /through HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            body = b""
            while data := s.recv(65536):
                body += data
        assert b'"path": "/through"' in body
        refused = _ask(srv.server_address, b"CONNECT 127.0.0.1:30000 HTTP/1.1\r\n\r\n")
        assert refused.startswith(b"HTTP/1.1 403") and b"port 30000 is not allowed" in refused
        assert _ask(srv.server_address, b"GET /relative HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 400")
        assert _ask(srv.server_address, b"nonsense\r\n\r\n").startswith(b"HTTP/1.1 400")
    finally:
        srv.shutdown()
        srv.server_close()
        log.close()
    text = (tmp_path / "proxy.log").read_text()
    assert "CONNECT origin.test:443 HTTP/1.1 ok" in text and "refused 403" in text


def test_the_proxy_chains_to_an_upstream_proxy(origin, tmp_path):
    log = open(tmp_path / "proxy.log", "w")
    upstream = _serve(_ToOrigin(origin), log)
    host, port = upstream.server_address
    front = _serve(proxy.Policy((80, 443), ["10.213.0.0/16"], upstream=f"http://{host}:{port}"), log)
    try:
        got = _ask(front.server_address, b"GET http://origin.test/up HTTP/1.1\r\nHost: origin.test\r\n\r\n")
        assert b'"path": "/up"' in got
        with socket.create_connection(front.server_address, timeout=5) as s:
            s.sendall(b"CONNECT origin.test:443 HTTP/1.1\r\n\r\n")
            assert s.recv(100).startswith(b"HTTP/1.1 200")
        # what can be judged without resolving is still refused before the upstream sees it
        assert _ask(front.server_address, b"CONNECT localhost:443 HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 403")
    finally:
        for srv in (front, upstream):
            srv.shutdown()
            srv.server_close()
        log.close()


def test_stop_never_signals_a_process_its_record_does_not_match(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record = tmp_path / "proxy.json"
        from ct200twin.host.processes import _proc_stat
        start = _proc_stat(sleeper.pid)[1]
        # Popen returns when exec closes its close-on-exec pipe, which the kernel does before it
        # lays out the new argv: under load /proc/PID/cmdline reads empty for a few ms (CI saw it)
        deadline = time.monotonic() + 10
        while proxyctl._cmdline(sleeper.pid) != sleeper.args and time.monotonic() < deadline:
            time.sleep(0.01)
        for wrong in ({"pid": sleeper.pid, "starttime": start, "argv": ["python", "-m", proxyctl.MODULE]},
                      {"pid": sleeper.pid, "starttime": start + 1, "argv": sleeper.args},
                      {"pid": 1, "starttime": 0, "argv": []}, {"pid": "1"}):
            record.write_text(json.dumps(wrong))
            assert proxyctl.stop(record) is False and not record.exists()
            assert sleeper.poll() is None
        record.write_text(json.dumps({"pid": sleeper.pid, "starttime": start, "argv": sleeper.args}))
        assert proxyctl.stop(record) is True and sleeper.wait(5) is not None
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


# --- an isolated twin's network, names and files -------------------------------------------------

@pytest.fixture
def sim_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4_SIM_DIR", str(tmp_path / "sim"))
    monkeypatch.delenv("DSV4_SIM_FLEET_NET", raising=False)
    return tmp_path / "sim"


def test_a_twin_gets_a_free_30_and_keeps_it_while_it_is_free(sim_dir, monkeypatch):
    import ipaddress
    used = [ipaddress.IPv4Network("10.213.0.0/30"), ipaddress.IPv4Network("192.0.2.0/24")]
    monkeypatch.setattr(netns, "used_networks", lambda: list(used))
    monkeypatch.setattr(netns, "present", lambda rec: False)
    path = sim_dir / "hosts/f-1/net.json"
    a = netns.allocate(path, "f", 1, "abc123", taken=[])
    assert (a["host_ip"], a["twin_ip"], a["prefix"]) == ("10.213.0.5", "10.213.0.6", 30)
    assert (a["netns"], a["veth"], a["peer"]) == ("dsv4-f-1-abc123", "dvabc1231", "host0")
    b = netns.allocate(sim_dir / "hosts/f-2/net.json", "f", 2, "abc123", taken=[netns.subnet_of(a)])
    assert b["host_ip"] == "10.213.0.9"
    assert netns.allocate(path, "f", 1, "abc123", taken=[netns.subnet_of(b)]) == a     # kept: still free
    used.append(ipaddress.IPv4Network("10.213.0.4/30"))                                # someone took it
    c = netns.allocate(path, "f", 1, "abc123", taken=[netns.subnet_of(b)])
    assert c["host_ip"] == "10.213.0.13" and json.loads(path.read_text()) == c
    monkeypatch.setenv("DSV4_SIM_FLEET_NET", "10.99.0.0/30")
    used.append(ipaddress.IPv4Network("10.99.0.0/30"))
    with pytest.raises(SimError, match="no free /30 left in 10.99.0.0/30"):
        netns.allocate(sim_dir / "hosts/f-3/net.json", "f", 3, "abc123", taken=[])
    for bad in ("8.8.8.0/24", "127.0.0.0/8", "10.0.0.0/31", "nonsense"):
        monkeypatch.setenv("DSV4_SIM_FLEET_NET", bad)
        with pytest.raises(SimError) as exc:
            netns.pool()
        assert exc.value.exit_code == 2


def test_a_network_record_that_names_anything_else_is_refused(sim_dir):
    path = sim_dir / "net.json"
    path.parent.mkdir(parents=True)
    good = {"netns": "dsv4-f-1-abc123", "veth": "dvabc1231", "peer": "host0", "host_ip": "10.213.0.1",
            "twin_ip": "10.213.0.2", "prefix": 30}
    path.write_text(json.dumps(good))
    assert netns.read_record(path) == good
    for key, value in (("netns", "x; rm -rf /"), ("veth", "eth0"), ("peer", "lo"), ("twin_ip", "a"), ("prefix", 24)):
        path.write_text(json.dumps({**good, key: value}))
        with pytest.raises(SimError, match="not a network record this tool wrote"):
            netns.read_record(path)


def test_fleet_names_and_the_inventory_entry(sim_dir):
    for bad in ("twin", "Fleet", "1f", "a-b", "averyverylongname", "", None):
        with pytest.raises(SimError):
            layout.check_fleet(bad)
    h = SimHost(2, "ft")
    assert (h.name, h.isolated) == ("ft-2", True)
    assert h.machine == f"ft-2-{layout.fleet_tag('ft')}" and h.machine != SimHost(2, "ft2").machine
    with pytest.raises(SimError, match="has no address yet"):
        h.address
    h.dir.mkdir(parents=True)
    h.net_file.write_text(json.dumps({**netns.names("ft", 2, layout.fleet_tag("ft")), "host_ip": "10.213.0.5",
                                      "twin_ip": "10.213.0.6", "prefix": 30}))
    name, data = h.inventory_entry()
    assert name == "ft-2" and data["ssh_hostname"] == "10.213.0.6" and data["sim_fleet"] == "ft"
    assert data["ssh_strict_host_key_checking"] == "yes"
    (sim_dir / "hosts/twin-1").mkdir()
    assert existing_hosts("ft") == [h] and existing_hosts() == [SimHost(1)]
    assert SimHost(1).inventory_entry()[0] == "127.0.0.2"      # the default twins are as they were


def test_an_isolated_twin_is_pointed_at_its_proxy(tmp_path):
    root = tmp_path / "root"
    (root / "etc/apt/apt.conf.d").mkdir(parents=True)
    (root / "etc/apt/apt.conf.d/50dsv4deploy-host-proxy").write_text('Acquire::http::Proxy "http://127.0.0.1:9";\n')
    (root / "etc/pip.conf").write_text("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n")
    (root / "etc/environment").write_text('PIP_CERT="x"\nhttp_proxy="http://127.0.0.1:9"\n')
    host_env._isolated_environment(root, "http://10.213.0.1:3128", direct=("10.213.0.1", netns.LAN_NAME))
    apt = (root / "etc/apt/apt.conf.d/60dsv4deploy-fleet-proxy").read_text()
    assert 'Acquire::https::Proxy "http://10.213.0.1:3128";' in apt
    assert not (root / "etc/apt/apt.conf.d/50dsv4deploy-host-proxy").exists()
    pip = (root / "etc/pip.conf").read_text()
    assert "proxy = http://10.213.0.1:3128" in pip and "cert = /etc/ssl/certs/ca-certificates.crt" in pip
    env = (root / "etc/environment").read_text().splitlines()
    assert 'PIP_CERT="x"' in env and 'https_proxy="http://10.213.0.1:3128"' in env
    assert 'http_proxy="http://127.0.0.1:9"' not in env
    # this machine's end of the veth (its address and its name there) is the twin's LAN: reached
    # directly, as the proxy refuses this machine's addresses (a local hub is reached so)
    assert 'no_proxy="localhost,127.0.0.1,::1,10.213.0.1,sim-host"' in env


def test_the_sim_commands_take_a_fleet(sim_dir, monkeypatch, capsys):
    from ct200twin import cli as simcli
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert simcli.main(["up", "--fleet", "twin"]) == 2
    assert "not 'twin'" in capsys.readouterr().err
    assert simcli.main(["status", "--isolated"]) == 0
    assert "no twins in fleet fleet" in capsys.readouterr().out
    assert simcli.main(["down", "--fleet", "ft"]) == 1
    assert "needs root" in capsys.readouterr().err
