"""A download cut mid-shard, on a twin of its own: the deploy fails naming the file and why, the
release serving before keeps serving, every file the cut run completed stays on the host, and the
re-run asks the hub for what the host lacks and nothing else: the rest of the shard from the cut
(one `Range: bytes=<cut>-`) and no byte of a file the host holds; the checkpoint then verifies and
the deploy passes (issue 36). The same re-run downloads, verifies and runs the launch check: no
root process runs a venv's program meanwhile (issue 37 item 3).

What the host holds is read on the host, not inferred from the hub's log: the hub logs an answer
when it has written it, which a client that timed out first never reads (a loaded machine can
hold an answer past the download's 60 s timeout; the download then says so and fails that file
too, and the re-run rightly fetches it). A request belongs to the run during which it started.

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
import time
from dataclasses import dataclass

import pytest

from ct200twin import faultlab
from ct200twin.faultlab import FAST_START, FAULTS, REPO, TINY_GATE, Serving, health, main_pid, releases, serving
from ct200twin.host.checkpoint import CHECKPOINTS, make_checkpoint
from ct200twin.host.hub import HubFaults, serve_hub
from ct200twin.host.netns import LAN_NAME
from dsv4deploy.weights.fetch import USER_AGENT
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
# Root's processes while the re-run downloads, verifies and runs the launch check: sampled on the
# twin every 50 ms; the journal says which sandboxed units ran meanwhile.
SAMPLER = ("setsid sh -c 'while :; do ps -eo user:24,args --no-headers; echo ---; sleep 0.05; done' "
           ">/run/dsv4-ps.log 2>&1 </dev/null & echo $!")
VENV_PROGRAM = "/opt/dsv4deploy/venvs/"


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


@dataclass
class Run:
    """One deploy from the hub: its output, the hub's requests that started during it (by start
    time), and the checkpoint's files on the host after it ({path: size}, .cache/ and markers apart)."""

    out: subprocess.CompletedProcess
    requests: list[dict]
    on_host: dict[str, int]
    since: str                                   # the twin's clock when it began (journalctl --since)

    @property
    def text(self) -> str:
        return self.out.stdout + self.out.stderr

    def gets(self) -> list[dict]:
        """GETs of a file's bytes (small files on /resolve/, LFS ones on the CDN path the 302 names)."""
        return [r for r in self.requests if r["method"] == "GET" and r["status"] in (200, 206)
                and ("/resolve/" in r["path"] or r["path"].startswith("/_cdn/"))]

    def shard_gets(self) -> list[dict]:
        return [r for r in self.gets() if r["path"].startswith("/_cdn/") and r["path"].endswith("/" + SHARD)]

    def fetch_result(self) -> dict:
        """weights_fetch.py's verdict: {"fetched", "resumed", "xet", "failed"} (its stdout line)."""
        line = next(line for line in self.text.splitlines() if '{"fetched": ' in line)
        return json.loads(line[line.index("{"):])

    def evidence(self) -> str:
        """The download's lines and the hub's requests, for an assertion's message."""
        lines = [line.strip() for line in self.text.splitlines() if "weights_fetch" in line]
        reqs = [f"{r['start']:.2f} {r['method']} {r['path'].rsplit('/', 1)[-1]} {r['range']} -> {r['status']} "
                f"sent {r['sent']}{' cut' if r['cut'] else ''} in {r['time'] - r['start']:.2f} s from "
                f"{r.get('client')} {r.get('agent')}" for r in self.requests]
        return "\n".join(["--- download", *lines, "--- hub requests", *reqs])


def deploy_from_hub(twin, hub, profiles) -> Run:
    since = twin.run("date +%s").stdout.strip()
    t0 = time.time()
    out = deploy(FROM_HUB, profiles, hub)
    requests = sorted((r for r in hub.request_log(settle=30) if r["start"] is not None and r["start"] >= t0),
                      key=lambda r: r["start"])
    listing = twin.run(f"cd {model_dir(profiles)} && find . -path ./.cache -prune -o -type f -printf '%s %P\\n'",
                       check=False).stdout
    on_host = {name: int(size) for size, _, name in (line.partition(" ") for line in listing.splitlines())
               if not name.startswith(".")}
    return Run(out, requests, on_host, since)


@dataclass
class Scenario:
    """The deploy cut mid-shard, the host right after it, and the re-run (root's processes sampled)."""

    pid: int                     # the server's main PID before the cut run
    before: list[dict]           # the release records before it
    cut: Run
    part: str                    # the size of the shard's kept .part after the cut run
    pid_after_cut: int
    health_after_cut: str
    serving_after_cut: Serving
    releases_after_cut: list[dict]
    again: Run
    samples: str                 # `ps` of the twin every 50 ms through the re-run


@pytest.fixture(scope="module")
def scenario(twin, hub, profiles) -> Scenario:
    """Every GET of the shard that reaches byte CUT is dropped there: the deploy fails on it; then
    the same deploy again, with the hub whole. One pair of runs for both tests below."""
    folder = model_dir(profiles)
    pid, before = main_pid(twin), releases(twin)
    hub.set_faults(HubFaults(cut={SHARD: CUT}, cut_times=100))
    try:
        cut = deploy_from_hub(twin, hub, profiles)
    finally:
        hub.set_faults(HubFaults())
    part = twin.run(f"stat -c %s {folder}/{PARTIAL}/{SHARD}.part", check=False).stdout.strip()
    after = dict(pid_after_cut=main_pid(twin), health_after_cut=health(twin), serving_after_cut=serving(twin),
                 releases_after_cut=releases(twin))
    sampler = twin.run(SAMPLER).stdout.strip()
    try:
        again = deploy_from_hub(twin, hub, profiles)
    finally:
        twin.run(f"kill {int(sampler)}", check=False)
    samples = twin.run("cat /run/dsv4-ps.log; rm -f /run/dsv4-ps.log").stdout
    return Scenario(pid=pid, before=before, cut=cut, part=part, **after, again=again, samples=samples)


