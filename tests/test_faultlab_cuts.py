"""The fault matrix's cut points (ct200twin/faultlab): a cut at a step that the run never starts
(the launch check runs only when its inputs change) did not strike, and is said so, apart from
recovered and from not recovered; a cut at a step the run starts strikes. No twin: the run is a
stand-in that prints pyinfra's operation lines."""

from __future__ import annotations

import sys

from ct200twin.faultlab.faults import cut_case
from ct200twin.faultlab.rows import Row, fold, summary
from ct200twin.faultlab.tool import OP_LINE, Run, cut_missed, kill, step_key, strike_run
from ct200twin.faultlab.variants import fresh_variants

LAUNCH_CHECK = ("Launch check | the twin's parser (stand-in: SGLang 0.5.23's flags and their arity, no value checks) "
                "parses the rendered argv")
VERIFY = "Verify | health, identity, smoke gate, record"
# A run that skipped the launch check (an earlier release passed it with this argv and venv), and
# what its plan said of it.
SKIPPING = ["Secrets | API key (generated on the host, 0600) and its SGLang config",
            "Restart | restart sglang.service (release: release 0007 rendered, argv changed)", VERIFY]
SKIPPED = ("[ct200] plan: launch check: release 0006, the last deployed, passed it with this argv and venv; "
           "not run again")


def fake_deploy(ops: list[str], plan: str = "") -> list[str]:
    """A command that prints PLAN, then the operation lines of OPS as pyinfra does, a little apart."""
    body = "".join(f"print({OP_LINE + op!r}, flush=True); time.sleep(0.05)\n" for op in ops)
    return [sys.executable, "-c", f"import time\nprint({plan!r})\n" + body + "print('release 0007 deployed: ok')\n"]


def cut(ops: list[str], step: str, plan: str = "") -> Run:
    """What fault 6's cut_at does with the run: SIGKILL at the first operation whose key is STEP's."""
    return strike_run(fake_deploy(ops, plan), lambda s, _i: step_key(s) == step_key(step), kill, timeout=60)


def judged_recovered(step: str) -> Row:
    """A case that recovery's checks found nothing wrong with (what Lab.judge leaves)."""
    return Row("6", f"cut at {step}", recovered=True, recover_s=1.0)


def test_a_cut_at_a_step_the_run_skips_is_reported_as_did_not_strike():
    first = cut(SKIPPING, LAUNCH_CHECK, plan=SKIPPED)
    assert first.rc == 0 and first.struck is None          # the run went on to its end, uncut
    missed = cut_missed(LAUNCH_CHECK, first)
    assert "did not strike at \"Launch check | the twin's parser\"" in missed
    assert "it said: launch check: release 0006, the last deployed, passed it" in missed     # why, in its words

    row, sub = Row("6", "control process killed (SSH cut)"), judged_recovered(LAUNCH_CHECK)
    cut_case(row, sub, LAUNCH_CHECK, LAUNCH_CHECK, first, Run(rc=0, output=""))
    fold(row, [sub])
    assert not sub.recovered and not row.recovered           # not counted as recovered ...
    assert row.why_not == []                                 # ... nor as a failure to recover
    assert "DID NOT STRIKE" in row.details[0] and "never started" in row.details[0]
    assert row.cells()[-1].startswith("DID NOT STRIKE: did not strike at \"Launch check")
    assert summary([row]) == "faults: 0/1 recovered; 1 strike(s) DID NOT STRIKE (fault 6)"


def test_a_cut_at_a_step_the_run_takes_strikes_and_counts():
    first = cut([*SKIPPING[:1], LAUNCH_CHECK, *SKIPPING[1:]], LAUNCH_CHECK)
    assert first.rc == -9 and first.struck == LAUNCH_CHECK
    assert "release 0007 deployed" not in first.output       # killed before the run's end
    assert cut_missed(LAUNCH_CHECK, first) is None

    row, sub = Row("6", "control process killed (SSH cut)"), judged_recovered(LAUNCH_CHECK)
    cut_case(row, sub, LAUNCH_CHECK, LAUNCH_CHECK, first, Run(rc=0, output=""))
    fold(row, [sub])
    assert row.recovered and row.cells()[-1] == "yes"
    assert summary([row]) == "faults: 1/1 recovered"


def test_a_cut_whose_step_came_but_did_not_land_is_said_so():
    """The mid-gate cut: the verify step came, but the gate ended before its client was seen."""
    ended = Run(rc=0, output="".join(f"{OP_LINE}{op}\n" for op in SKIPPING), struck=None)
    assert "started it, but ended before the strike landed" in cut_missed(VERIFY, ended)


def test_each_cut_profile_is_one_the_host_never_deployed(tmp_path):
    fresh = fresh_variants(tmp_path, {"f6cut-1", "f6cut-3"}, "f6cut", 15360)
    assert [next(fresh) for _ in range(3)] == ["f6cut-2", "f6cut-4", "f6cut-5"]
    texts = {p.read_text() for p in tmp_path.glob("f6cut-*.yaml")}
    assert len(texts) == 3 and "context_length: 15362" in (tmp_path / "f6cut-2.yaml").read_text()
