"""A download cut mid-shard, on a twin of its own: the deploy fails naming the file and why, the
release serving before keeps serving, and the re-run resumes that shard from the bytes on disk
(the local hub's request log shows one `Range: bytes=<cut>-` and no byte before the cut served
again); the checkpoint then verifies and the deploy passes (issue 36).

An isolated twin (`sim up --fleet dl`; DSV4_SIM_DL_FLEET names another) with the twin's own parser
for the launch check: what is tested is the download, not the parser. The local hub
(ct200twin/host/hub.py) listens on this machine's end of the twin's veth and sends its 302s to
`sim-host`, the name the twin knows that end by (netns.LAN_NAME): the host program fetches the
bytes from another host name than the hub's, as CT200 fetches them from the real hub's CDN.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from ct200twin import faultlab
from ct200twin.faultlab import FAST_START, FAULTS, REPO, TINY_GATE, health, main_pid, releases, serving
from ct200twin.host.checkpoint import CHECKPOINTS, make_checkpoint
from ct200twin.host.hub import HubFaults, serve_hub
from ct200twin.host.netns import LAN_NAME
from sim_fixtures import _isolated_twin

pytestmark = [pytest.mark.slow, pytest.mark.fleet]

DL_FLEET = os.environ.get("DSV4_SIM_DL_FLEET", "dl")
DL_ENV = {"DSV4_SIM_FLEET": DL_FLEET, "DSV4_SIM_LAUNCH_CHECK": "twin"}
INVENTORY = "inventory/fleet-sim.py"
MODEL = "nvidia/DeepSeek-V4-Flash-NVFP4"
SHARD = "model-00002-of-00003.safetensors"
CUT = 10_000                      # the shard's first bytes, then the connection drops (~33 KB in all)
BASE, FROM_HUB = "dlbase", "dlhub"
PARTIAL = ".cache/dsv4deploy/partial"    # where the host program keeps a cut file (weights/fetch.py)


@pytest.fixture(scope="session")
def dl_twin():
    yield from _isolated_twin(DL_FLEET)


@pytest.fixture(scope="module")
def hub(dl_twin):
    """The local hub on this machine's end of the twin's veth, its CDN under the twin's name for it."""
    make_checkpoint(MODEL)
    with serve_hub(CHECKPOINTS, host=dl_twin.net()["host_ip"], cdn_host=LAN_NAME) as h:
        yield h


