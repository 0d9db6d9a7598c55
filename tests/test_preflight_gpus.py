"""GPU preflight: nvidia-smi parsing (recorded real outputs and odd cases) and the checks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4deploy.preflight import (QUERY_FIELDS, QUERY_FIELDS_MIG, GpuInfo, NvidiaSmiError,
                                  check_gpus, driver_branch, format_table, parse_query,
                                  profile_expectations, query_args)
from dsv4deploy.preflight.cli import main
from checkout import load_profile

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests" / "fixtures" / "nvidia-smi"
SIM = REPO / "ct200twin" / "host" / "nvidia_smi.py"
H200_UUIDS = ["GPU-13ce07fd-e804-9dcd-ccd5-fbb085353f39", "GPU-7faec530-f63c-e1d2-cc62-56a890ff514c"]


def row(**kw) -> GpuInfo:
    base = dict(index=0, name="NVIDIA RTX PRO 6000 Blackwell Server Edition", uuid="GPU-x",
                compute_cap="12.0", memory_total_mib=97887, memory_used_mib=0,
                driver_version="580.95.05", mig_mode="Disabled")
    base.update(kw)
    return GpuInfo(**base)


def ct200(n=8, **kw):
    return [row(index=i, uuid=f"GPU-{i}", **kw) for i in range(n)]


# --- recorded real output (2x H200, driver 580.159.04) ----------------------------------------

@pytest.mark.parametrize("name", ["h200x2-query.txt", "h200x2-query-header.txt", "h200x2-query-mig.txt"])
def test_recorded_h200_forms_parse_alike(name):
    gpus = parse_query((FIX / name).read_text())
    assert [g.index for g in gpus] == [0, 1]
    assert [g.uuid for g in gpus] == H200_UUIDS
    for g in gpus:
        assert (g.name, g.compute_cap, g.memory_total_mib, g.memory_used_mib, g.driver_version) == \
            ("NVIDIA H200", "9.0", 143771, 0, "580.159.04")
        assert g.memory_free_mib == 143771 and not g.unreadable
    assert [g.mig_mode for g in gpus] == (["Disabled"] * 2 if "mig" in name else [None, None])


def test_recorded_list_and_topology_agree_with_query():
    uuids = [line.split("UUID: ")[1].rstrip(")") for line in (FIX / "h200x2-L.txt").read_text().splitlines()]
    assert uuids == H200_UUIDS
    topo = (FIX / "h200x2-topo.txt").read_text()
    assert "GPU0" in topo and "NV18" in topo        # NVLink on the H200 box, PCIe on CT200


def test_recorded_preflight_output_is_what_the_code_computes_now():
    """The JSON the CLI printed on the H200s == what it prints today from the same nvidia-smi text."""
    recorded = json.loads((FIX / "h200x2-preflight-gpus.json").read_text())
    gpus = parse_query((FIX / "h200x2-query-mig.txt").read_text())
    assert [g.as_dict() for g in gpus] == recorded["gpus"]
    expect = profile_expectations(load_profile("mxfp4-tp2-cookbook").data, compute_cap="9.0")
    assert expect == recorded["expectations"]
    assert check_gpus(gpus, **expect) == recorded["problems"] == []
    text = (FIX / "h200x2-preflight-gpus.txt").read_text()
    assert "compute capability 9.0, expected 12.0" in text and "rc=1" in text and "rc=0" in text


def test_h200_refused_for_the_sm120_profile_unless_overridden():
    gpus = parse_query((FIX / "h200x2-query.txt").read_text())
    data = load_profile("mxfp4-tp2-cookbook").data
    problems = check_gpus(gpus, **profile_expectations(data))
    assert len(problems) == 2 and all("compute capability 9.0, expected 12.0" in p for p in problems)
    assert check_gpus(gpus, **profile_expectations(data, compute_cap="9.0")) == []
    # TP4 on a 2-GPU box: too few GPUs, named
    problems = check_gpus(gpus, **profile_expectations(load_profile("nvfp4-ctx8k").data, compute_cap="9.0"))
    assert problems == ["tp_size 4 needs 4 GPUs; nvidia-smi lists 2 usable (0: NVIDIA H200, 1: NVIDIA H200)"]


# --- odd cases --------------------------------------------------------------------------------

def test_placeholders_blank_lines_crlf_and_units():
    text = ("\r\n"
            "0, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-a, 12.0, 97887, [N/A], 580.95.05\r\n"
            "\n"
            "1, NVIDIA RTX PRO 6000 Blackwell Server Edition, [Insufficient Permissions], [Not Supported], "
            "97887 MiB, 512 MiB, 580.95.05\r\n"
            "   \n")
    a, b = parse_query(text)
    assert a.memory_used_mib is None and a.memory_free_mib is None and a.unreadable == ("memory.used=[N/A]",)
    assert b.uuid is None and b.compute_cap is None and b.memory_used_mib == 512
    assert b.unreadable == ("uuid=[Insufficient Permissions]", "compute_cap=[Not Supported]")
    problems = check_gpus([a, b], tp_size=2, compute_cap="12.0", min_free_mib=1000, min_driver_branch=570)
    assert problems == [
        "GPU 1 (NVIDIA RTX PRO 6000 Blackwell Server Edition): compute capability unreadable "
        "([Not Supported]); expected 12.0",
        "GPU 0 (NVIDIA RTX PRO 6000 Blackwell Server Edition): free memory unknown "
        "(memory.total=missing, memory.used=[N/A]); the profile needs 1,000 MiB free",
    ]


def test_header_in_any_order_with_units_and_aliases():
    text = ("memory.used [MiB], gpu_name, index, driver_version, memory.total [MiB], compute_cap, gpu_uuid\n"
            "1024 MiB, NVIDIA H200, 3, 580.159.04, 143771 MiB, 9.0, GPU-z\n")
    (g,) = parse_query(text)
    assert (g.index, g.name, g.uuid, g.memory_used_mib, g.memory_total_mib) == (3, "NVIDIA H200", "GPU-z", 1024, 143771)


def test_mig_enabled_gpu_is_refused_and_not_counted():
    text = "".join(f"{i}, NVIDIA RTX PRO 6000 Blackwell Server Edition, GPU-{i}, 12.0, 97887, 0, 580.95.05, "
                   f"{'Enabled' if i == 1 else 'Disabled'}\n" for i in range(4))
    gpus = parse_query(text)
    assert [g.mig_enabled for g in gpus] == [False, True, False, False]
    problems = check_gpus(gpus, tp_size=4)
    assert problems[0].startswith("GPU 1: MIG mode is enabled")
    assert problems[1].startswith("tp_size 4 needs 4 GPUs; nvidia-smi lists 3 usable")
    assert check_gpus(gpus, tp_size=3, compute_cap="12.0") == [problems[0]]


@pytest.mark.parametrize("text, words", [
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that "
     "the latest NVIDIA driver is installed and running.\n", "not installed or not loaded"),
    ("Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.95\n", "reboot"),
    ("No devices were found\n", "found no GPU"),
    ('Field "compute_cap" is not a valid field to query.\n\n', "R510"),
    ("0, NVIDIA H200, GPU-a, 9.0, 143771\n", "expected 7 or 8 comma-separated columns, got 5"),
    ("0, NVIDIA H200, GPU-a, 9.0, lots, 0, 580.1\n", "memory.total: expected a size in MiB"),
    ("x, NVIDIA H200, GPU-a, 9.0, 1, 0, 580.1\n", "index: expected an integer"),
])
def test_errors_are_named(text, words):
    with pytest.raises(NvidiaSmiError, match=None) as err:
        parse_query(text)
    assert words in str(err.value)


def test_empty_output_is_no_gpu():
    assert parse_query("") == [] and parse_query("\n\n") == []
    assert check_gpus([], tp_size=1) == ["nvidia-smi lists no GPU"]


@pytest.mark.parametrize("text, branch", [("580.159.04", 580), ("570.86.10", 570), ("580", 580),
                                          (" 535.230.02 ", 535)])
def test_driver_branch(text, branch):
    assert driver_branch(text) == branch


@pytest.mark.parametrize("bad", ["", None, "N/A", "v580", "580.x"])
def test_driver_branch_rejects(bad):
    with pytest.raises(ValueError):
        driver_branch(bad)


# --- checks -----------------------------------------------------------------------------------

def test_ct200_passes_every_profile():
    for name in ("nvfp4-ctx8k", "nvfp4-tp8-nop2p", "mxfp4-tp2-cookbook", "fp8-ctx1m-baseline"):
        assert check_gpus(ct200(), **profile_expectations(load_profile(name).data)) == [], name


def test_expectations_come_from_profile_and_catalog():
    expect = profile_expectations(load_profile("nvfp4-ctx8k").data)
    # 0.70 x 97,887 MiB = 68,520.9 -> 68,521; branch max(570 for sm_120, driver.branch 580)
    assert expect == {"tp_size": 4, "compute_cap": "12.0", "min_free_mib": 68521, "min_driver_branch": 580}
    assert profile_expectations(load_profile("nvfp4-ctx8k").data, min_driver_branch=570)["min_driver_branch"] == 570


def test_each_refusal_is_clear():
    gpus = ct200(4)
    gpus[2] = row(index=2, uuid="GPU-2", memory_used_mib=40000)
    problems = check_gpus(gpus, tp_size=4, compute_cap="12.0", min_free_mib=68521, min_driver_branch=580)
    assert problems == ["GPU 2 (NVIDIA RTX PRO 6000 Blackwell Server Edition): 57,887 MiB free of 97,887 MiB "
                        "(40,000 MiB in use); the profile's static budget needs 68,521 MiB (see "
                        "nvidia-smi --query-compute-apps=pid,used_memory --format=csv)"]
    old = [row(index=i, driver_version="565.57.01") for i in range(4)]
    assert check_gpus(old, tp_size=4, min_driver_branch=570) == [
        "driver 565.57.01 (branch 565) is older than branch 570 that the profile needs"]
    # only the GPUs SGLang uses (0..tp-1) need the memory
    assert check_gpus(gpus, tp_size=2, min_free_mib=68521) == []
    assert check_gpus(ct200(), tp_size=8, compute_cap="12") == []           # 12 == 12.0


def test_table_format():
    text = format_table(parse_query((FIX / "h200x2-query-mig.txt").read_text()))
    lines = text.splitlines()
    assert lines[0].split() == ["idx", "name", "cc", "total", "MiB", "used", "MiB", "free", "MiB",
                                "driver", "MIG", "uuid"]
    assert "143,771" in lines[1] and H200_UUIDS[1] in lines[2]
    assert format_table([GpuInfo(None, None, None, None, None, None, None)]).splitlines()[1].startswith("?")


# --- the twin's nvidia-smi and the CLI ---------------------------------------------------------

def test_query_args():
    assert query_args(QUERY_FIELDS) == [
        "nvidia-smi", "--query-gpu=index,name,uuid,compute_cap,memory.total,memory.used,driver_version",
        "--format=csv,noheader,nounits"]
    assert query_args(header=True, units=True)[-1] == "--format=csv"
    assert query_args()[1].endswith(",mig.mode.current") and len(QUERY_FIELDS_MIG) == 8


@pytest.mark.parametrize("header,units", [(False, False), (True, False), (False, True), (True, True)])
def test_parses_the_twins_nvidia_smi(tmp_path, header, units):
    settings = tmp_path / "gpus.json"
    settings.write_text(json.dumps({"count": 8, "memory_used_mib": [0, 0, 0, 50000, 0, 0, 0, 0]}))
    out = subprocess.run([sys.executable, str(SIM), *query_args(header=header, units=units)[1:]],
                         capture_output=True, text=True, env={"DSV4_TWIN_GPUS": str(settings)}, check=True).stdout
    gpus = parse_query(out)
    assert len(gpus) == 8 and {g.compute_cap for g in gpus} == {"12.0"} and gpus[3].memory_used_mib == 50000
    problems = check_gpus(gpus, **profile_expectations(load_profile("nvfp4-ctx8k").data))
    assert len(problems) == 1 and problems[0].startswith("GPU 3 ")


def _fake_smi(tmp_path, settings: dict) -> str:
    (tmp_path / "gpus.json").write_text(json.dumps(settings))
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\nDSV4_TWIN_GPUS={tmp_path / 'gpus.json'} exec {sys.executable} {SIM} \"$@\"\n")
    exe.chmod(0o755)
    return str(exe)


def test_cli_runs_nvidia_smi_and_exits_by_verdict(tmp_path, capsys):
    smi = _fake_smi(tmp_path, {"count": 8})
    assert main(["gpus", "--profile", "nvfp4-ctx8k", "--nvidia-smi", smi]) == 0
    out = capsys.readouterr().out
    assert "nvfp4-ctx8k: OK (8 GPUs)" in out and ">= 68,521 MiB free" in out
    assert main(["gpus", "--profile", "nvfp4-ctx8k", "--nvidia-smi", smi, "--expect-compute-cap", "9.0",
                 "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and len(doc["problems"]) == 4 and len(doc["gpus"]) == 8
    smi = _fake_smi(tmp_path, {"driver_installed": False})
    assert main(["gpus", "--profile", "nvfp4-ctx8k", "--nvidia-smi", smi]) == 1
    assert "driver is not installed or not loaded" in capsys.readouterr().err


def test_cli_reads_recorded_input(capsys):
    args = ["gpus", "--profile", "mxfp4-tp2-cookbook", "--input", str(FIX / "h200x2-query.txt")]
    assert main(args) == 1
    assert "REFUSED: GPU 0 (NVIDIA H200): compute capability 9.0, expected 12.0" in capsys.readouterr().out
    assert main(args + ["--expect-compute-cap", "9.0"]) == 0
    assert main(["gpus", "--input", str(FIX / "h200x2-query.txt")]) == 0      # inventory only


def test_cli_bad_input_exits_2(capsys):
    assert main(["gpus", "--profile", "no-such-profile", "--input", str(FIX / "h200x2-query.txt")]) == 2
    assert "no profile named 'no-such-profile'" in capsys.readouterr().err
    assert main(["gpus", "--input", "/nonexistent/file"]) == 2
    with pytest.raises(SystemExit) as exc:
        main(["gpus", "--min-driver-branch", "abc"])
    assert exc.value.code == 2


def test_module_entry_point():
    proc = subprocess.run([sys.executable, "-m", "dsv4deploy.preflight", "gpus", "--json", "--profile",
                           "mxfp4-tp2-cookbook", "--expect-compute-cap", "9.0",
                           "--input", str(FIX / "h200x2-query.txt")],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True
