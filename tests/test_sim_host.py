"""The CT200 twin host: lifecycle, ssh with host-key checking, nvidia-smi there, pyinfra inventory.

The first group is pure (no twin).  The rest boots twin-1 (and briefly twin-2)
with systemd-nspawn; those skip only when not root.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from ct200twin import cli as simcli
from ct200twin.host import machines as simhost
from sim_fixtures import needs_root, sim_twin  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
PYINFRA = [sys.executable, "-m", "pyinfra"]


# ----------------------------------------------------------------- pure

def test_addresses_and_state_layout(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4_SIM_DIR", str(tmp_path))
    h = simhost.SimHost(1)
    assert (h.name, h.address) == ("twin-1", "127.0.0.2")
    assert simhost.SimHost(3).address == "127.0.0.4"
    assert h.pid_file == tmp_path / "hosts/twin-1/nspawn.pid"
    assert h.console_log == tmp_path / "hosts/twin-1/console.log"
    assert simhost.known_hosts_file() == tmp_path / "ssh/known_hosts"
    monkeypatch.delenv("DSV4_SIM_DIR")
    assert simhost.sim_dir() == REPO / ".sim"


def test_a_twin_with_a_fault_file_is_named_at_up(tmp_path, monkeypatch, caplog):
    """A fault file left in a twin's root (a cut-off bench, the fault lab) changes how its server
    starts and serves: `sim up` says so, with what it sets; a twin without one says nothing."""
    monkeypatch.setenv("DSV4_SIM_DIR", str(tmp_path))
    twin = simhost.SimHost(1)
    faults = twin.root / "etc/dsv4deploy-twin/faults.json"
    faults.parent.mkdir(parents=True)
    with caplog.at_level("WARNING", logger="ct200twin.host"):
        simhost._warn_faults(twin)
        assert caplog.records == []
        faults.write_text('{"load_seconds": 0.5,\n "warmup_seconds": 0.3}\n')
        simhost._warn_faults(twin)
    (record,) = caplog.records
    assert record.getMessage().startswith('twin-1: /etc/dsv4deploy-twin/faults.json sets {"load_seconds": 0.5, '
                                          '"warmup_seconds": 0.3}: its server starts and serves with them')


def test_a_fault_file_planted_as_a_link_or_a_fifo_is_not_read(tmp_path, monkeypatch, caplog):
    """Code in the twin runs as root and may leave a link to a file of this machine (a key, a
    token) where the fault file goes, or a FIFO that would block `sim up`: neither is read or
    printed. Bytes that are not UTF-8 are printed replaced, not raised."""
    monkeypatch.setenv("DSV4_SIM_DIR", str(tmp_path))
    twin = simhost.SimHost(1)
    secret = tmp_path / "control-node-secret"
    secret.write_text("hf_SECRET")
    folder = twin.root / "etc/dsv4deploy-twin"
    folder.mkdir(parents=True)
    faults = folder / "faults.json"
    with caplog.at_level("WARNING", logger="ct200twin.host"):
        faults.symlink_to(secret)
        simhost._warn_faults(twin)
        faults.unlink()
        os.mkfifo(faults)
        simhost._warn_faults(twin)                  # returns: the FIFO is opened non-blocking, not read
        faults.unlink()
        folder.rmdir()
        (tmp_path / "elsewhere").mkdir()
        (tmp_path / "elsewhere/faults.json").write_text("hf_SECRET")
        folder.symlink_to(tmp_path / "elsewhere")   # a linked folder leads out of the root
        simhost._warn_faults(twin)
        assert caplog.records == []
        folder.unlink()
        folder.mkdir()
        faults.write_bytes(b'{"load_seconds": \xff1}' + b" " * 400 + b"hf_SECRET")
        simhost._warn_faults(twin)
    (record,) = caplog.records
    assert '"load_seconds": \ufffd1}' in record.getMessage() and "SECRET" not in record.getMessage()


def test_ssh_argv_keeps_host_key_checking(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4_SIM_DIR", str(tmp_path))
    argv = simhost.SimHost(1).ssh_argv("nvidia-smi -L")
    assert argv[0] == "ssh" and argv[-2:] == ["root@127.0.0.2", "nvidia-smi -L"]
    joined = " ".join(argv)
    assert re.findall(r"StrictHostKeyChecking=(\w+)", joined) == ["yes"], "host-key checking stays on"
    assert f"UserKnownHostsFile={tmp_path}/ssh/known_hosts" in joined


def test_pid_check_is_not_fooled(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4_SIM_DIR", str(tmp_path))
    assert not simhost._is_nspawn_of(os.getpid(), "twin-1")      # alive, but not our nspawn
    h = simhost.SimHost(1)
    h.pid_file.parent.mkdir(parents=True)
    h.pid_file.write_text(f"{os.getpid()}\n")
    assert not h.running()


def test_scanning_for_twins_leaves_the_callers_children_alone():
    """Booting an isolated twin scans every PID in /proc for another twin's nspawn. The scan once
    reaped whatever it met: a deploy that the fault lab ran as a child exited 1 after a reboot,
    and its Popen then read exit 0 (the status was gone). The caller's child keeps its status."""
    child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    deadline = time.monotonic() + 10
    while simhost._proc_stat(child.pid)[0] != "Z":      # exited, not yet waited for
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert not simhost._is_nspawn_of(child.pid, "twin-1")
    assert child.wait(timeout=5) == 3


