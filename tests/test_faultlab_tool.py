"""The fault lab's strike (ct200twin/faultlab/tool.py): a fault struck with the deploy
paused lands before the deploy's next command, however slow the machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ct200twin.faultlab.tool import while_paused


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_paused_strike_runs_with_the_deploy_stopped_and_lets_it_go_on():
    child = subprocess.Popen([sys.executable, "-c", "import sys, time\nfor i in range(50):\n print(i, flush=True)\n"
                              " time.sleep(0.02)"], stdout=subprocess.PIPE, text=True, start_new_session=True)
    seen = []
    strike = while_paused(lambda: seen.append(_state(child.pid)))
    assert child.stdout.readline() == "0\n"
    strike(child, "a step")
    assert seen == ["T"]                                    # stopped while the fault was struck
    assert child.wait(timeout=20) == 0 and child.stdout.read().split()[-1] == "49"   # then it ran to its end


def test_a_strike_that_fails_still_lets_the_deploy_go_on():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"], start_new_session=True)
    with pytest.raises(ZeroDivisionError):
        while_paused(lambda: 1 / 0)(child)
    assert child.wait(timeout=20) == 0