@pytest.fixture(scope="module")
def profiles(tmp_path_factory, hub):
    """BASE (the stand-in's rsync source) and FROM_HUB (source: hf, pinned against the hub by
    `dsv4deploy pin`, as an operator pins), each with its own context length and a one-level gate."""
    folder = faultlab.write_profiles(tmp_path_factory.mktemp("profiles"), {
        BASE: faultlab.variant(7680, TINY_GATE), FROM_HUB: faultlab.variant(12288, TINY_GATE)})
    env = {**os.environ, "DSV4_PROFILES_DIR": str(folder), "HF_ENDPOINT": hub.url}
    out = subprocess.run([str(REPO / ".venv/bin/dsv4deploy"), "pin", FROM_HUB], cwd=REPO, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    return folder


@pytest.fixture(scope="module")
def twin(dl_twin, profiles):
    """The dl twin with no release, no checkpoint of an earlier run, and BASE serving (0001)."""
    dl_twin.run("systemctl stop sglang.service 2>/dev/null; systemctl reset-failed 2>/dev/null; "
                "rm -rf /var/lib/dsv4deploy /etc/dsv4deploy /etc/systemd/system/sglang.service /srv/dsv4deploy/models; "
                "systemctl daemon-reload", check=False)
    dl_twin.write_file(FAULTS, json.dumps(FAST_START))
    out = deploy(BASE, profiles)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    yield dl_twin
    dl_twin.run(f"rm -f {FAULTS}", check=False)


def deploy(profile: str, profiles, hub=None) -> subprocess.CompletedProcess:
    """The deploy as a user runs it; with HUB, the weights come from it (source: hf), else from
    the stand-in checkpoint over SSH."""
    env = {**DL_ENV, **({"DSV4_SIM_HUB": hub.url} if hub else {})}
    return faultlab.deploy(profile, profiles_dir=profiles, env=env, inventory=INVENTORY)


def model_dir(profiles) -> str:
    text = (profiles / f"{FROM_HUB}.yaml").read_text()
    rev = next(line.split(":", 1)[1].strip().strip('"') for line in text.splitlines()
               if line.strip().startswith("revision:"))
    return f"/srv/dsv4deploy/models/{MODEL.replace('/', '--')}/{rev}"


def shard_gets(hub) -> list[dict]:
    """The GETs of SHARD's bytes (on the CDN path the hub's 302 names)."""
    return [r for r in hub.request_log() if r["method"] == "GET" and r["path"].startswith("/_cdn/")
            and r["path"].endswith("/" + SHARD)]


def served_files(hub) -> list[str]:
    """The files whose bytes the hub served (small ones on /resolve/, LFS ones on /_cdn/)."""
    return sorted({r["path"].rsplit("/", 1)[-1] for r in hub.request_log() if r["method"] == "GET"
                   and r["status"] in (200, 206) and ("/resolve/" in r["path"] or r["path"].startswith("/_cdn/"))})


def completed_files(hub) -> set[str]:
    """The files whose bytes the hub served whole (an answer of 200 that was not cut)."""
    return {r["path"].rsplit("/", 1)[-1] for r in hub.request_log() if r["method"] == "GET"
            and r["status"] == 200 and not r.get("cut") and ("/resolve/" in r["path"] or r["path"].startswith("/_cdn/"))}


def test_a_download_cut_mid_shard_fails_clearly_and_the_rerun_resumes_it(twin, hub, profiles):
    size = hub.repo(MODEL).files[SHARD].size
    folder = model_dir(profiles)
    pid, before = main_pid(twin), releases(twin)
    assert [(r["release"], r["profile"]) for r in before] == [(1, BASE)]

    # 1. every GET of the shard that reaches byte CUT is dropped there: the deploy fails on it
    hub.clear_log()
    hub.set_faults(HubFaults(cut={SHARD: CUT}, cut_times=100))
    try:
        cut = deploy(FROM_HUB, profiles, hub)
    finally:
        hub.set_faults(HubFaults())
    text = cut.stdout + cut.stderr
    assert cut.returncode != 0, text[-3000:]
    assert f"{SHARD}: FAILED" in text and "the connection ended early" in text, text[-3000:]
    assert f"stopped at Weights | {MODEL}@" in text and not faultlab.tool_traceback(text), text[-3000:]
    first = shard_gets(hub)
    assert first[0]["range"] is None and first[0]["sent"] == CUT and first[0]["cut"], first
    assert all(r["range"] == f"bytes={CUT}-" and r["sent"] == 0 for r in first[1:]), first   # its retries resume
    part = twin.run(f"stat -c %s {folder}/{PARTIAL}/{SHARD}.part").stdout.strip()
    assert part == str(CUT)                                # what came is kept across runs
    # the old state is intact: the same server, serving the same release, and its record
    assert main_pid(twin) == pid and health(twin) == "200"
    now = serving(twin)
    assert now.good and now.release["release"] == 1 and now.release["profile"] == BASE, now.describe()
    assert [r for r in releases(twin) if r["status"] == "deployed"] == [r for r in before if r["status"] == "deployed"]

    # 2. the re-run asks for the rest of the shard only, the checkpoint verifies and the deploy passes
    completed = completed_files(hub) - {SHARD}                # what the cut run fetched whole
    hub.clear_log()
    again = deploy(FROM_HUB, profiles, hub)
    text = again.stdout + again.stderr
    assert again.returncode == 0, text[-3000:]
    resumed = shard_gets(hub)
    assert [(r["range"], r["status"], r["sent"]) for r in resumed] == [(f"bytes={CUT}-", 206, size - CUT)]
    again_served = served_files(hub)
    assert SHARD in again_served and not completed & set(again_served), (completed, again_served)  # not fetched again
    marker = json.loads(twin.run(f"cat {folder}/.dsv4deploy-verified.json").stdout)
    assert marker["files"][SHARD]["sha256"] == hub.repo(MODEL).files[SHARD].sha256
    assert twin.run(f"test -e {folder}/{PARTIAL}/{SHARD}.part", check=False).returncode != 0
    last = releases(twin)[-1]
    assert (last["profile"], last["status"]) == (FROM_HUB, "deployed") and last["gate"]["passed"]
    assert serving(twin).release["release"] == last["release"] and main_pid(twin) != pid


# Root's processes while a deploy downloads, verifies and runs the launch check (issue 37 item 3):
# sampled on the twin every 50 ms; the journal says which sandboxed units ran meanwhile.
SAMPLER = ("setsid sh -c 'while :; do ps -eo user:24,args --no-headers; echo ---; sleep 0.05; done' "
           ">/run/dsv4-ps.log 2>&1 </dev/null & echo $!")
VENV_PROGRAM = "/opt/dsv4deploy/venvs/"


def root_venv_processes(samples: str) -> list[str]:
    """Lines of `ps -eo user,args` whose program is a venv's (python, hf) and whose user is root."""
    out = []
    for line in samples.splitlines():
        user, _, args = line.partition(" ")
        program = args.strip().split(" ", 1)[0]
        if user == "root" and program.startswith(VENV_PROGRAM):
            out.append(line)
    return out


def test_no_root_process_runs_a_venv_while_the_deploy_downloads_verifies_and_checks(twin, hub, profiles):
    """A new argv (the launch check runs) and no checkpoint (the download and the verify run): no
    process of root's runs a program from a venv; the three ran as transient units, each as its
    unprivileged account, and what the download wrote is the fetch account's, readable by all."""
    text = (profiles / f"{FROM_HUB}.yaml").read_text()
    assert "context_length: 12288" in text
    (profiles / "dlroot.yaml").write_text(text.replace("context_length: 12288", "context_length: 11264"))
    folder = model_dir(profiles)
    twin.run(f"rm -rf {folder}")
    since = twin.run("date +%s").stdout.strip()
    pid = twin.run(SAMPLER).stdout.strip()
    try:
        out = deploy("dlroot", profiles, hub)
    finally:
        twin.run(f"kill {int(pid)}", check=False)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    samples = twin.run("cat /run/dsv4-ps.log; rm -f /run/dsv4-ps.log").stdout
    assert samples.count("---") > 20, samples[-2000:]                # the sampler ran through the deploy
    assert root_venv_processes(samples) == []
    assert root_venv_processes(f"root {VENV_PROGRAM}x/bin/python -m m\nsglang {VENV_PROGRAM}x/bin/python") == \
        [f"root {VENV_PROGRAM}x/bin/python -m m"]                    # what it looks for, it finds
    started = twin.run(f"journalctl --no-pager -o cat _PID=1 --since @{since} | grep '^Started '").stdout
    assert "bin/python -I -m ct200twin.server.args" in started, started[-2000:]   # the launch check
    # the download and the verify ran as the fetch account: every file they wrote is its own
    owners = twin.run(f"find {folder} -maxdepth 1 -type f -printf '%u %m %f\\n'").stdout.split("\n")
    assert owners and all(o.startswith("dsv4deploy-fetch 644 ") for o in owners if o), owners
    assert ".dsv4deploy-verified.json" in " ".join(owners)