def test_writes_into_a_twin_do_not_follow_its_symlinks_out(tmp_path, monkeypatch):
    """Code in a twin runs as root; a symlink it plants must not redirect our writes here."""
    monkeypatch.setenv("DSV4_SIM_DIR", str(tmp_path / "sim"))
    h = simhost.SimHost(1)
    (h.root / "usr/sbin").mkdir(parents=True)
    (h.root / "usr/sbin/sshd").write_text("")
    (h.root / "etc").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (h.root / "etc/dsv4deploy-twin").symlink_to(outside)
    with pytest.raises(simhost.SimError, match="refusing to write"):
        h.set_gpus(count=2)
    assert list(outside.iterdir()) == []
    (h.root / "etc/dsv4deploy-twin").unlink()
    (h.root / "tmp").mkdir()
    (h.root / "etc/dsv4deploy-twin").symlink_to("../tmp")          # stays inside: fine
    assert h.set_gpus(count=2)["count"] == 2
    assert (h.root / "tmp/gpus.json").exists() and (h.root / "usr/bin/nvidia-smi").exists()


def test_a_twins_gpus_change_while_another_process_boots_a_twin(tmp_path, monkeypatch):
    """`up` holds the twins' state lock through a whole boot, and make test's processes boot twins
    while the lab's tests reset their own twin's GPUs: set_gpus does not wait for that lock."""
    monkeypatch.setenv("DSV4_SIM_DIR", str(tmp_path / "sim"))
    h = simhost.SimHost(1, "lab")
    (h.root / "usr/sbin").mkdir(parents=True)
    (h.root / "usr/sbin/sshd").write_text("")
    done: list = []
    worker = threading.Thread(target=lambda: done.append(h.set_gpus(count=2)["count"]))
    with simhost._locked():                 # as another process's `up` holds it
        worker.start()
        worker.join(timeout=30)
        assert done == [2] and h.gpus()["count"] == 2
    worker.join()


def test_inventory_without_twins_says_make_sim_up(tmp_path, monkeypatch):
    monkeypatch.setenv("DSV4_SIM_DIR", str(tmp_path))
    from pyinfra.api.exceptions import InventoryError

    with pytest.raises(InventoryError, match="make sim-up"):
        exec(compile((REPO / "inventory/sim.py").read_text(), str(REPO / "inventory/sim.py"), "exec"),
             {"__file__": str(REPO / "inventory/sim.py")})


