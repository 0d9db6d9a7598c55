"""The card's command as printed (`pyinfra inventory/ct200.py deploy/serve.py`, no --data), make
for a real control node, and history/bench against a host that does not answer.

Real runs go to 127.0.0.254, a loopback address where nothing listens on port 22 (refused at
once). Where a test must prove that nothing connects, it listens itself on 127.0.0.254 at a free
port and counts the connections. make targets that would need the twin run with `make -n`.
No twin is booted: DSV4_SIM_DIR points at an empty folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path

import pytest

from checkout import profiles_dir, settings
from dsv4deploy.cli import inventories
from dsv4deploy.profile.errors import rerun_with
from dsv4deploy.host.connect import describe
from dsv4deploy.profile.validate import PLACEHOLDER_REVISION

REPO = Path(__file__).resolve().parent.parent
BIN = REPO / ".venv" / "bin"
NOWHERE = "127.0.0.254"
PINNED = "0123456789abcdef0123456789abcdef01234567"


def clean_env() -> dict:
    """This process's environment without settings that would steer what is tested (a caller's
    CT200_*/DSV4_*/PROFILE, or the flags of a `make test` around us)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("CT200_", "DSV4_", "MAKE")) and k not in ("PROFILE", "MFLAGS", "INVENTORY", "ARGS")}


def run(cmd: list[str], env: dict | None = None, timeout: int = 60) -> tuple[subprocess.CompletedProcess, float]:
    """The command's result (with .text, and .cpu_s: the CPU it and its children spent, which the
    other pytest processes of make test do not stretch as they do wall time) and its wall time.
    The CPU is this child's own, from wait4(): RUSAGE_CHILDREN would also count whatever else this
    process reaped meanwhile (the parser venv's pip, built by a background thread)."""
    start = time.monotonic()
    with tempfile.TemporaryFile() as so, tempfile.TemporaryFile() as se:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=so, stderr=se, env={**clean_env(), **(env or {})})
        fired = threading.Event()
        timer = threading.Timer(timeout, lambda: (fired.set(), proc.kill()))
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except ChildProcessError:     # the timer's kill() reaped it first (Popen.poll): it ran out of time
            raise subprocess.TimeoutExpired(cmd, timeout) from None
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        if fired.is_set():
            raise subprocess.TimeoutExpired(cmd, timeout)
        so.seek(0)
        se.seek(0)
        out = subprocess.CompletedProcess(cmd, proc.returncode, so.read().decode(errors="replace"),
                                          se.read().decode(errors="replace"))
    out.text = out.stdout + out.stderr
    out.cpu_s = usage.ru_utime + usage.ru_stime
    return out, time.monotonic() - start


@pytest.fixture
def no_twin(tmp_path):
    """Sim state in an empty folder: inventory/sim.py finds no twin, whatever else runs here."""
    return {"DSV4_SIM_DIR": str(tmp_path / "sim")}


@pytest.fixture
def pinned(tmp_path):
    """The shipped profiles with the base's revision pinned (as `make pin` would)."""
    target = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", target)
    base = target / "_ct200-base.yaml"
    text = base.read_text()
    assert f'revision: "{PLACEHOLDER_REVISION}"' in text
    base.write_text(text.replace(f'revision: "{PLACEHOLDER_REVISION}"', f'revision: "{PINNED}"'))
    return target


