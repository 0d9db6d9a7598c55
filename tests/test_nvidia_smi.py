"""The twin's fake nvidia-smi: output formats as the real tool prints them (pure, no twin)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ct200twin.host import nvidia_smi as smi

SCRIPT = Path(smi.__file__)
NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
UUID_RE = r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"


def run(*argv, **settings):
    s = dict(smi.DEFAULTS, **settings)
    try:
        return smi.run(list(argv), s)
    except smi.Exit as e:
        return e.code, e.message


def test_query_gpu_csv_like_the_real_tool():
    code, out = run("--query-gpu=index,name,uuid,compute_cap,memory.total,memory.used,driver_version",
                    "--format=csv")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == ("index, name, uuid, compute_cap, memory.total [MiB], memory.used [MiB], "
                        "driver_version")
    assert len(lines) == 9
    for i, line in enumerate(lines[1:]):
        idx, name, uuid, cc, total, used, drv = line.split(", ")
        assert (idx, name, cc, total, used, drv) == (str(i), NAME, "12.0", "97887 MiB", "0 MiB", "580.95.05")
        assert re.fullmatch(UUID_RE, uuid)


def test_noheader_nounits_and_field_order():
    code, out = run("--query-gpu=memory.total,index", "--format=csv,noheader,nounits")
    assert code == 0 and out.splitlines()[:2] == ["97887, 0", "97887, 1"]
    _, out = run("--query-gpu=memory.total", "--format=csv,noheader")
    assert out.splitlines()[0] == "97887 MiB"
    # nounits keeps the unit in the header, as the real tool does
    _, out = run("--query-gpu=memory.used,memory.free,pci.bus_id,count", "--format=csv,nounits",
                 memory_used_mib=1000)
    assert out.splitlines()[:2] == ["memory.used [MiB], memory.free [MiB], pci.bus_id, count",
                                    "1000, 96887, 00000000:01:00.0, 8"]


def test_space_separated_options_aliases_and_default_format():
    code, out = run("--query-gpu", "gpu_name,gpu_uuid,gpu_bus_id", "--format", "csv")
    assert code == 0 and out.splitlines()[0] == "name, uuid, pci.bus_id"
    _, out = run("--query-gpu=name")                     # no --format: csv with header
    assert out.splitlines()[:2] == ["name", NAME]


def test_select_with_i():
    _, out = run("--query-gpu=index", "--format=csv,noheader", "-i", "0,3")
    assert out.split() == ["0", "3"]
    _, out = run("--query-gpu=index", "--format=csv,noheader", "--id=5")
    assert out.split() == ["5"]
    assert run("-i", "9")[0] == 6


def test_list_gpus_deterministic_uuids():
    code, out = run("-L")
    lines = out.splitlines()
    assert code == 0 and len(lines) == 8
    assert re.fullmatch(rf"GPU 0: {NAME} \(UUID: {UUID_RE}\)", lines[0])
    assert run("-L")[1] == out                                   # stable
    assert run("-L", uuid_seed="twin-2")[1] != out               # per twin
    assert len({ln.split("UUID: ")[1] for ln in lines}) == 8     # distinct


def test_version():
    code, out = run("--version")
    assert code == 0
    assert out == ("NVIDIA-SMI version  : 580.95.05\nNVML version        : 580.95\n"
                   "DRIVER version      : 580.95.05\nCUDA Version        : 13.0\n")


def test_summary_table():
    code, out = run()
    assert code == 0
    lines = out.splitlines()
    assert "| NVIDIA-SMI 580.95.05" in lines[2] and "Driver Version: 580.95.05" in lines[2]
    assert "CUDA Version: 13.0" in lines[2]
    box = [ln for ln in lines[1:] if ln.startswith(("|", "+"))]
    assert all(len(ln) == 91 for ln in box), [ln for ln in box if len(ln) != 91]
    gpu_rows = [ln for ln in lines if re.match(r"\|\s+\d+\s+NVIDIA RTX PRO 6000", ln)]
    assert len(gpu_rows) == 8
    assert sum("0MiB / 97887MiB" in ln for ln in lines) == 8


def test_topo_matrix_is_pcie_only():
    code, out = run("topo", "-m")
    assert code == 0
    lines = out.splitlines()
    header = lines[0].replace("\x1b[4m", "").replace("\x1b[0m", "").split("\t")
    assert header[1:9] == [f"GPU{i}" for i in range(8)]
    rows = [ln.split("\t") for ln in lines[1:9]]
    for i, row in enumerate(rows):
        assert row[0] == f"GPU{i}"
        cells = row[1:9]
        assert cells[i] == " X "
        assert all(c in ("NODE", "SYS") for j, c in enumerate(cells) if j != i)
        assert not any(c.startswith("NV") for c in cells)
    assert rows[0][2] == "NODE" and rows[0][5] == "SYS"           # same / other NUMA node
    assert "NV#  = Connection traversing a bonded set of # NVLinks" in out


def test_settings_change_the_answer():
    _, out = run("--query-gpu=index,memory.total,memory.used", "--format=csv,noheader,nounits",
                 count=2, memory_mib=48000, memory_used_mib=[100, 200])
    assert out.splitlines() == ["0, 48000, 100", "1, 48000, 200"]
    _, out = run("--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader",
                 name="NVIDIA H200", compute_cap="9.0", driver_version="570.1.2", count=1)
    assert out == "NVIDIA H200, 9.0, 570.1.2\n"
    assert run("-L", count=0) == (6, "No devices were found\n")
    code, out = run("-L", driver_installed=False)
    assert code == 9 and "couldn't communicate with the NVIDIA driver" in out


@pytest.mark.parametrize("argv, code, message", [
    (["--bogus"], 255, "ERROR: Option --bogus is not recognized. Please run 'nvidia-smi -h'."),
    (["-x9"], 255, "ERROR: Option -x9 is not recognized."),
    (["--query-gpu=foo", "--format=csv"], 2, 'Field "foo" is not a valid field to query.'),
    (["--query-gpu=name", "--format=json"], 2, "Format modifier is not recognized."),
    (["topo", "-z"], 255, "ERROR: Option -z is not recognized."),
])
def test_errors_like_the_real_tool(argv, code, message):
    got_code, out = run(*argv)
    assert got_code == code and message in out


def test_script_is_standalone(tmp_path):
    """Copied alone into the twin: stdlib only, shebang, settings file from the env."""
    text = SCRIPT.read_text()
    assert text.startswith("#!/usr/bin/python3\n")
    assert not re.search(r"^\s*(from|import)\s+dsv4deploy", text, re.M)
    exe = tmp_path / "nvidia-smi"
    shutil.copy(SCRIPT, exe)
    settings = tmp_path / "gpus.json"
    settings.write_text(json.dumps({"count": 2, "memory_mib": 1234}))
    env = {"PATH": "/usr/bin:/bin", "DSV4_TWIN_GPUS": str(settings)}
    proc = subprocess.run([sys.executable, "-I", str(exe), "--query-gpu=index,memory.total",
                           "--format=csv,noheader"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout == "0, 1234 MiB\n1, 1234 MiB\n"
    proc = subprocess.run([sys.executable, "-I", str(exe), "--nope"], capture_output=True, text=True,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 255 and "not recognized" in proc.stdout