def test_cli_errors_without_root_or_tools(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("DSV4_SIM_DIR", str(tmp_path))
    monkeypatch.setattr(simhost.os, "geteuid", lambda: 1000)
    assert simcli.main(["up"]) == 1
    assert "needs root" in capsys.readouterr().err
    assert simcli.main(["down"]) == 1
    monkeypatch.setattr(simhost.os, "geteuid", lambda: 0)
    monkeypatch.setattr(simhost.shutil, "which", lambda name: None)
    assert simcli.main(["up"]) == 1
    err = capsys.readouterr().err
    assert "mmdebstrap" in err and "systemd-container" in err and "Traceback" not in err


def test_cli_bad_input_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DSV4_SIM_DIR", str(tmp_path))
    with pytest.raises(SystemExit) as e:
        simcli.main(["up", "--hosts", "0"])
    assert e.value.code == 2
    assert simcli.main(["gpus", "--driver", "latest"]) == 2
    assert simcli.main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["twins"] == []


FAKE_SSH = """#!/bin/sh
# stands in for ssh: logs its argv; a call through a shared connection fails as ssh's mux does
echo "$*" >> "$SSH_LOG"
case "$*" in
  *ControlMaster=auto*) [ -n "$MUX_FAILS" ] && { echo "mux_client_request_session: session request failed" >&2; exit 255; } ;;
esac
for last; do :; done
echo "ran: $last"
"""


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    """`ssh` on PATH is FAKE_SSH; the sim folder is short enough for a socket path (pytest's
    tmp_path is not)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "ssh").write_text(FAKE_SSH)
    (bin_dir / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SSH_LOG", str(tmp_path / "ssh.log"))
    sim = Path(tempfile.mkdtemp(prefix="sim-", dir="/tmp"))
    monkeypatch.setenv("DSV4_SIM_DIR", str(sim))
    yield tmp_path / "ssh.log", sim
    shutil.rmtree(sim, ignore_errors=True)


def test_commands_share_one_connection_and_a_refused_share_gets_its_own(fake_ssh, monkeypatch):
    """SimHost.run goes through ssh's shared connection (ControlMaster, its socket in the sim's
    ssh folder); where ssh cannot share it, the same command runs on a connection of its own.
    ssh_argv (`ct200twin ssh`, the host-key test) never shares one."""
    log, sim = fake_ssh
    twin = simhost.SimHost(1)
    assert twin.run("hostname").stdout.strip() == "ran: hostname"
    (line,) = log.read_text().splitlines()
    assert "ControlMaster=auto" in line and f"ControlPath={sim}/ssh/cm-%C" in line
    assert "StrictHostKeyChecking=yes" in line
    assert not any("Control" in a for a in twin.ssh_argv("true"))
    log.unlink()
    monkeypatch.setenv("MUX_FAILS", "1")
    assert twin.run("hostname").stdout.strip() == "ran: hostname"
    first, second = log.read_text().splitlines()
    assert "ControlMaster=auto" in first and "Control" not in second


def test_a_sim_folder_too_deep_for_a_socket_shares_no_connection(tmp_path, monkeypatch):
    deep = tmp_path / ("d" * 90)
    monkeypatch.setenv("DSV4_SIM_DIR", str(deep))
    assert simhost.SimHost(1).shared_ssh_options() == []


# ----------------------------------------------------------- on a twin

def _ssh(twin, cmd, **kw):
    return subprocess.run(twin.ssh_argv(cmd), capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, **kw)


@pytest.mark.slow
def test_ssh_with_host_key_checking(sim_twin, tmp_path):
    proc = _ssh(sim_twin, "hostname; systemctl is-system-running --wait")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["twin-1", "running"]
    kh = simhost.known_hosts_file().read_text()
    assert any(line.startswith("127.0.0.2 ssh-ed25519 ") for line in kh.splitlines())
    # another key for 127.0.0.2 in known_hosts: ssh refuses
    other = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    bad = tmp_path / "known_hosts"
    bad.write_text("127.0.0.2 " + " ".join(other.with_suffix(".pub").read_text().split()[:2]) + "\n")
    argv = [a.replace(str(simhost.known_hosts_file()), str(bad)) for a in sim_twin.ssh_argv("true")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert proc.returncode == 255 and "Host key verification failed" in proc.stderr


@pytest.mark.slow
def test_up_again_is_a_no_op(sim_twin):
    pid = sim_twin.pid
    t0 = time.monotonic()
    assert simhost.up(1)[0].pid == pid
    assert time.monotonic() - t0 < 10
    row = {r["name"]: r for r in simhost.status()}["twin-1"]
    assert row["running"] and row["ssh"] and row["pid"] == pid and row["address"] == "127.0.0.2"


@pytest.mark.slow
def test_nvidia_smi_on_the_twin(sim_twin):
    out = sim_twin.run("nvidia-smi -L").stdout.splitlines()
    assert len(out) == 8 and all("NVIDIA RTX PRO 6000 Blackwell Server Edition" in ln for ln in out)
    q = sim_twin.run("nvidia-smi --query-gpu=index,compute_cap,memory.total,driver_version "
                     "--format=csv,noheader,nounits").stdout.splitlines()
    assert q == [f"{i}, 12.0, 97887, 580.95.05" for i in range(8)]
    assert sim_twin.run("stat -c %a /usr/bin/nvidia-smi").stdout.strip() == "755"


@pytest.mark.slow
def test_gpu_settings_change_the_answer(sim_twin, capsys):
    try:
        sim_twin.set_gpus(count=2, memory_mib=48000)
        assert sim_twin.run("nvidia-smi --query-gpu=memory.total --format=csv,noheader").stdout == \
            "48000 MiB\n48000 MiB\n"
        # no driver: the command is gone
        assert simcli.main(["gpus", "--host", "1", "--no-driver"]) == 0
        assert json.loads(capsys.readouterr().out)["driver_installed"] is False
        proc = sim_twin.run("nvidia-smi -L", check=False)
        assert proc.returncode == 127
        # the twin's stand-in for a driver install brings it back
        sim_twin.run("dsv4deploy-twin-driver install 580.95.05")
        assert sim_twin.run("nvidia-smi --query-gpu=count --format=csv,noheader").stdout.split()[0] == "2"
        assert sim_twin.gpus()["driver_installed"] is True
    finally:
        sim_twin.set_gpus(reset=True)
    assert len(sim_twin.run("nvidia-smi -L").stdout.splitlines()) == 8


@pytest.mark.slow
def test_write_file_and_registries(sim_twin):
    sim_twin.write_file("/tmp/dsv4/hello.txt", "hi\n", mode=0o600)
    assert sim_twin.read_file("/tmp/dsv4/hello.txt") == "hi\n"
    assert sim_twin.run("stat -c %a /tmp/dsv4/hello.txt").stdout.strip() == "600"
    # apt and PyPI are reachable (CA bundle, resolv.conf, mirrors carried in); pip itself is the
    # deploy's business (the root has none: it installs python3-venv)
    sim_twin.run("apt-get update -q", timeout=300)
    sim_twin.run("python3 -c \"import urllib.request; urllib.request.urlopen('https://pypi.org/simple/six/', "
                 "timeout=60).read(64)\"", timeout=120)


@pytest.mark.slow
def test_the_twin_root_is_a_bare_server_install(sim_twin):
    """What a fresh server has (systemd, sshd, python3, sudo) and nothing the deploy installs
    itself: no venv module, no pip, no curl, no patch in the cached root."""
    root = simhost.rootfs_dir()
    for present in ("usr/bin/python3", "usr/sbin/sshd", "usr/bin/sudo", "usr/bin/systemctl", "usr/bin/ss"):
        assert (root / present).exists(), present
    for absent in ("usr/bin/curl", "usr/bin/patch", "usr/bin/pip3"):
        assert not (root / absent).exists(), absent
    assert not list(root.glob("usr/lib/python3*/ensurepip/_bundled/*.whl")), "python3-venv is the deploy's to install"
    assert sim_twin.run("sudo -n -u deploy sudo -n true", check=False).returncode == 0   # the operator's sudo


@pytest.mark.slow
def test_pyinfra_inventory_exec_and_deploy(sim_twin, tmp_path):
    proc = subprocess.run(PYINFRA + ["-y", "inventory/sim.py", "exec", "--", "nvidia-smi", "-L"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (proc.stdout + proc.stderr).count("[127.0.0.2] GPU ") == 8
    deploy = tmp_path / "sleep_unit.py"
    deploy.write_text(
        "from io import StringIO\n"
        "from pyinfra.operations import files, server, systemd\n"
        "files.put(name='unit', dest='/etc/systemd/system/dsv4-twin-test.service', mode='644',\n"
        "    src=StringIO('[Unit]\\nDescription=twin test\\n[Service]\\nExecStart=/bin/sleep infinity\\n'\n"
        "                 '[Install]\\nWantedBy=multi-user.target\\n'))\n"
        "systemd.service(name='start', service='dsv4-twin-test.service', running=True, enabled=True,\n"
        "                daemon_reload=True)\n"
        "server.shell(name='check', commands=['systemctl is-active dsv4-twin-test.service'])\n")
    try:
        proc = subprocess.run(PYINFRA + ["-y", "inventory/sim.py", str(deploy)],
                              cwd=REPO, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert sim_twin.run("systemctl is-active dsv4-twin-test.service").stdout.strip() == "active"
    finally:
        sim_twin.run("systemctl disable --now dsv4-twin-test.service; "
                     "rm -f /etc/systemd/system/dsv4-twin-test.service; systemctl daemon-reload", check=False)


def _nspawn_pids(name: str) -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and simhost._is_nspawn_of(int(p.name), name):
            out.append(int(p.name))
    return out


@pytest.mark.slow
def test_second_twin_is_separate_and_down_stops_it_by_pid(sim_twin):
    twin2 = simhost.up(2)[1]
    try:
        assert (twin2.name, twin2.address) == ("twin-2", "127.0.0.3")
        assert twin2.run("hostname").stdout.strip() == "twin-2"
        assert twin2.root != sim_twin.root
        twin2.set_gpus(count=1)
        assert len(twin2.run("nvidia-smi -L").stdout.splitlines()) == 1
        assert len(sim_twin.run("nvidia-smi -L").stdout.splitlines()) == 8
        pid = twin2.pid
        assert _nspawn_pids("twin-2") == [pid]
        assert simhost.down([2]) == ["twin-2"]
        assert not Path(f"/proc/{pid}").exists() or simhost._proc_stat(pid)[0] == "Z"
        assert _nspawn_pids("twin-2") == []
        assert not twin2.pid_file.exists() and not twin2.running()
        assert not simhost._port_in_use("127.0.0.3")
        assert simhost.down([2]) == []                                  # idempotent
        assert sim_twin.running() and sim_twin.ssh_ok()
    finally:
        if twin2.running():
            simhost.down([2])
        twin2.set_gpus(reset=True)


@pytest.mark.slow
def test_a_container_whose_nspawn_was_killed_is_cleared_by_up_and_by_down(sim_twin):
    """nspawn SIGKILLed: its container goes on holding the twin's address. `up` boots anew
    anyway, and `down` ends an orphan too, so no twin process outlives the state that owns it."""
    twin2 = simhost.up(2)[1]
    try:
        for again in ("up", "down"):
            os.kill(twin2.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while twin2.running() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not twin2.running()
            inits = simhost._container_inits(twin2.root)
            assert len(inits) == 1 and simhost._port_in_use("127.0.0.3")    # the orphan holds it
            if again == "up":
                assert simhost.up(2)[1].ssh_ok()
                assert not Path(f"/proc/{inits[0]}").exists() or simhost._proc_stat(inits[0])[0] == "Z"
            else:
                assert simhost.down([2]) == ["twin-2"]
                assert simhost._container_inits(twin2.root) == []
                assert not simhost._port_in_use("127.0.0.3")
        assert sim_twin.running() and sim_twin.ssh_ok()
    finally:
        if twin2.running():
            simhost.down([2])