class Listener:
    """A TCP port on 127.0.0.254 that counts who connects (and hangs up on them at once)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind((NOWHERE, 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = False
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self):
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self):
        self._stop = True
        self._thread.join(2)
        self.sock.close()


@pytest.fixture
def listener():
    lis = Listener()
    yield lis
    lis.close()


def pyinfra(*args: str, env: dict | None = None):
    return run([str(BIN / "pyinfra"), *args], env=env)


def clean(out) -> None:
    assert "Traceback" not in out.text, out.text


# --- (7) the card's command -------------------------------------------------------------------

def test_card_command_refuses_the_placeholder_without_connecting(listener):
    out, took = pyinfra("inventory/ct200.py", "deploy/serve.py",
                        env={"CT200_HOST": NOWHERE, "CT200_PORT": str(listener.port), "CT200_PROFILE": "nvfp4-ctx8k"})
    assert out.returncode == 2, out.text
    assert "inventory/ct200.py: profile nvfp4-ctx8k (from CT200_PROFILE) cannot be deployed" in out.text
    assert re.search(r"profiles/_ct200-base\.yaml:\d+: model\.revision: placeholder revision", out.text), out.text
    assert "make pin PROFILE=nvfp4-ctx8k" in out.text
    assert "Connecting" not in out.text and "Could not connect" not in out.text
    clean(out)
    assert out.cpu_s < 5, out.cpu_s        # refused quickly: no connection attempted above
    assert listener.accepted == 0


def test_card_command_as_printed_at_an_address_where_nothing_listens():
    """The issue's own check: CT200_HOST=127.0.0.254 pyinfra inventory/ct200.py deploy/serve.py."""
    out, took = pyinfra("inventory/ct200.py", "deploy/serve.py", env={"CT200_HOST": NOWHERE, "PROFILE": "nvfp4-ctx8k"})
    assert out.returncode == 2 and "placeholder revision" in out.text, out.text
    assert "(from PROFILE)" in out.text
    assert "Connecting" not in out.text and "Unable to connect" not in out.text
    clean(out)
    assert out.cpu_s < 5, out.cpu_s        # refused quickly: no connection attempted above


def test_a_pinned_profile_from_the_environment_goes_on_to_connect(pinned, listener):
    """The positive control: same command, revision pinned: the profile is announced and pyinfra
    connects (the listener sees it; it hangs up, so the run fails as an SSH failure, exit 1)."""
    out, took = pyinfra("-y", "inventory/ct200.py", "deploy/serve.py",
                        env={"CT200_HOST": NOWHERE, "CT200_PORT": str(listener.port), "CT200_PROFILE": "nvfp4-ctx8k",
                             "DSV4_PROFILES_DIR": str(pinned)})
    assert out.returncode == 1, out.text
    assert "inventory/ct200.py: profile nvfp4-ctx8k (from CT200_PROFILE)\n" in out.text
    assert "Connecting" in out.text
    assert listener.accepted >= 1
    assert took < 30


def test_data_profile_overrides_the_environment(pinned):
    out, _ = pyinfra("inventory/ct200.py", "deploy/serve.py", "--data", "profile=nope",
                     env={"CT200_HOST": NOWHERE, "CT200_PROFILE": "nvfp4-ctx8k", "DSV4_PROFILES_DIR": str(pinned)})
    assert out.returncode == 2
    assert "profile nope (from --data profile=) cannot be deployed" in out.text
    assert "no profile named 'nope'" in out.text and "Connecting" not in out.text
    clean(out)


def test_no_profile_is_refused_before_connecting():
    out, took = pyinfra("inventory/ct200.py", "deploy/serve.py", env={"CT200_HOST": NOWHERE})
    assert out.returncode == 2
    assert "no profile: set CT200_PROFILE=NAME" in out.text and "nvfp4-ctx8k" in out.text
    assert "Connecting" not in out.text and out.cpu_s < 5
    clean(out)


def test_an_invalid_profile_is_refused_with_file_line_and_key(pinned):
    (pinned / "oom.yaml").write_text("extends: nvfp4-ctx8k\nserver:\n  mem_fraction_static: 0.85\n")
    out, _ = pyinfra("inventory/ct200.py", "deploy/serve.py", "--data", "profile=oom",
                     env={"CT200_HOST": NOWHERE, "DSV4_PROFILES_DIR": str(pinned)})
    assert out.returncode == 2
    assert re.search(r"oom\.yaml:3: server\.mem_fraction_static: CUDA-graph capture would run out", out.text), out.text
    assert "Connecting" not in out.text
    clean(out)


def test_the_ssh_user_as_service_user_is_refused_before_connecting(pinned):
    """pyinfra's --user wins over CT200_USER, as it does for the connection."""
    out, _ = pyinfra("inventory/ct200.py", "deploy/serve.py", "--user", "sglang",
                     env={"CT200_HOST": NOWHERE, "CT200_USER": "ops", "CT200_SUDO": "1", "CT200_PROFILE": "nvfp4-ctx8k",
                          "DSV4_PROFILES_DIR": str(pinned)})
    assert out.returncode == 2, out.text
    assert re.search(r"\.yaml:\d+: service\.user: 'sglang' is the inventory's SSH user", out.text), out.text
    assert "Connecting" not in out.text
    clean(out)


