"""The verdict: rows per level and failure messages that name metric, observed and threshold."""

from dsv4deploy.gate.result import GateResult, LevelResult, Stats
from dsv4deploy.gate.spec import GateSpec, LevelSpec
from dsv4deploy.gate.verdict import headline_basis, judge

SPEC = GateSpec(levels=(LevelSpec(1, 8, min_output_throughput=10),
                        LevelSpec(16, 48, min_output_throughput=120, max_p99_ttft_ms=2000),
                        LevelSpec(64, 128, min_output_throughput=400, max_p99_tpot_ms=150)))


def lvl(c, n, tput, *, status="ok", failed=0, ttft_p99=100.0, tpot_p99=50.0, **kw):
    return LevelResult(concurrency=c, num_prompts=n, status=status, completed=n - failed, failed=failed,
                       duration_s=10.0, output_throughput=tput, ttft_ms=Stats(mean=1, median=1, p90=1, p99=ttft_p99),
                       tpot_ms=Stats(mean=1, median=1, p90=1, p99=tpot_p99), **kw)


def gate(*levels, **kw):
    return GateResult(runner="builtin", levels=list(levels), **kw)


def test_all_pass():
    v = judge(SPEC, gate(lvl(64, 128, 531.7), lvl(16, 48, 250.0), lvl(1, 8, 23.9)))
    assert v.passed and not v.failures
    assert v.summary.startswith("gate passed: C=1 23.9 tok/s (floor 10)")
    assert v.headline == {"level": "C=64", "concurrency": 64, "floor": 400, "output_throughput": 531.7, "status": "ok"}
    c64 = v.levels[2]
    assert [(r.metric, r.comparator, r.threshold, r.passed) for r in c64.rows[:4]] == [
        ("failed requests", "<=", 0, True), ("output throughput", ">=", 400, True),
        ("p99 TTFT", "", None, None), ("p99 TPOT", "<=", 150, True)]


def test_the_headline_of_an_early_pass_says_what_its_figure_rests_on():
    c64 = lvl(64, 128, 531.7, early_stop={"rule": "pass", "at_s": 31.0, "requests_done": 64},
              reason="passed early: 531.7 tok/s over 64/128 completed requests >= 1.25 x floor 400 tok/s")
    c64.completed = 64
    v = judge(SPEC, gate(c64, lvl(16, 48, 250.0), lvl(1, 8, 23.9)))
    assert v.passed and v.headline["passed_early"] and (v.headline["completed"], v.headline["num_prompts"]) == (64, 128)
    assert headline_basis(v.headline) == " (passed early: 64 of 128 requests)" and c64.basis() == \
        "64 of 128 requests (passed early)"
    assert [r.note for r in v.levels[2].rows if r.metric == "completed"] == [c64.reason]
    full = judge(SPEC, gate(lvl(64, 128, 531.7), lvl(16, 48, 250.0), lvl(1, 8, 23.9))).headline
    assert "passed_early" not in full and headline_basis(full) == ""


def test_floor_message_is_exact():
    v = judge(SPEC, gate(lvl(64, 128, 29.7), lvl(16, 48, 250.0), lvl(1, 8, 23.9)))
    assert not v.passed
    assert v.failures == ["C=64 output throughput 29.7 tok/s < floor 400 tok/s"]
    assert v.message == "C=64 output throughput 29.7 tok/s < floor 400 tok/s"
    row = v.levels[2].rows[1]
    assert (row.observed_text(), row.comparator, row.threshold_text(), row.verdict_text()) == \
        ("29.7 tok/s", ">=", "400 tok/s", "FAIL")


def test_failed_requests_and_ceilings():
    v = judge(SPEC, gate(lvl(64, 128, 500.0, failed=3, tpot_p99=170.25,
                             errors=[{"message": "HTTP 500: boom", "count": 3}]),
                         lvl(16, 48, 250.0, ttft_p99=2500.0), lvl(1, 8, 23.9)))
    assert v.failures == ["C=16 p99 TTFT 2500.0 ms > ceiling 2000 ms",
                          "C=64 failed requests 3 > max 0",
                          "C=64 p99 TPOT 170.2 ms > ceiling 150 ms"]
    assert "HTTP 500: boom (x3)" in v.levels[2].rows[0].note
    spec1 = GateSpec(levels=SPEC.levels, max_failed_requests=3)
    assert "C=64 failed requests 3 > max 0" not in judge(spec1, gate(lvl(64, 128, 500.0, failed=3))).failures


def test_early_stop_budget_and_not_run():
    early = lvl(64, 128, 0.0, status="early_stop", running_output_throughput=30.8,
                reason="running output throughput 30.8 tok/s after 19.3 s is below 50% of the floor 400 tok/s")
    early.completed = 0
    v = judge(SPEC, gate(early, lvl(16, 48, 0, status="skipped", reason="not run: gate stopped after C=64 failed"),
                         lvl(1, 8, 0, status="skipped", reason="not run: gate stopped after C=64 failed")))
    assert not v.passed
    assert v.failures[0] == "C=64 output throughput 30.8 tok/s < floor 400 tok/s (running rate, stopped early after 10.0 s)"
    assert v.failures[1].startswith("C=64 stopped early after 10.0 s: running output throughput 30.8")
    assert len(v.failures) == 2                      # levels not run are not extra failures
    assert [lv.passed for lv in v.levels] == [None, None, False]
    assert v.headline["output_throughput"] == 30.8

    budget = lvl(16, 48, 100.0, status="budget", reason="gate budget 60 s exhausted during C=16 (20/48 requests done)")
    v = judge(SPEC, gate(lvl(64, 128, 500.0), budget, lvl(1, 8, 0, status="skipped", reason="not run: budget"),
                         budget_exhausted=True))
    assert v.failures == ["C=16: gate budget 60 s exhausted during C=16 (20/48 requests done)"]
    assert v.levels[1].rows[0].observed == "budget exhausted after 10.0 s"


def test_missing_level_and_runner_error():
    v = judge(SPEC, gate(lvl(64, 128, 500.0), lvl(16, 48, 250.0)))
    assert v.failures == ["C=1 was not measured"]
    v = judge(SPEC, gate(lvl(64, 128, 500.0), lvl(16, 48, 250.0), lvl(1, 8, 20.0), error="client wrote no JSON result"))
    assert v.failures == ["gate runner (builtin) failed: client wrote no JSON result"]
    assert v.lines()[0].startswith("FAIL: gate failed: gate runner (builtin) failed")
