"""The smg worker API client against answers recorded from the real smg 1.13.0
(tests/fixtures/smg/, written by tests/tools/smg_measure.py): parsing, the add/remove calls,
and the drain a rolling update runs, on a scripted HTTP callable and a fake clock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4deploy.gateway import model as gateway
from dsv4deploy.gateway.model import GatewayError

FIXTURES = Path(__file__).parent / "fixtures" / "smg"
GW = "http://127.0.0.1:30000"
KEY = "sk-test-key"


def fixture(name: str) -> tuple[int, bytes]:
    doc = json.loads((FIXTURES / name).read_text())
    return doc["status"], json.dumps(doc["body"]).encode()


def body(name: str) -> bytes:
    return fixture(name)[1]


class Script:
    """An HTTP callable answering from a list of (method, part of the url, (status, body)); records calls."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.calls = []

    def __call__(self, method, url, headers, data, timeout):
        self.calls.append((method, url, dict(headers), data))
        want_method, suffix, answer = self.answers.pop(0)
        assert (method, suffix in url) == (want_method, True), (method, url, want_method, suffix)
        if isinstance(answer, Exception):
            raise answer
        return answer


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


# --- parsing what smg answers ----------------------------------------------------------------------

def test_two_registered_replicas_parse_as_routable_workers():
    workers = gateway.parse_workers(body("workers_two_ready.json"))
    assert sorted(w.url for w in workers) == ["http://127.0.0.1:31001", "http://127.0.0.1:31002"]
    assert all(w.routable and w.status == "ready" for w in workers)


def test_a_draining_worker_is_listed_but_not_routable_and_shows_its_in_flight_request():
    workers = {w.url: w for w in gateway.parse_workers(body("workers_one_draining.json"))}
    draining = [w for w in workers.values() if w.status == "draining"]
    assert len(draining) == 1 and not draining[0].routable and not draining[0].healthy
    assert draining[0].load == 1
    assert sum(w.routable for w in workers.values()) == 1


def test_after_the_settle_time_the_removed_worker_is_gone_from_the_list():
    assert len(gateway.parse_workers(body("workers_one_removed.json"))) == 1


def test_accepted_answers_give_the_worker_id():
    for name in ("add_accepted.json", "delete_accepted.json"):
        status, data = fixture(name)
        assert status == 202
        wid = gateway.parse_accepted(data, name)
        assert wid == json.loads(data)["worker_id"]


def test_a_pending_worker_parses_with_its_status():
    """A worker smg still adds (its `job_status` entry) is listed, but not routable yet."""
    w = gateway.parse_workers(json.dumps({"workers": [json.loads(body("worker_pending.json"))]}).encode())[0]
    assert w.status == "pending" and not w.routable


@pytest.mark.parametrize("name,status,code", [
    ("add_conflict_in_progress.json", 409, "WORKER_CREATE_IN_PROGRESS"),
    ("add_conflict_exists.json", 409, "WORKER_ALREADY_EXISTS"),
    ("delete_unknown.json", 404, "WORKER_NOT_FOUND"),
    ("workers_no_key.json", 401, "invalid_api_key"),
    ("workers_wrong_key.json", 401, "invalid_api_key"),
])
def test_both_error_shapes_give_message_and_code(name, status, code):
    got_status, data = fixture(name)
    message, got_code = gateway.error_text(data)
    assert (got_status, got_code) == (status, code) and message


@pytest.mark.parametrize("data", [b"<html>", b"[]", b'{"workers": 3}', b'{"workers": [{"id": "x y", "url": "http://a", "status": "ready"}]}',
                                  b'{"workers": [{"id": "a", "url": "file:///etc/passwd", "status": "ready"}]}',
                                  b'{"workers": [{"id": "a", "url": "http://a"}]}'])
def test_a_malformed_listing_is_a_gateway_error(data):
    with pytest.raises(GatewayError):
        gateway.parse_workers(data)


def test_a_202_without_an_id_is_refused():
    with pytest.raises(GatewayError):
        gateway.parse_accepted(b'{"status": "accepted"}', "POST /workers")