@pytest.mark.parametrize("args, env", [
    ((), {"CT200_USER": "ops"}),                           # the environment's user, no CT200_SUDO
    (("--user", "ops"), {}),                               # pyinfra's --user over the default root
    ((), {"CT200_USER": "ops", "CT200_SUDO": "0"}),
])
def test_a_login_that_is_not_root_without_sudo_is_refused_before_connecting(pinned, listener, args, env):
    out, _ = pyinfra("inventory/ct200.py", "deploy/serve.py", *args,
                     env={"CT200_HOST": NOWHERE, "CT200_PORT": str(listener.port), "CT200_PROFILE": "nvfp4-ctx8k",
                          "DSV4_PROFILES_DIR": str(pinned), **env})
    assert out.returncode == 2, out.text
    said = [line for line in out.text.splitlines() if "ops" in line]
    assert said == ["inventory/ct200.py: the deploy logs in as ops without sudo, but it writes /opt, /etc, /srv, "
                    "/var/lib and systemd units as root: connect as root, or give ops passwordless sudo and use it "
                    "(CT200_SUDO=1 with inventory/ct200.py, pyinfra's --sudo, or host data _sudo: True)"], out.text
    assert "Connecting" not in out.text and listener.accepted == 0
    clean(out)


def test_a_login_through_sudo_goes_on_and_a_bad_sudo_setting_is_refused(pinned, listener):
    base = {"CT200_HOST": NOWHERE, "CT200_PORT": str(listener.port), "CT200_PROFILE": "nvfp4-ctx8k",
            "DSV4_PROFILES_DIR": str(pinned), "CT200_USER": "ops"}
    out, _ = pyinfra("-y", "inventory/ct200.py", "deploy/serve.py", "--sudo", env=base)
    assert "without sudo" not in out.text and "Connecting" in out.text, out.text
    out, _ = pyinfra("inventory/ct200.py", "deploy/serve.py", env={**base, "CT200_SUDO": "yes"})
    assert out.returncode == 2 and "inventory/ct200.py: CT200_SUDO='yes': expected 1 (through sudo) or unset" in out.text
    clean(out)


@pytest.mark.slow
def test_ssh_hostname_data_stands_in_for_ct200_host():
    out, _ = pyinfra("inventory/ct200.py", "deploy/serve.py", env={"CT200_PROFILE": "nvfp4-ctx8k"})
    assert out.returncode == 2 and "set CT200_HOST" in out.text and "--data ssh_hostname=" in out.text
    clean(out)
    out, _ = pyinfra("inventory/ct200.py", "deploy/serve.py", "--data", f"ssh_hostname={NOWHERE}",
                     env={"CT200_PROFILE": "nvfp4-ctx8k"})
    assert out.returncode == 2 and "placeholder revision" in out.text  # past the address, at the profile
    clean(out)


@pytest.mark.slow
def test_rollback_and_exec_need_no_profile(listener):
    """Only a deploy that builds its run from a profile is checked: rollback goes on to connect."""
    out, _ = pyinfra("-y", "inventory/ct200.py", "deploy/rollback.py",
                     env={"CT200_HOST": NOWHERE, "CT200_PORT": str(listener.port), "CT200_PROFILE": "nvfp4-ctx8k"})
    assert out.returncode == 1 and "Connecting" in out.text and listener.accepted >= 1, out.text
    assert "placeholder" not in out.text


def test_host_key_checking_stays_on_in_shipped_inventories():
    # the setting's name and the forbidden option are assembled here, never spelled out
    key = "_".join(("ssh", "strict", "host", "key", "checking"))
    option = "StrictHostKeyChecking"
    for name in ("ct200.py", "sim.py"):
        text = (REPO / "inventory" / name).read_text()
        values = re.findall(rf'"{key}":\s*"([^"]*)"', text)
        assert set(values) <= {"yes"}, (name, values)
        assert not re.search(rf"{option}\s*=\s*(?!yes)", text), name
    assert re.findall(rf'"{key}":\s*"([^"]*)"', (REPO / "inventory/ct200.py").read_text()) == ["yes"]


