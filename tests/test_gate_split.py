"""Which replica served a gate through the smg gateway (docs/replicas.md, "Which replica served the
gate"): the replicas' own counters before and after (gate/split.py), the client's record of the
worker smg named for each request (client.routing), what the run prints and records
(host/gate.py), and the wait for smg's load reports before that gate (host/replicas.py,
tasks/replicas.py). The numbers are the ones measured on the route twin."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dsv4deploy.cli.settings import Settings
from dsv4deploy.gateway import model as gateway
from dsv4deploy.gate import client, split
from dsv4deploy.gate.result import GateResult, LevelResult
from dsv4deploy.gate.runner import GateOutcome
from dsv4deploy.gate.spec import GateSpec, LevelSpec
from dsv4deploy.gate.verdict import judge
from dsv4deploy.host import gate as host_gate
from dsv4deploy.host import replicas as hr
from checkout import load_profile
from dsv4deploy.release.rollout import Target
from dsv4deploy.tasks import replicas as tr

FIXTURES = Path(__file__).parent / "fixtures" / "smg"
URLS = ["http://127.0.0.1:30001", "http://127.0.0.1:30002"]


def target() -> Target:
    return Target.of(load_profile("nvfp4-ctx8k-dp2").data)


# --- the replicas' counters ----------------------------------------------------------------------

def test_the_request_counter_is_read_from_a_replicas_metrics():
    assert split.requests_total((FIXTURES / "replica_metrics_counter.txt").read_text()) == 195
    assert split.requests_total('sglang_num_requests_total{tp_rank="0"} 7.0\nsglang_num_requests_total{tp_rank="1"} 3\n') == 10
    assert split.requests_total((FIXTURES / "replica_metrics_idle.txt").read_text()) is None   # HELP/TYPE only
    assert split.requests_total("") is None


def test_one_command_reads_every_replica_and_its_output_parses_back():
    cmd = split.counters_command(URLS)
    assert cmd.count("curl -s --noproxy '*' -m 5") == 2 and "http://127.0.0.1:30002/metrics" in cmd
    line = next(x for x in (FIXTURES / "replica_metrics_counter.txt").read_text().splitlines()
                if x.startswith("sglang:num_requests_total"))
    out = f"{split.MARK}{URLS[0]}\n{line}\n{split.MARK}{URLS[1]}\n"        # replica 1 answered nothing
    assert split.parse_counters(out, URLS) == {URLS[0]: 195, URLS[1]: None}


def test_the_split_is_the_difference_and_unknown_when_a_counter_went_back():
    parts = split.split(URLS, {URLS[0]: 130, URLS[1]: 130}, {URLS[0]: 247, URLS[1]: 143})
    assert [p["requests"] for p in parts] == [117, 13]
    assert split.describe(parts) == "requests per replica: 0: 117 (90%), 1: 13 (10%)"
    restarted = split.split(URLS, {URLS[0]: 130, URLS[1]: 130}, {URLS[0]: 200, URLS[1]: 4})
    assert [p["requests"] for p in restarted] == [70, None]
    assert "unknown" in split.warnings(restarted)[0]


@pytest.mark.parametrize("counts, warned", [
    ((117, 13), [1]),          # the rolling update measured before the fix (release 0002)
    ((123, 7), [1]),           # the first start measured before the fix (release 0001)
    ((51, 79), []),            # skewed, but each replica above half of an even share
    ((65, 65), []),
    ((43, 45), []),            # the settle's full gate in docs/tune.md
    ((6, 0), []),              # too few requests to judge
])
def test_a_replica_far_below_its_share_is_warned_about(counts, warned):
    parts = [{"index": i, "url": u, "requests": n} for i, (u, n) in enumerate(zip(URLS, counts))]
    warnings = split.warnings(parts)
    assert [int(re.match(r"replica (\d)", w).group(1)) for w in warnings] == warned
    for w in warnings:
        assert "an even split gives 50%" in w and "stale sglang:gen_throughput" in w


# --- the client's record of where smg sent each request --------------------------------------------

def _recs(spans):
    out = []
    for worker, start, end in spans:
        r = client.Rec()
        r.worker, r.t_start, r.t_end, r.ok, r.out = worker, start, end, True, 64
        out.append(r)
    return out


def test_sequential_waves_show_as_one_replica_holding_everything_though_the_counts_are_even():
    # release 0010 before the fix: 64 on replica 0, then 64 on replica 1, 460 tok/s (one replica's)
    recs = _recs([(URLS[0], 0.0, 6.0)] * 64 + [(URLS[1], 6.0, 12.0)] * 64)
    routed = client.routing(recs)
    assert routed["busiest_share"] == 1.0
    assert {u: w["requests"] for u, w in routed["workers"].items()} == {URLS[0]: 64, URLS[1]: 64}
    assert routed["workers"][URLS[0]]["peak_in_flight"] == 64 and routed["workers"][URLS[0]]["output_tokens"] == 64 * 64


def test_an_even_spread_over_time_is_half():
    recs = _recs([(URLS[i % 2], 0.0, 6.0) for i in range(64)] + [(URLS[i % 2], 6.0, 12.0) for i in range(64)])
    routed = client.routing(recs)
    assert routed["busiest_share"] == 0.5
    assert [w["peak_in_flight"] for w in routed["workers"].values()] == [32, 32]


def test_no_gateway_named_a_worker_no_routing():
    recs = _recs([(None, 0.0, 1.0)])
    assert client.routing(recs) is None


def test_the_header_smg_sends_is_the_one_the_client_reads():
    # measured: smg 1.13.0 answers /generate (streaming or not) with the worker it chose
    assert client.ROUTED_HEADER == b"x-smg-routed-worker-id"


def _level(concurrency, routed):
    return LevelResult(concurrency=concurrency, num_prompts=128, completed=128, routed=routed)


def test_the_spread_over_time_warns_only_for_a_level_with_room_to_spread():
    skewed = client.routing(_recs([(URLS[0], 0.0, 6.0)] * 64 + [(URLS[1], 6.0, 12.0)] * 64))
    even = client.routing(_recs([(URLS[i % 2], 0.0, 6.0) for i in range(128)]))
    lines, warns = split.routing_lines([_level(64, skewed), _level(1, skewed), _level(16, even)], 2)
    assert len(lines) == 3 and "the busiest replica held 100%" in lines[0]
    assert len(warns) == 1 and warns[0].startswith("C=64: the gateway kept 100% of the requests in flight")
    assert split.busy_limit(2) == 0.75 and split.busy_limit(4) == 0.625


def test_the_result_keeps_routing_through_its_json_round_trip():
    routed = client.routing(_recs([(URLS[0], 0.0, 1.0)] * 8))
    res = GateResult(runner="builtin", levels=[_level(64, routed)],
                     replicas=[{"index": 0, "url": URLS[0], "requests": 8}])
    back = GateResult.from_json(res.to_json())
    assert back.levels[0].routed == routed and back.replicas == res.replicas
    assert GateResult.from_dict({"runner": "builtin", "levels": []}).replicas == []    # an older gate.json


# --- the run: read before and after, print, record ---------------------------------------------------

class Host:
    """A host whose inventory's settings (host data) put the reports under CHECKOUT."""
    name = "fake"

    def __init__(self, checkout: Path | None = None):
        self.data = {"settings": Settings.from_environment({}, checkout)} if checkout else {}


