"""Faults on the CT200 twin: run a deploy, strike at a step, and judge how it ended.

Shared by `bench/faults.py` (the table of issue 12), `tests/test_faults_twin.py` (one test per
row) and `tests/test_deploy_twin.py` (the deploy helpers). Everything here drives the real
command a user runs (`pyinfra -y inventory/sim.py deploy/serve.py`) and reads the twin over SSH.

"Recovered" (docs/faults.md): a release that passed its gate is serving, or the tool exited
non-zero with a message that says what happened and what to do; no release is left `pending`
after the next run; no release is recorded `deployed` without a passed gate; earlier releases'
files are intact; a re-run converges without manual cleanup; no process of ours outlives the run
that started it.

One concern per module; importers use `faultlab.NAME` (re-exported here):

- tool.py       running the tool as a user does, striking it at a step boundary, and whether the
                strike landed (`cut_missed`: a step the run never started did not strike)
- reading.py    reading the twin over SSH: releases, health, processes of ours, kept files, weights
- recovered.py  the checks of "recovered", and `judge`, which applies them to one fault's runs
- rows.py       a row of the table, what a run's output says it did, a many-case fault summed up,
                the matrix's last line (`summary`: rows whose strikes did not land, said loudly)
- lab.py        the twin with a clean, good release to strike at (`Lab`, `start`)
- variants.py   the faults' test profiles (`VARIANTS`, `variant`, `write_profiles`) and gates
- faults.py     faults 1-14 (`ALL`, `fault_N`, `cut_at`)
- converge.py   fault 15: a replica set converges to its release (issue 40)
"""

from ct200twin.faultlab.faults import (ALL, CUT_GRACE_S, F6_CUT_CONTEXT, VERIFY_STEP, cut_at, cut_case, fault_1,
                                       fault_2, fault_3, fault_4, fault_5, fault_6, fault_7, fault_8, fault_9,
                                       fault_10, fault_11, fault_12, fault_13, fault_14, fault_15, fault_with_knobs)
from ct200twin.faultlab.lab import FAST_START, FAULTS, Lab, start
from ct200twin.faultlab.reading import (GATE_USER, LOCK, MANIFEST, RELEASES_DIR, checkpoint_sha, health,
                                        live_manifest_sha, live_venv, local_checkpoint_sha, main_pid, our_processes,
                                        release_files, releases, served_context, wait_no_processes)
from ct200twin.faultlab.recovered import Serving, history_problems, judge, lost_files, passed, serving, tool_traceback
from ct200twin.faultlab.rows import Row, add_case, did, fold, summary
from ct200twin.faultlab.tool import (OP_LINE, PYINFRA, REPO, Run, changed_ops, cut_missed, deploy, deploy_and_strike,
                                     deploy_argv, deploy_watching, kill, operations, run, step_key, strike_run)
from ct200twin.faultlab.variants import (BUDGET_GATE, MID_GATE, QUICK_GATE, REVISION_11, TINY_GATE, VARIANTS,
                                         fresh_variants, variant, write_profiles)

__all__ = [
    "ALL", "CUT_GRACE_S", "F6_CUT_CONTEXT", "VERIFY_STEP", "cut_at", "cut_case", "fault_1", "fault_2", "fault_3",
    "fault_4", "fault_5", "fault_6", "fault_7", "fault_8", "fault_9", "fault_10", "fault_11", "fault_12", "fault_13",
    "fault_14", "fault_15", "fault_with_knobs",
    "FAST_START", "FAULTS", "Lab", "start",
    "GATE_USER", "LOCK", "MANIFEST", "RELEASES_DIR", "checkpoint_sha", "health", "live_manifest_sha", "live_venv",
    "local_checkpoint_sha", "main_pid", "our_processes", "release_files", "releases", "served_context",
    "wait_no_processes",
    "Serving", "history_problems", "judge", "lost_files", "passed", "serving", "tool_traceback",
    "Row", "add_case", "did", "fold", "summary",
    "OP_LINE", "PYINFRA", "REPO", "Run", "changed_ops", "cut_missed", "deploy", "deploy_and_strike", "deploy_argv",
    "deploy_watching", "kill", "operations", "run", "step_key", "strike_run",
    "BUDGET_GATE", "MID_GATE", "QUICK_GATE", "REVISION_11", "TINY_GATE", "VARIANTS", "fresh_variants", "variant",
    "write_profiles",
]