def test_sim_inventory_checks_its_profile_before_looking_for_a_twin(no_twin, profile_dir):
    profile_dir.write("oom", "extends: nvfp4-ctx8k\nserver:\n  mem_fraction_static: 0.85\n")
    out, took = pyinfra("inventory/sim.py", "deploy/serve.py", "--data", "profile=oom",
                        env={**no_twin, "DSV4_PROFILES_DIR": str(profile_dir.path)})
    assert out.returncode == 2 and "CUDA-graph capture would run out" in out.text and out.cpu_s < 5
    clean(out)


@pytest.mark.parametrize("inventory", ["inventory/sim.py", "inventory/fleet-sim.py"])
def test_the_twins_inventories_refuse_an_unknown_launch_check(no_twin, inventory):
    out, _ = pyinfra(inventory, "deploy/serve.py", env={**no_twin, "DSV4_SIM_LAUNCH_CHECK": "real"})
    assert out.returncode == 2 and "DSV4_SIM_LAUNCH_CHECK='real': expected 'sglang'" in out.text, out.text[-2000:]
    assert out.cpu_s < 5
    clean(out)


def test_sim_inventory_keeps_its_default_and_the_placeholder(no_twin):
    out, _ = pyinfra("inventory/sim.py", "deploy/serve.py", env=no_twin)
    assert "inventory/sim.py: profile nvfp4-ctx8k (from the inventory's default)" in out.text
    assert "placeholder" not in out.text
    assert out.returncode == 1 and "no CT200 twin is running" in out.text
    clean(out)


# --- (8) history and bench on a host that does not answer -------------------------------------

@pytest.mark.parametrize("cmd", [["history"], ["history", "--json"], ["bench", "nvfp4-ctx8k"]])
def test_history_and_bench_on_an_unreachable_host(cmd):
    out, took = run([str(BIN / "dsv4deploy"), *cmd, "--inventory", "inventory/ct200.py"], env={"CT200_HOST": NOWHERE})
    assert out.returncode == 1, out.text
    assert f"cannot reach {NOWHERE} over SSH" in out.stderr and "Unable to connect to port 22" in out.stderr
    assert out.stdout == ""
    clean(out)
    assert took < 10


@pytest.mark.parametrize("env, says", [
    ({}, "set CT200_HOST"),
    ({"CT200_HOST": NOWHERE, "CT200_PORT": "ssh"}, "CT200_PORT='ssh': not a port number"),
])
@pytest.mark.slow
def test_history_with_an_inventory_that_refuses_to_load(env, says):
    out, _ = run([str(BIN / "dsv4deploy"), "history", "--inventory", "inventory/ct200.py"], env=env)
    assert out.returncode == 1 and says in out.stderr
    clean(out)


def test_history_with_no_twin_running(no_twin):
    """The case that used to end in a traceback: the inventory's exception, wrapped by pyinfra's
    CLI in an error that has no message of its own."""
    out, _ = run([str(BIN / "dsv4deploy"), "history", "--inventory", "inventory/sim.py"], env=no_twin)
    assert out.returncode == 1 and "inventory/sim.py: no CT200 twin is running" in out.stderr
    clean(out)


def test_history_with_no_such_inventory():
    out, _ = run([str(BIN / "dsv4deploy"), "history", "--inventory", "inventory/nope.py"])
    assert out.returncode == 1 and "inventory/nope.py: no such inventory file" in out.stderr
    clean(out)


# --- (8) make ---------------------------------------------------------------------------------

def make(*args: str, env: dict | None = None):
    return run(["make", *args], env=env)


def test_make_requires_profile_for_a_real_inventory():
    for target in ("deploy", "plan", "validate", "render", "bench"):
        out, _ = make("-n", target, "INVENTORY=inventory/ct200.py")
        assert out.returncode == 2, (target, out.text)
        assert "PROFILE=NAME is required with INVENTORY=inventory/ct200.py" in out.text and "nvfp4-ctx8k" in out.text


def test_make_real_deploy_passes_args_and_installs_no_twin_packages():
    out, _ = make("-n", "-B", "deploy", "PROFILE=nvfp4-ctx8k", "INVENTORY=inventory/ct200.py",
                  "ARGS=--data allow_reboot=true")
    assert out.returncode == 0, out.text
    assert (".venv/bin/pyinfra -y inventory/ct200.py deploy/serve.py --data profile=nvfp4-ctx8k "
            "--data allow_reboot=true") in out.stdout
    assert "--require-hashes -r requirements.lock" in out.stdout     # the venv, the lock's files, hash-checked
    for twin_only in ("mmdebstrap", "apt-get", "ct200twin up"):
        assert twin_only not in out.stdout