def test_replica_metrics_give_running_plus_queued():
    assert gateway.replica_in_flight((FIXTURES / "replica_metrics_busy.txt").read_text()) == 1
    assert gateway.replica_in_flight((FIXTURES / "replica_metrics_idle.txt").read_text()) == 0
    two_ranks = ('sglang:num_running_reqs{tp_rank="0"} 3.0\nsglang:num_running_reqs{tp_rank="1"} 2.0\n'
                 'sglang:num_queue_reqs{tp_rank="0"} 4.0\n')
    assert gateway.replica_in_flight(two_ranks) == 9
    assert gateway.replica_in_flight("# no sglang gauges here\nprocess_cpu_seconds_total 3\n") is None


# --- the calls -------------------------------------------------------------------------------------

def test_add_worker_puts_the_key_in_header_and_body_never_in_the_url():
    http = Script([("POST", "/workers", fixture("add_accepted.json"))])
    wid = gateway.add_worker(http, GW, KEY, "http://127.0.0.1:30001", drain_settle_s=30)
    method, url, headers, data = http.calls[0]
    assert wid == json.loads(body("add_accepted.json"))["worker_id"]
    assert KEY not in url and headers["Authorization"] == f"Bearer {KEY}"
    assert json.loads(data) == {"url": "http://127.0.0.1:30001", "api_key": KEY, "health": {"drain_settle_secs": 30}}


def test_add_worker_conflict_is_an_error_with_smgs_code():
    http = Script([("POST", "/workers", fixture("add_conflict_exists.json"))])
    with pytest.raises(GatewayError) as exc:
        gateway.add_worker(http, GW, KEY, "http://127.0.0.1:30001")
    assert exc.value.status == 409 and exc.value.code == "WORKER_ALREADY_EXISTS"


def test_remove_worker_refuses_anything_but_an_id():
    http = Script([])
    for bad in ("../../v1/models", "a/b", "", "x?y=1"):
        with pytest.raises(GatewayError):
            gateway.remove_worker(http, GW, KEY, bad)
    assert http.calls == []


def test_no_answer_is_a_gateway_error_naming_the_call():
    http = Script([("GET", "/workers", ConnectionRefusedError(111, "refused"))])
    with pytest.raises(GatewayError, match="GET http://127.0.0.1:30000/workers: no answer"):
        gateway.list_workers(http, GW, KEY)


def test_a_wrong_key_is_reported_not_parsed_as_a_list():
    http = Script([("GET", "/workers", fixture("workers_wrong_key.json"))])
    with pytest.raises(GatewayError, match="401: Invalid API key"):
        gateway.list_workers(http, GW, KEY)


# --- the drain -------------------------------------------------------------------------------------

REPLICA = "http://127.0.0.1:31001"
BUSY = (200, (FIXTURES / "replica_metrics_busy.txt").read_bytes())
IDLE = (200, (FIXTURES / "replica_metrics_idle.txt").read_bytes())


def test_drain_removes_waits_until_smg_drops_it_then_until_the_replica_is_idle():
    http = Script([("GET", "/workers", fixture("workers_two_ready.json")),
                   ("DELETE", "/workers/" + _id(REPLICA, "workers_two_ready.json"), fixture("delete_accepted.json")),
                   ("GET", "/workers", fixture("workers_one_draining.json")),
                   ("GET", "/workers", fixture("workers_one_removed.json")),
                   ("GET", "31001/metrics", BUSY), ("GET", "31001/metrics", BUSY), ("GET", "31001/metrics", IDLE)])
    clock = Clock()
    done = gateway.drain(http, GW, KEY, REPLICA, timeout_s=60, poll_s=1, clock=gateway.Clock(clock, clock.sleep))
    assert done == gateway.Drained(removed_s=1.0, idle_s=3.0, in_flight=0)
    assert not http.answers


def test_drain_gives_up_on_a_busy_replica_after_the_budget_and_says_how_many_are_left():
    http = Script([("GET", "/workers", fixture("workers_one_removed.json"))] + [("GET", "/metrics", BUSY)] * 11)
    clock = Clock()
    done = gateway.drain(http, GW, KEY, REPLICA, timeout_s=10, poll_s=1, clock=gateway.Clock(clock, clock.sleep))
    assert done.idle_s is None and done.in_flight == 1 and done.removed_s == 0