def test_a_gate_through_the_gateway_records_prints_and_warns(monkeypatch, capsys, tmp_path):
    reads = iter([{URLS[0]: 130, URLS[1]: 130}, {URLS[0]: 247, URLS[1]: 143}])
    commands = []

    def sh(h, command, timeout=None):
        commands.append(command)
        counts = next(reads)
        return True, "".join(f"{split.MARK}{u}\nsglang:num_requests_total{{}} {n}.0\n" for u, n in counts.items())

    spec = GateSpec(levels=(LevelSpec(64, 128, 256, 64, min_output_throughput=50),))
    routed = client.routing(_recs([(URLS[0], 0.0, 6.0)] * 115 + [(URLS[1], 0.0, 6.0)] * 13))
    result = GateResult(runner="builtin", levels=[LevelResult(concurrency=64, num_prompts=128, input_len=256,
                                                              output_len=64, completed=128, duration_s=16.9,
                                                              total_output_tokens=8192, output_throughput=489.2,
                                                              routed=routed)])

    def run_gate(spec_, host, server, *a, **kw):
        assert server.base_url == "http://127.0.0.1:30000" and len(commands) == 1       # counters read before
        return GateOutcome(spec_, result, judge(spec_, result))

    written = {}
    monkeypatch.setattr(host_gate, "sh", sh)
    monkeypatch.setattr(host_gate, "run_gate", run_gate)
    monkeypatch.setattr(host_gate, "warm_plotting", lambda: None)
    monkeypatch.setattr(host_gate, "write_report", lambda outcome, local, **kw: written.setdefault("doc", outcome))
    t = target()
    t.data["gate"] = {**t.data["gate"], "levels": [{"concurrency": 64, "num_prompts": 128, "input_len": 256,
                                                     "output_len": 64, "min_output_throughput": 50}]}
    outcome = host_gate.run_release_gate(Host(tmp_path), t, None, None, "nvfp4-ctx8k-dp2")
    assert len(commands) == 2 and commands[0] == split.counters_command(URLS)
    assert [p["requests"] for p in outcome.result.replicas] == [117, 13]
    assert written["doc"].result.replicas == outcome.result.replicas          # in gate.json and gate.md
    out = capsys.readouterr().out
    assert "[fake] through http://127.0.0.1:30000, requests per replica: 0: 117 (90%), 1: 13 (10%)" in out
    assert "[fake] WARNING: replica 1 (http://127.0.0.1:30002) served 13 of the 130 requests" in out
    assert "[fake] WARNING: C=64: the gateway kept" in out
    record = host_gate.gate_record(outcome)
    assert record["split"] == [117, 13] and record["busiest_share"] == routed["busiest_share"]


