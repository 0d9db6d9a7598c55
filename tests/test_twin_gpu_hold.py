"""The twin's nvidia-smi shows the GPU memory its servers hold while they run, and nothing once
they are gone (ct200twin/server/gpu_hold.py writes it, ct200twin/host/nvidia_smi.py reads it);
and the product's readers of nvidia-smi memory judge those real numbers (no twin needed here)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from ct200twin.host import nvidia_smi as smi
from ct200twin.server import gpu_hold
from ct200twin.server import memory as m
from ct200twin.server.main import LocalTwin, free_port, nvfp4_ctx8k_argv
from dsv4deploy.host.replicas import gpu_mib, gpus_free_command, held_gpus
from dsv4deploy.preflight.gpus import check_gpus, parse_query, query_args
from dsv4deploy.profile.memory_facts import CUDA_CONTEXT_GIB
from dsv4deploy.watch import units as watch_units

FAST = {"load_seconds": 0.3, "warmup_seconds": 0.2, "health_poll_seconds": 0.1}


@pytest.fixture
def holds(tmp_path, monkeypatch):
    folder = tmp_path / "holds"
    folder.mkdir()
    monkeypatch.setenv(smi.HOLDS_ENV, str(folder))
    return folder


def nvidia_smi(*argv, **settings) -> str:
    code, out = smi.run(list(argv), dict(smi.DEFAULTS, **settings))
    assert code == 0, out
    return out


def used() -> dict[int, int]:
    out = nvidia_smi("--query-gpu=index,memory.used", "--format=csv,noheader,nounits")
    return {int(i): int(u) for i, u in (line.split(", ") for line in out.splitlines())}


def write_hold(folder, pid: int, gpus: dict[str, int], start: str | None = None) -> None:
    (folder / f"{pid}.json").write_text(json.dumps({"pid": pid, "start": start, "name": "python3", "gpus": gpus}))


def gone_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_running_process_holds_its_memory_and_a_gone_or_reused_pid_holds_nothing(holds):
    me = os.getpid()
    write_hold(holds, me, {"4": 71000, "5": 71000}, start=gpu_hold.start_ticks())
    write_hold(holds, gone_pid(), {"0": 50000})                       # exited: the driver took it back
    assert used() == {0: 0, 1: 0, 2: 0, 3: 0, 4: 71000, 5: 71000, 6: 0, 7: 0}
    apps = nvidia_smi("--query-compute-apps=gpu_bus_id,pid,used_memory", "--format=csv")
    assert apps.splitlines() == ["gpu_bus_id, pid, used_memory [MiB]", f"00000000:81:00.0, {me}, 71000 MiB",
                                 f"00000000:A1:00.0, {me}, 71000 MiB"]
    assert nvidia_smi("--query-compute-apps=pid", "--format=csv,noheader", "-i", "0") == ""
    table = nvidia_smi()
    assert "71000MiB / 97887MiB" in table and f"{me}      C   python3" in table
    assert "No running processes found" not in table
    write_hold(holds, me, {"4": 71000}, start="1")                    # this PID, another process's start
    assert set(used().values()) == {0} and "No running processes found" in nvidia_smi()


def test_a_gpu_named_by_uuid_and_a_foreign_process_count_in_memory_used(holds):
    uuid = nvidia_smi("--query-gpu=uuid", "--format=csv,noheader", "-i", "6").strip()
    write_hold(holds, os.getpid(), {uuid: 30000})
    foreign = [{"gpu": 1, "pid": 4242, "used_mib": 20000}]
    out = nvidia_smi("--query-gpu=index,memory.used,memory.free", "--format=csv,noheader,nounits",
                     foreign_processes=foreign, memory_used_mib=5)
    rows = [line.split(", ") for line in out.splitlines()]
    assert rows[1] == ["1", "20005", "77882"] and rows[6] == ["6", "30005", "67882"] and rows[0] == ["0", "5", "97882"]
    with pytest.raises(smi.Exit, match='Field "nope" is not a valid field'):
        smi.run(["--query-compute-apps=pid,nope", "--format=csv"], dict(smi.DEFAULTS))


def test_the_gpus_of_a_servers_ranks():
    assert gpu_hold.server_gpus(4, 8, cuda_visible_devices="4,5,6,7") == ["4", "5", "6", "7"]
    assert gpu_hold.server_gpus(2, 8, base_gpu_id=2) == ["2", "3"]
    assert gpu_hold.server_gpus(2, 8, base_gpu_id=1, gpu_id_step=2, cuda_visible_devices="0,1,2,3") == ["1", "3"]
    assert gpu_hold.server_gpus(4, 8) == ["0", "1", "2", "3"]


def test_a_hold_is_written_for_nvidia_smi_and_nothing_without_its_folder(holds, tmp_path):
    hold = gpu_hold.GpuHold(["2", "3"], directory=str(holds))
    hold.hold(1.5)
    assert used()[2] == used()[3] == 1536 and oct((holds / f"{os.getpid()}.json").stat().st_mode & 0o777) == "0o644"
    hold.release()
    assert set(used().values()) == {0} and not list(holds.iterdir())
    elsewhere = gpu_hold.GpuHold(["0"], directory=str(tmp_path / "absent"))
    elsewhere.hold(10)
    assert not (tmp_path / "absent").exists()
    assert smi.HOLDS_DIR == gpu_hold.HOLDS_DIR and smi.HOLDS_ENV == gpu_hold.HOLDS_ENV


def serving_mib(tp: int, fraction: float) -> int:
    plan = m.plan_memory(m.MemoryInputs(gpu_mem_mib=97887, tp=tp, mem_fraction_static=fraction,
                                        cuda_graph_max_bs_decode=32))
    return int(round((CUDA_CONTEXT_GIB + plan.static_gib + plan.graph_reserve_gib) * 1024))


def test_a_server_holds_its_memory_model_on_its_visible_gpus_until_it_stops(holds):
    expected = serving_mib(4, 0.7)
    with LocalTwin(faults=FAST, env={"CUDA_VISIBLE_DEVICES": "4,5,6,7", smi.HOLDS_ENV: str(holds)}) as t:
        t.wait_ready()
        assert used() == {0: 0, 1: 0, 2: 0, 3: 0, 4: expected, 5: expected, 6: expected, 7: expected}
        # what SGLang logs as left after its pools and graphs is what nvidia-smi shows free
        available = float(re.search(r"available_gpu_mem=([0-9.]+) GB", t.output()).group(1))
        assert abs(97887 - expected - available * 1024) < 6
        pid = t.proc.pid
        apps = nvidia_smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
        assert apps.splitlines() == [f"{pid}, {expected}"] * 4
        assert t.stop() == 0
    assert set(used().values()) == {0} and not list(holds.iterdir())


def test_a_killed_server_leaves_its_file_and_holds_nothing(holds):
    with LocalTwin(faults=FAST, env={smi.HOLDS_ENV: str(holds)}) as t:
        t.wait_ready()
        assert used()[0] == serving_mib(4, 0.7) and used()[4] == 0
        t.proc.send_signal(signal.SIGKILL)
        t.proc.wait()
        assert [p.name for p in holds.iterdir()] == [f"{t.proc.pid}.json"]
        assert set(used().values()) == {0}


def test_a_server_that_ooms_at_graph_capture_gives_its_gpus_back(holds, tmp_path):
    work = tmp_path / "server"
    argv = nvfp4_ctx8k_argv(str(work / "DeepSeek-V4-Flash-NVFP4"), free_port(), mem_fraction_static=0.85)
    with LocalTwin(argv, faults=FAST, env={smi.HOLDS_ENV: str(holds)}, workdir=work) as t:
        assert t.wait_exit() != 0 and "Capture cuda graph failed" in t.output()
    assert set(used().values()) == {0} and not list(holds.iterdir())


# --- the product's readers of nvidia-smi memory, on what the twin now reports -------------------

def test_the_replicas_gpus_free_check_reports_a_gpu_still_held(holds):
    write_hold(holds, os.getpid(), {"4": 30000})
    out = nvidia_smi(*gpus_free_command([4, 5]).split()[1:])
    assert held_gpus(out) == ["GPU 4: 30000 MiB in use"] and gpu_mib(out) == {4: 30000, 5: 0}
    (holds / f"{os.getpid()}.json").unlink()
    assert held_gpus(nvidia_smi(*gpus_free_command([4, 5]).split()[1:])) == []


def test_preflight_refuses_gpus_another_process_holds(holds):
    write_hold(holds, os.getpid(), {"1": 40000})
    gpus = parse_query(nvidia_smi(*query_args()[1:]))
    problems = check_gpus(gpus, tp_size=4, min_free_mib=68521)
    assert problems == ["GPU 1 (NVIDIA RTX PRO 6000 Blackwell Server Edition): 57,887 MiB free of 97,887 MiB "
                        "(40,000 MiB in use); the profile's static budget needs 68,521 MiB (see nvidia-smi "
                        "--query-compute-apps=pid,used_memory --format=csv)"]
    assert check_gpus(gpus, tp_size=1, min_free_mib=68521) == []


def test_the_watch_counts_a_running_process_outside_the_release_as_foreign(holds, monkeypatch):
    spec = importlib.util.spec_from_file_location("watch_agent", watch_units.HERE / "agent.py")
    agent = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent)
    monkeypatch.setattr(agent, "smi", lambda args: smi.run(args, dict(smi.DEFAULTS)))
    monkeypatch.setattr(agent, "kernel_xids", lambda since: [])
    expected = [{"index": i, "uuid": nvidia_smi("--query-gpu=uuid", "--format=csv,noheader", "-i", str(i)).strip()}
                for i in (2, 3)]
    write_hold(holds, os.getpid(), {"3": 25000})
    write_hold(holds, gone_pid(), {"2": 25000})
    read = agent.read_gpus(expected, ["sglang.service"], 0)
    assert [(g["index"], g["foreign_mib"]) for g in read] == [(2, 0), (3, 25000)]