def test_drain_fails_when_smg_keeps_listing_the_replica():
    http = Script([("GET", "/workers", fixture("workers_two_ready.json")),
                   ("DELETE", "/workers/", fixture("delete_accepted.json"))]
                  + [("GET", "/workers", fixture("workers_one_draining.json"))] * 6)
    clock = Clock()
    with pytest.raises(GatewayError, match="still listed"):
        gateway.drain(http, GW, KEY, REPLICA, timeout_s=5, poll_s=1, clock=gateway.Clock(clock, clock.sleep))


def test_drain_needs_the_replicas_metrics():
    http = Script([("GET", "/workers", fixture("workers_one_removed.json")),
                   ("GET", "/metrics", (200, b"# metrics off\n"))])
    with pytest.raises(GatewayError, match="enable_metrics"):
        gateway.drain(http, GW, KEY, REPLICA, timeout_s=5, poll_s=1, clock=gateway.Clock(Clock(), lambda s: None))


def test_readmit_adds_the_replica_and_waits_until_it_is_routable():
    pending = json.loads(body("workers_one_removed.json"))
    pending["workers"].append({**json.loads(body("worker_pending.json")), "url": REPLICA})
    ready = body("workers_two_ready.json")
    http = Script([("GET", "/workers", fixture("workers_one_removed.json")),
                   ("POST", "/workers", fixture("add_accepted.json")),
                   ("GET", "/workers", (200, json.dumps(pending).encode())),
                   ("GET", "/workers", (200, ready))])
    clock = Clock()
    w = gateway.readmit(http, GW, KEY, REPLICA, timeout_s=30, poll_s=0.5, clock=gateway.Clock(clock, clock.sleep))
    assert w.url == REPLICA and w.routable and clock.t == 0.5


def test_readmit_of_a_replica_that_never_becomes_routable_fails():
    http = Script([("GET", "/workers", fixture("workers_one_removed.json")),
                   ("POST", "/workers", fixture("add_accepted.json"))]
                  + [("GET", "/workers", fixture("workers_one_removed.json"))] * 5)
    clock = Clock()
    with pytest.raises(GatewayError, match="not routable"):
        gateway.readmit(http, GW, KEY, REPLICA, timeout_s=2, poll_s=0.5, clock=gateway.Clock(clock, clock.sleep))


def _id(url: str, name: str) -> str:
    return gateway.find(gateway.parse_workers(body(name)), url).id


# --- the command line ------------------------------------------------------------------------------

def test_launch_flags_bind_metrics_to_loopback_and_carry_no_key():
    flags = gateway.launch_flags(["http://127.0.0.1:30001", "http://127.0.0.1:30002"], "0.0.0.0", 30000,
                                 "cache_aware", 29000, "/ready", 5)
    assert flags[flags.index("--prometheus-host") + 1] == "127.0.0.1"
    assert flags[flags.index("--worker-urls") + 1:flags.index("--policy")] == ["http://127.0.0.1:30001",
                                                                               "http://127.0.0.1:30002"]
    assert not any("key" in f for f in flags)
    argv = gateway.launcher_argv("/v/bin/python", "/v/launch.py", flags, keyed=True)
    assert argv[:7] == ["/v/bin/python", "/v/launch.py", "--key-credential", gateway.KEY_CREDENTIAL,
                        "--control-credential", gateway.CONTROL_CREDENTIAL, "--"]


def test_the_shipped_lock_pins_the_default_release():
    assert gateway.default_version() == "1.13.0"
    assert gateway.lock_file("1.13.0") is not None and gateway.lock_sha256("1.13.0")
    for bad in ("9.9.9", "../sglang/0.5.23", "1.13.0\n"):
        assert gateway.lock_file(bad) is None


def test_readmit_waits_out_a_replica_still_draining_before_adding_it():
    draining = json.loads(body("workers_one_draining.json"))
    url = next(w["url"] for w in draining["workers"] if w["status"] == "draining")
    http = Script([("GET", "/workers", fixture("workers_one_draining.json")),
                   ("GET", "/workers", fixture("workers_one_draining.json")),
                   ("GET", "/workers", fixture("workers_one_removed.json")),
                   ("POST", "/workers", fixture("add_accepted.json")),
                   ("GET", "/workers", fixture("workers_two_ready.json"))])
    clock = Clock()
    w = gateway.readmit(http, GW, KEY, url, timeout_s=30, poll_s=1, clock=gateway.Clock(clock, clock.sleep))
    assert w.url == url and w.routable and [c[0] for c in http.calls].count("POST") == 1