def test_make_twin_targets_install_the_twin_packages():
    for args in (["deploy"], ["test"], ["sim-up"], ["rollback"], ["deploy", "INVENTORY=./inventory/sim.py"]):
        out, _ = make("-n", "-B", *args)
        assert out.returncode == 0, out.text
        assert "mmdebstrap" in out.stdout and "systemd-container" in out.stdout, args
    out, _ = make("-n", "-B", "deploy")
    assert "--data profile=nvfp4-ctx8k" in out.stdout and "-m ct200twin up" in out.stdout  # the twin keeps its default


def test_make_rollback_and_history_pass_args():
    out, _ = make("-n", "rollback", "INVENTORY=inventory/ct200.py", "TO=3", "ARGS=--data break_lock=true")
    assert ".venv/bin/pyinfra -y inventory/ct200.py deploy/rollback.py --data to=3 --data break_lock=true" in out.stdout
    assert "mmdebstrap" not in out.stdout
    out, _ = make("-n", "history", "INVENTORY=inventory/ct200.py", "ARGS=--json")
    assert ".venv/bin/dsv4deploy history --inventory inventory/ct200.py --json" in out.stdout


def _venv_current() -> bool:
    return subprocess.run(["make", "-q", "venv"], cwd=REPO, capture_output=True, env=clean_env()).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _venv_current(), reason="make would (re)build .venv first; run `make venv`")
def test_make_deploy_to_the_real_inventory_refuses_the_placeholder_before_connecting():
    out, took = make("deploy", "PROFILE=nvfp4-ctx8k", "INVENTORY=inventory/ct200.py", env={"CT200_HOST": NOWHERE})
    assert out.returncode == 2
    assert "placeholder revision" in out.text and "Connecting" not in out.text and "apt-get" not in out.text
    clean(out)
    assert took < 10


@pytest.mark.skipif(not _venv_current(), reason="make would (re)build .venv first; run `make venv`")
def test_make_history_on_an_unreachable_host():
    out, _ = make("history", "INVENTORY=inventory/ct200.py", env={"CT200_HOST": NOWHERE})
    assert out.returncode != 0 and f"cannot reach {NOWHERE} over SSH" in out.text
    clean(out)


def _lock_entries() -> list[tuple[str, str, str, list[str]]]:
    """requirements.lock as (name, version, marker, sha256s): one entry per pinned line, its
    continuation lines (`\\` then `--hash=sha256:...`) joined."""
    text = re.sub(r"\\\n\s*", " ", (REPO / "requirements.lock").read_text())
    entries = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        words = line.split()
        hashes = [w.removeprefix("--hash=sha256:") for w in words if w.startswith("--hash=sha256:")]
        spec = " ".join(w for w in words if not w.startswith("--hash="))
        pin, _, marker = spec.partition(";")
        name, _, version = pin.strip().partition("==")
        assert version and re.fullmatch(r"[A-Za-z0-9_.\-]+", name), line
        entries.append((name.lower().replace("_", "-").replace(".", "-"), version.strip(), marker.strip(), hashes))
    return entries


def test_the_lock_pins_every_dependency_within_pyproject_ranges_each_file_by_its_hash():
    from packaging.markers import Marker
    from packaging.requirements import Requirement

    entries = _lock_entries()
    assert [e for e in entries if not e[3] or not all(re.fullmatch(r"[0-9a-f]{64}", h) for h in e[3])] == []
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    wanted = (project["project"]["dependencies"] + project["build-system"]["requires"]
              + [r for extra in ("test", "twin") for r in project["project"]["optional-dependencies"][extra]])
    for python in ("3.11", "3.12", "3.13"):       # --universal: one version per package for each Python
        env = {"python_version": python, "python_full_version": python + ".0", "sys_platform": "linux",
               "platform_machine": "x86_64", "platform_python_implementation": "CPython", "implementation_name": "cpython"}
        pins = {}
        for name, version, marker, _ in entries:
            if not marker or Marker(marker).evaluate(env):
                assert name not in pins, f"{name} pinned twice for Python {python}"
                pins[name] = version
        for text in wanted:
            req = Requirement(text)
            name = req.name.lower().replace("_", "-")
            assert name in pins, f"{name} is not in requirements.lock for Python {python}: run make lock"
            assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} is outside {req.specifier}"
        assert "dsv4deploy" not in pins
    makefile = (REPO / "Makefile").read_text()
    assert "--require-hashes -r $(LOCK)" in makefile and "--no-deps --no-build-isolation -e ." in makefile