def test_a_download_cut_mid_shard_fails_clearly_and_the_rerun_resumes_it(scenario, twin, hub, profiles):
    s, files = scenario, hub.repo(MODEL).files
    assert [(r["release"], r["profile"]) for r in s.before] == [(1, BASE)]
    # 1. the cut run fails naming the shard and why, and keeps what came
    cut, text = s.cut, s.cut.text
    assert cut.out.returncode != 0, text[-3000:]
    assert f"{SHARD}: FAILED" in text and "the connection ended early" in text, text[-3000:]
    assert f"stopped at Weights | {MODEL}@" in text and not faultlab.tool_traceback(text), text[-3000:]
    first = cut.shard_gets()
    assert first[0]["range"] is None and first[0]["sent"] == CUT and first[0]["cut"], cut.evidence()
    assert all(r["range"] == f"bytes={CUT}-" and r["sent"] == 0 for r in first[1:]), cut.evidence()  # retries resume
    assert s.part == str(CUT)                              # the shard's bytes are kept across runs
    result = cut.fetch_result()
    kept = {p for p, size in cut.on_host.items() if p in files and size == files[p].size}
    # every file the download says it fetched is on the host whole; every other one it names as failed
    assert SHARD in result["failed"] and kept == set(result["fetched"]), cut.evidence()
    assert kept | set(result["failed"]) == set(files) and not kept & set(result["failed"]), cut.evidence()
    # the old state is intact: the same server, serving the same release, and its record
    assert s.pid_after_cut == s.pid and s.health_after_cut == "200"
    now = s.serving_after_cut
    assert now.good and now.release["release"] == 1 and now.release["profile"] == BASE, now.describe()
    assert [r for r in s.releases_after_cut if r["status"] == "deployed"] == \
        [r for r in s.before if r["status"] == "deployed"]

    # 2. the re-run asks for what the host lacks and nothing else: the shard from the cut on
    again, size = s.again, files[SHARD].size
    assert again.out.returncode == 0, again.text[-3000:]
    resumed = again.shard_gets()       # a retry (an answer held past the timeout) starts no earlier
    assert resumed and all(r["status"] == 206 for r in resumed), again.evidence()
    starts = [int(r["range"].removeprefix("bytes=").removesuffix("-")) for r in resumed]
    assert starts[0] == CUT and starts == sorted(starts) and resumed[-1]["sent"] == size - starts[-1], again.evidence()
    fetched_again = {r["path"].rsplit("/", 1)[-1] for r in again.gets()}
    assert fetched_again == set(files) - kept, (kept, again.evidence())   # no byte of a kept file again
    # only the host's download asked the hub (no tokenizer or launch check reads it after the download)
    assert {(r["client"], r["agent"]) for r in again.requests} == {(twin.address, USER_AGENT)}, again.evidence()
    folder = model_dir(profiles)
    marker = json.loads(twin.run(f"cat {folder}/.dsv4deploy-verified.json").stdout)
    assert marker["files"][SHARD]["sha256"] == files[SHARD].sha256
    assert twin.run(f"test -e {folder}/{PARTIAL}/{SHARD}.part", check=False).returncode != 0
    last = releases(twin)[-1]
    assert (last["profile"], last["status"]) == (FROM_HUB, "deployed") and last["gate"]["passed"]
    assert serving(twin).release["release"] == last["release"] and main_pid(twin) != s.pid


def root_venv_processes(samples: str) -> list[str]:
    """Lines of `ps -eo user,args` whose program is a venv's (python, hf) and whose user is root."""
    out = []
    for line in samples.splitlines():
        user, _, args = line.partition(" ")
        program = args.strip().split(" ", 1)[0]
        if user == "root" and program.startswith(VENV_PROGRAM):
            out.append(line)
    return out


def test_no_root_process_runs_a_venv_while_the_deploy_downloads_verifies_and_checks(scenario, twin, profiles):
    """The re-run has a new argv (the launch check runs), a shard to download and a checkpoint no
    verify has proven (the verify hashes every file): no process of root's runs a program from a
    venv; the three ran as transient units, each as its unprivileged account, and what the
    download wrote is the fetch account's, readable by all."""
    assert scenario.again.out.returncode == 0, scenario.again.text[-3000:]
    samples = scenario.samples
    assert samples.count("---") > 20, samples[-2000:]                # the sampler ran through the deploy
    assert root_venv_processes(samples) == []
    assert root_venv_processes(f"root {VENV_PROGRAM}x/bin/python -m m\nsglang {VENV_PROGRAM}x/bin/python") == \
        [f"root {VENV_PROGRAM}x/bin/python -m m"]                    # what it looks for, it finds
    started = twin.run(f"journalctl --no-pager -o cat _PID=1 --since @{scenario.again.since} "
                       "| grep '^Started '").stdout
    assert "bin/python -I -m ct200twin.server.args" in started, started[-2000:]   # the launch check
    # the download and the verify ran as the fetch account: every file they wrote is its own
    folder = model_dir(profiles)
    owners = twin.run(f"find {folder} -maxdepth 1 -type f -printf '%u %m %f\\n'").stdout.split("\n")
    assert owners and all(o.startswith("dsv4deploy-fetch 644 ") for o in owners if o), owners
    assert ".dsv4deploy-verified.json" in " ".join(owners)