def test_readmit_waits_on_an_add_already_in_progress():
    http = Script([("GET", "/workers", fixture("workers_one_removed.json")),
                   ("POST", "/workers", fixture("add_conflict_in_progress.json")),
                   ("GET", "/workers", fixture("workers_two_ready.json"))])
    assert gateway.readmit(http, GW, KEY, REPLICA, timeout_s=5, clock=gateway.Clock(Clock(), lambda s: None)).routable


def test_readmit_reports_any_other_refusal():
    http = Script([("GET", "/workers", fixture("workers_one_removed.json")),
                   ("POST", "/workers", fixture("workers_wrong_key.json"))])
    with pytest.raises(GatewayError, match="401"):
        gateway.readmit(http, GW, KEY, REPLICA, timeout_s=5, clock=gateway.Clock(Clock(), lambda s: None))


def test_the_venv_is_named_by_release_and_lock_and_installs_under_the_lock():
    from dsv4deploy.render.unit import render
    from checkout import load_profile

    inst = gateway.venv_install("1.13.0")
    assert inst.spec == "smg==1.13.0" and inst.pip_args == ["--require-hashes", "-r", f"{inst.venv}/dsv4deploy.lock"]
    lock = inst.lock_src.read_text()
    assert lock.count("--hash=sha256:") >= 7 and "\nsmg==1.13.0 " in lock     # smg itself, hash-checked
    assert render(load_profile("nvfp4-ctx8k-dp2")).gateway.venv == inst.venv
    with pytest.raises(GatewayError, match="no lock file"):
        gateway.venv_install("0.0.1")


def test_a_replica_that_does_not_answer_has_nothing_in_flight():
    """A replica that crashed (or restarts) while another was rolled: the drain does not wait on it
    and does not fail the roll; its restart is what it needs."""
    http = Script([("GET", "/workers", fixture("workers_one_removed.json")),
                   ("GET", "31001/metrics", ConnectionRefusedError(111, "refused"))])
    clock = Clock()
    done = gateway.drain(http, GW, KEY, REPLICA, timeout_s=60, poll_s=1, clock=gateway.Clock(clock, clock.sleep))
    assert done.idle_s == 0.0 and done.in_flight == 0


@pytest.mark.parametrize("error", [TimeoutError("timed out"), OSError("no answer from the host: empty output")])
def test_a_replica_whose_metrics_do_not_answer_is_not_taken_for_idle(error):
    """Only a refused connection means nothing runs there: a timeout or a lost link does not, so
    the drain asks again until its budget, and says why it ended."""
    http = Script([("GET", "/workers", fixture("workers_one_removed.json")),
                   *[("GET", "31001/metrics", error)] * 200])
    clock = Clock()
    done = gateway.drain(http, GW, KEY, REPLICA, timeout_s=20, poll_s=1, clock=gateway.Clock(clock, clock.sleep))
    assert done.idle_s is None and done.unanswered == str(error)


def test_a_refused_connection_through_the_hosts_program_reads_as_refused():
    from dsv4deploy.host.gateway_http import parse_answer
    import base64
    with pytest.raises(OSError) as exc:
        parse_answer("0\n" + base64.b64encode(b"[Errno 111] Connection refused").decode())
    assert gateway.refused(exc.value)
    with pytest.raises(OSError) as exc:
        parse_answer("0\n" + base64.b64encode(b"timed out").decode())
    assert not gateway.refused(exc.value)


def test_strays_are_the_workers_no_replica_of_the_set_answers_for():
    from dsv4deploy.gateway.model import Worker
    workers = [Worker(id="a", url="http://127.0.0.1:31101", status="ready", healthy=False, load=0),
               Worker(id="b", url="http://127.0.0.1:30001", status="ready", healthy=True, load=0)]
    assert [w.id for w in gateway.strays(workers, ["http://127.0.0.1:30001/", "http://127.0.0.1:30002"])] == ["a"]
    assert gateway.strays(workers, ["http://127.0.0.1:31101", "http://127.0.0.1:30001"]) == []