# --- pure helpers -----------------------------------------------------------------------------

def test_cli_data_reads_data_as_pyinfra_will():
    params = {"data": ("profile=a", "x=1", "flag=true", "profile=b", "junk", "url=a=b")}
    assert inventories.cli_data(params) == {"profile": "b", "x": 1, "flag": True, "url": "a=b"}
    assert inventories.cli_data(None) == {} and inventories.cli_data({"data": ()}) == {}


def test_choose_profile_order():
    env = {"CT200_PROFILE": "from-ct200", "PROFILE": "from-profile"}
    names = ("CT200_PROFILE", "PROFILE")
    assert inventories.choose_profile({"profile": "d"}, env, names) == ("d", "--data profile=")
    assert inventories.choose_profile({}, env, names) == ("from-ct200", "CT200_PROFILE")
    assert inventories.choose_profile({}, {"PROFILE": "p", "CT200_PROFILE": " "}, names) == ("p", "PROFILE")
    assert inventories.choose_profile({}, {}, names) == (None, "")
    assert inventories.choose_profile({}, {}, names, default="x") == ("x", "the inventory's default")
    assert inventories.choose_profile({"profile": ""}, env, names) == (None, "--data profile=")
    assert inventories.choose_profile({"profile": 123}, env, names) == ("123", "--data profile=")


def test_deploys_a_profile(tmp_path):
    (tmp_path / "serve.py").write_text("rollout = rollout_for(host.data)\n")
    (tmp_path / "other.py").write_text("tasks.manual_rollback(None)\n")
    assert inventories.deploys_a_profile(["serve.py"], tmp_path)
    assert inventories.deploys_a_profile(["other.py", str(tmp_path / "serve.py")], "/")
    assert not inventories.deploys_a_profile(["other.py", "missing.py", "exec", "debug-inventory"], tmp_path)
    assert inventories.deploys_a_profile(["deploy/serve.py"], REPO)
    assert not inventories.deploys_a_profile(["deploy/rollback.py"], REPO)


def test_placeholder_is_an_error_only_without_a_weights_stand_in(pinned, monkeypatch):
    problems = inventories.deploy_problems("nvfp4-ctx8k", profiles_dir(), weights_stand_in=False)
    assert [p.path for p in problems] == ["model.revision"] and problems[0].severity == "error"
    assert problems[0].file == "profiles/_ct200-base.yaml" and problems[0].line
    assert inventories.deploy_problems("nvfp4-ctx8k", profiles_dir(), weights_stand_in=True) == []
    assert inventories.deploy_problems("nvfp4-ctx8k", pinned, weights_stand_in=False) == []
    assert "no profile named" in str(inventories.deploy_problems("nope", profiles_dir(), weights_stand_in=True)[0])


def test_the_inventory_s_ssh_user_cannot_be_the_service_user(pinned):
    """The shipped profiles run as sglang: an inventory logging in as sglang is refused before it
    connects (its message names file, line and key), and again at deploy time from the host data."""
    from pyinfra.api import DeployError

    from dsv4deploy.release.rollout import rollout_for

    problems = inventories.deploy_problems("nvfp4-ctx8k", pinned, weights_stand_in=False, ssh_user="sglang")
    assert [p.path for p in problems] == ["service.user"] and "the inventory's SSH user" in str(problems[0])
    assert inventories.deploy_problems("nvfp4-ctx8k", pinned, weights_stand_in=False, ssh_user="deploy") == []
    with pytest.raises(DeployError, match="'sglang' is the inventory's SSH user"):
        rollout_for({"profile": "nvfp4-ctx8k", "weights_source": {"type": "hf"}, "ssh_user": "sglang",
                     "settings": settings()})


