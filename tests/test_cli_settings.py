"""The command run from another folder than the checkout: it finds the checkout's profiles (or
DSV4_PROFILES_DIR's), and what it writes goes where the run's settings say (dsv4deploy/cli/
settings.py), never where the working directory happens to be."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dsv4deploy.cli.main import main
from dsv4deploy.cli.settings import CHECKOUT, PROFILES_VAR, Settings
from dsv4deploy.gate.result import GateResult, LevelResult
from dsv4deploy.gate.runner import GateOutcome
from dsv4deploy.gate.verdict import judge
from dsv4deploy.host import gate as host_gate
from dsv4deploy.profile.load import load_profile
from dsv4deploy.release.rollout import Target


def _elsewhere(tmp_path: Path, monkeypatch) -> Path:
    """A working directory outside the checkout, with no DSV4_PROFILES_DIR."""
    here = tmp_path / "elsewhere"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.delenv(PROFILES_VAR, raising=False)
    return here


def test_the_command_from_another_folder_validates_renders_and_lists_the_checkouts_profiles(tmp_path, monkeypatch):
    here = _elsewhere(tmp_path, monkeypatch)
    env = {k: v for k, v in os.environ.items() if k != PROFILES_VAR}
    out = subprocess.run([sys.executable, "-m", "dsv4deploy", "validate", "nvfp4-ctx8k"], cwd=here, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "nvfp4-ctx8k: valid" in out.stdout, out.stderr
    assert main(["render", "nvfp4-ctx8k", "--out", "out"]) == 0          # --out is the operator's, as given
    assert (here / "out" / "etc" / "systemd" / "system" / "sglang.service").is_file()
    assert not (here / "profiles").exists() and not (here / "reports").exists() and not (here / ".cache").exists()


def test_a_missing_inventory_is_named_from_another_folder_too(tmp_path, monkeypatch, capsys):
    _elsewhere(tmp_path, monkeypatch)
    assert main(["history", "--json", "--inventory", "inventory/none.py"]) == 1
    assert "inventory/none.py: no such inventory file" in capsys.readouterr().err


def test_the_profiles_folder_of_the_environment_is_the_one_used(tmp_path, monkeypatch, capsys):
    _elsewhere(tmp_path, monkeypatch)
    own = tmp_path / "own-profiles"
    own.mkdir()
    (own / "mine.yaml").write_text((CHECKOUT / "profiles" / "nvfp4-ctx8k.yaml").read_text())
    (own / "_ct200-base.yaml").write_text((CHECKOUT / "profiles" / "_ct200-base.yaml").read_text())
    monkeypatch.setenv(PROFILES_VAR, str(own))
    assert main(["list"]) == 0
    assert capsys.readouterr().out.split() == ["mine"]
    assert main(["tune", "mine", "--plan", "--set", "server.context_length=4096,8192"]) == 0   # where it would write
    assert f"the best found goes to {own / 'mine-tuned.yaml'}" in capsys.readouterr().out


def test_the_settings_do_not_depend_on_the_working_directory(tmp_path, monkeypatch):
    _elsewhere(tmp_path, monkeypatch)
    s = Settings.from_environment({})
    assert (s.checkout, s.profiles, s.reports, s.cache) == (
        CHECKOUT, CHECKOUT / "profiles", CHECKOUT / "reports", CHECKOUT / ".cache")
    assert "hf_secret" not in repr(Settings.from_environment({"DSV4_HF_TOKEN": "hf_secret"}))


def test_a_gate_report_is_written_under_the_settings_reports_folder(tmp_path, monkeypatch, capsys):
    """From another folder, the gate's report goes to the host data's settings' reports/<host>/."""
    _elsewhere(tmp_path, monkeypatch)
    checkout = tmp_path / "checkout"
    result = GateResult(runner="builtin", levels=[LevelResult(concurrency=64, num_prompts=64, completed=64,
                                                              output_throughput=460.0, duration_s=9.0)])
    written = []
    monkeypatch.setattr(host_gate, "run_gate", lambda s, *a, **kw: GateOutcome(s, result, judge(s, result)))
    monkeypatch.setattr(host_gate, "warm_plotting", lambda: None)
    monkeypatch.setattr(host_gate, "write_report", lambda outcome, local, **kw: written.append(local))

    class Host:
        name = "ct200"
        data = {"settings": Settings.from_environment({}, checkout)}

    target = Target.of(load_profile("nvfp4-ctx8k", CHECKOUT / "profiles").data)
    host_gate.run_release_gate(Host(), target, None, None, "nvfp4-ctx8k")
    assert written == [checkout / "reports" / "ct200" / "adhoc-nvfp4-ctx8k"]
    assert "[ct200] gate report: reports/ct200/adhoc-nvfp4-ctx8k" in capsys.readouterr().out