def test_a_gate_on_one_replica_reads_no_counters(monkeypatch, tmp_path):
    monkeypatch.setattr(host_gate, "sh", lambda *a, **k: pytest.fail("no counters for a single target"))
    spec = GateSpec(levels=(LevelSpec(64, 64, 256, 64, min_output_throughput=50),))
    result = GateResult(runner="builtin", levels=[LevelResult(concurrency=64, num_prompts=64, completed=64,
                                                              output_throughput=460.0, duration_s=9.0)])
    monkeypatch.setattr(host_gate, "run_gate", lambda s, *a, **kw: GateOutcome(s, result, judge(s, result)))
    monkeypatch.setattr(host_gate, "warm_plotting", lambda: None)
    written = []
    monkeypatch.setattr(host_gate, "write_report", lambda outcome, local, **kw: written.append(local))
    outcome = host_gate.run_release_gate(Host(tmp_path), target().replica(0), None, None, "nvfp4-ctx8k-dp2")
    assert outcome.result.replicas == [] and "split" not in host_gate.gate_record(outcome)
    assert written[0].name == "adhoc-nvfp4-ctx8k-dp2-replica-0"           # the replica's own reports


# --- smg's load reports, waited for before the gate through it ---------------------------------------

def test_a_load_report_is_read_from_smgs_metrics():
    text = (FIXTURES / "gateway_metrics_one_reported.txt").read_text()
    assert gateway.load_reported(text, URLS[0]) and not gateway.load_reported(text, URLS[1])
    assert gateway.load_reported(text, URLS[0] + "/")


def test_the_wait_ends_once_smg_reports_every_replica(monkeypatch):
    one = (FIXTURES / "gateway_metrics_one_reported.txt").read_text()
    both = one + one.replace("30001", "30002")
    answers = iter([one, one, both])
    calls = []

    def http(method, url, headers, body, timeout):
        calls.append(url)
        return 200, next(answers).encode()

    monkeypatch.setattr(hr, "host_http", lambda h, key_file: http)
    monkeypatch.setattr(hr.gateway.time, "sleep", lambda s: None)
    logged = []
    assert hr.wait_load_reports(Host(), target(), logged.append) is not None
    assert calls == ["http://127.0.0.1:29000/metrics"] * 3 and logged == []


def test_no_report_in_time_is_said_and_not_fatal(monkeypatch):
    one = (FIXTURES / "gateway_metrics_one_reported.txt").read_text()
    monkeypatch.setattr(hr, "host_http", lambda h, key_file: lambda *a: (200, one.encode()))
    monkeypatch.setattr(hr.gateway.time, "sleep", lambda s: None)
    logged = []
    assert hr.wait_load_reports(Host(), target(), logged.append, timeout_s=0) is None
    assert "no load report of http://127.0.0.1:30002" in logged[0]


@pytest.mark.parametrize("policy", ["cache_aware", "round_robin"])
@pytest.mark.parametrize("rolling", [True, False])
def test_the_gate_through_the_gateway_comes_after_the_wait(monkeypatch, rolling, policy):
    """A load-aware policy: the gate through the gateway waits for smg's load reports; round robin
    needs none; a rolling update runs no gate through the gateway at all (only a probe)."""
    events = []
    data = load_profile("nvfp4-ctx8k-dp2").data
    data["replicas"]["gateway"]["policy"] = policy
    t = Target.of(data)
    store = type("Store", (), {"h": Host(), "current": lambda self: {"release": 1}})()
    r = type("R", (), {"target": t, "layout": t.layout, "profile": type("P", (), {"name": "nvfp4-ctx8k-dp2"})()})()
    sw = tr.Switch(store, r, ["changed"], restart_gateway=None, release=None)
    monkeypatch.setattr(tr.Switch, "_previous_target", lambda self: t if rolling else None)
    monkeypatch.setattr(tr, "unit_active", lambda h, unit: unit == t.unit)
    monkeypatch.setattr(tr, "sh", lambda h, cmd: (True, ""))
    monkeypatch.setattr(tr, "prepare_release_gate", lambda h, t_: events.append("prepare"))
    monkeypatch.setattr(tr, "roll", lambda *a, **k: events.append("roll"))
    monkeypatch.setattr(tr, "start_set", lambda *a, **k: events.append("start"))
    monkeypatch.setattr(tr, "stop_surplus", lambda h, t_, log: [])
    monkeypatch.setattr(tr, "wait_load_reports", lambda h, t_, log: events.append("wait") or 9.8)
    gate = type("G", (), {"passed": True})()
    monkeypatch.setattr(tr, "run_release_gate", lambda *a, **k: events.append("gate") or gate)
    monkeypatch.setattr(tr, "previous_report", lambda h, t_, previous: None)
    monkeypatch.setattr(tr, "probe", lambda h, t_, requests: events.append("probe") or "said")
    monkeypatch.setattr(tr, "gate_record", lambda g: {})
    monkeypatch.setattr(tr, "rolling_gate_record", lambda per_replica, said: {})
    monkeypatch.setattr(tr.Switch, "record", lambda self, steps, g: events.append("record"))
    sw.run()
    waits = ["wait"] if policy in gateway.LOAD_AWARE else []
    assert events == (["prepare", "roll", "probe", "record"] if rolling else ["start"] + waits + ["gate", "record"])