def test_rollout_for_refuses_the_placeholder_without_a_weights_source():
    from pyinfra.api import DeployError

    from dsv4deploy.release.rollout import rollout_for

    with pytest.raises(DeployError, match="placeholder revision"):
        rollout_for({"profile": "nvfp4-ctx8k", "settings": settings()})
    assert rollout_for({"profile": "nvfp4-ctx8k", "weights_source": {"type": "hf"},
                        "settings": settings()}).profile.name == "nvfp4-ctx8k"


def test_not_under_the_pyinfra_cli():
    import click

    assert inventories.pyinfra_cli_params() is None

    @click.command()
    def other():
        assert inventories.pyinfra_cli_params() is None

    other.main([], standalone_mode=False)
    with pytest.raises(Exception, match="set it"):
        inventories.refuse("inv.py", ["set it"], cli=False)


def test_parse_cli_arg_matches_pyinfra():
    """Same rules as pyinfra_cli.util.parse_cli_arg (compared in a child: importing pyinfra_cli
    monkey-patches the process with gevent)."""
    values = ["true", "False", "12", "-3", "1.5", '{"a": 1}', "[1]", "null", "nvfp4-ctx8k", "", "a=b", "0x10"]
    code = ("import json, sys; from pyinfra_cli.util import parse_cli_arg; "
            "print(json.dumps([parse_cli_arg(v) for v in json.loads(sys.argv[1])]))")
    child = subprocess.run([str(BIN / "python"), "-c", code, json.dumps(values)], capture_output=True, text=True,
                           check=True)
    assert json.loads(child.stdout.splitlines()[-1]) == [inventories.parse_cli_arg(v) for v in values]


def test_history_when_the_inventory_raises_something_unexpected(tmp_path):
    """pyinfra's CLI wraps an inventory's own exception in an error whose __str__ breaks."""
    inv = tmp_path / "broken.py"
    inv.write_text("raise RuntimeError('the inventory broke')\n")
    out, _ = run([str(BIN / "dsv4deploy"), "history", "--inventory", str(inv)])
    assert out.returncode == 1 and "RuntimeError: the inventory broke" in out.stderr, out.text
    clean(out)


def test_describe_never_breaks():
    import click

    class Broken(Exception):
        def __str__(self):
            raise AttributeError("no message")

    class Wrapped(click.ClickException):  # like pyinfra_cli's UnexpectedExternalError
        def __init__(self, e, filename):
            self.exception, self.filename = e, filename

    wrapped = Wrapped(RuntimeError("no CT200 twin is running"), "inventory/sim.py")
    with pytest.raises(AttributeError):
        str(wrapped)  # the reason describe() exists
    assert describe(wrapped) == "RuntimeError: no CT200 twin is running"
    assert describe(Broken("x")) == "x"
    assert describe(Broken()) == "Broken"
    assert describe(ValueError("a\n b")) == "ValueError: a b"


def test_rerun_messages_name_the_make_form():
    assert rerun_with("allow_reboot=true", "deploy PROFILE=p") == (
        'run again with --data allow_reboot=true (through make: make deploy PROFILE=p ARGS="--data allow_reboot=true")')
    from dsv4deploy.profile.errors import make_target

    assert make_target("deploy nvfp4-ctx8k") == "deploy PROFILE=nvfp4-ctx8k" and make_target("rollback") == "rollback"
    for path in (REPO / "dsv4deploy" / "tasks").glob("*.py"):
        assert "again with --data" not in path.read_text(), f"{path.name}: use errors.rerun_with (names the make form)"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


def test_make_plan_boots_no_twin_but_deploy_does():
    """`make plan` reads the host and changes nothing: against the twin it plans what is running
    (or says no twin runs); only `make deploy` brings one up."""
    plan = subprocess.run(["make", "-n", "plan", "PROFILE=nvfp4-ctx8k"], cwd=REPO, capture_output=True, text=True,
                          env=clean_env())
    deploy = subprocess.run(["make", "-n", "deploy", "PROFILE=nvfp4-ctx8k"], cwd=REPO, capture_output=True,
                            text=True, env=clean_env())
    assert plan.returncode == 0 and deploy.returncode == 0
    assert "--dry --diff" in plan.stdout and "ct200twin up" not in plan.stdout
    assert "-m ct200twin up" in deploy.stdout
