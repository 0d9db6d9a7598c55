"""`source: hf` on the CT200 twin, through the real huggingface_hub download code: a local hub
(ct200twin.host.hub) serves the stand-in checkpoint, the profile is pinned against it with
`dsv4deploy pin`, and the deploy downloads, verifies every file by size and sha256, and never
downloads a complete checkpoint again. A corrupted byte from the hub fails the deploy before any
restart; a connection cut mid-file is retried within the run.

Runs on the gate runners' isolated twin after tests/test_gate_runners_twin.py, in that module's
process of make test (the real host's venv; as the `deploy` user, through sudo): the hub listens on
this machine's end of the twin's veth, its CDN under the name the twin knows that end by.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from ct200twin.faultlab import FAST_START, FAULTS, PYINFRA, QUICK_GATE, REPO, changed_ops, main_pid, run
from ct200twin.host.checkpoint import CHECKPOINTS, make_checkpoint
from ct200twin.host.hub import HubFaults, serve_hub
from ct200twin.host.netns import LAN_NAME
from sim_fixtures import RUNNER_ENV, runner_twin  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.fleet]
MODEL = "nvidia/DeepSeek-V4-Flash-NVFP4"
SHARD = "model-00002-of-00003.safetensors"


@pytest.fixture(scope="module")
def hub(runner_twin):  # noqa: F811
    make_checkpoint(MODEL)
    with serve_hub(CHECKPOINTS, host=runner_twin.net()["host_ip"], cdn_host=LAN_NAME) as h:
        yield h


@pytest.fixture(scope="module")
def pinned(hub, tmp_path_factory, runner_twin):  # noqa: F811
    """A quick-gate profile pinned to the hub's commit by `dsv4deploy pin` (as an operator does)."""
    folder = tmp_path_factory.mktemp("profiles")
    for src in (REPO / "profiles").glob("*.yaml"):
        (folder / src.name).write_text(src.read_text())
    # the built-in client: these test the download, not the runner (bench_serving's start costs
    # ~19 s a level; the first deploy of tests/test_deploy_twin.py is gated by it)
    (folder / "hfq.yaml").write_text("extends: nvfp4-ctx8k\nserver:\n  context_length: 12288\n" + QUICK_GATE
                                     + "  runner: builtin\n")
    env = {**os.environ, "DSV4_PROFILES_DIR": str(folder), "HF_ENDPOINT": hub.url}
    out = subprocess.run([str(REPO / ".venv/bin/dsv4deploy"), "pin", "hfq"], cwd=REPO, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    runner_twin.write_file(FAULTS, json.dumps(FAST_START))
    return folder


def deploy_hf(hub, profiles) -> subprocess.CompletedProcess:
    return run([PYINFRA, "-y", "inventory/fleet-sim.py", "deploy/serve.py", "--data", "profile=hfq",
                "--data", "health_poll_s=0.5"],
               env={**RUNNER_ENV, "DSV4_PROFILES_DIR": str(profiles), "DSV4_SIM_HUB": hub.url})


def model_dir(twin, profiles) -> str:
    rev = next(line.split(":", 1)[1].strip().strip('"') for line in (profiles / "hfq.yaml").read_text().splitlines()
               if line.strip().startswith("revision:"))
    return f"/srv/dsv4deploy/models/{MODEL.replace('/', '--')}/{rev}"


def downloads(hub) -> list[str]:
    """Files whose bytes were served: small ones on /resolve/, LFS ones on the CDN path its 302 names."""
    return [r["path"].rsplit("/", 1)[-1] for r in hub.request_log() if r["method"] == "GET" and r["status"] != 302
            and ("/resolve/" in r["path"] or r["path"].startswith("/_cdn/"))]


def test_hf_download_is_verified_and_never_repeated(runner_twin, hub, pinned):  # noqa: F811
    hub.clear_log()
    out = deploy_hf(hub, pinned)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    fetched = downloads(hub)
    assert SHARD in fetched and "model.safetensors.index.json" in fetched
    folder = model_dir(runner_twin, pinned)
    marker = json.loads(runner_twin.run(f"cat {folder}/.dsv4deploy-verified.json").stdout)
    assert SHARD in marker["files"] and marker["files"][SHARD]["sha256"]
    hub.clear_log()
    again = deploy_hf(hub, pinned)
    assert again.returncode == 0 and changed_ops(again.stdout + again.stderr) == []
    assert downloads(hub) == []                          # a complete checkpoint is never fetched again


def test_a_corrupted_shard_is_caught_by_sha256_and_a_cut_is_retried(runner_twin, hub, pinned):  # noqa: F811
    """A byte corrupted by the hub fails the deploy before any restart and the bad copy is removed;
    the next deploy fetches it again through a connection cut mid-file (retried within the run)."""
    folder = model_dir(runner_twin, pinned)
    pid = main_pid(runner_twin)
    runner_twin.run(f"rm -f {folder}/{SHARD}")
    hub.set_faults(HubFaults(corrupt={SHARD: 100}))
    try:
        out = deploy_hf(hub, pinned)
    finally:
        hub.set_faults(HubFaults())
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert f"{SHARD}: sha256 " in text and "does not match the hub" in text, text[-3000:]
    assert main_pid(runner_twin) == pid                     # the serving release was not touched
    assert runner_twin.run(f"test -e {folder}/{SHARD}", check=False).returncode != 0   # the bad copy is gone

    hub.clear_log()
    hub.set_faults(HubFaults(cut={SHARD: 4096}))
    try:
        t0 = time.monotonic()
        fixed = deploy_hf(hub, pinned)
    finally:
        hub.set_faults(HubFaults())
    assert fixed.returncode == 0, (fixed.stdout + fixed.stderr)[-3000:]
    served = [r for r in hub.request_log() if r["method"] == "GET" and r["path"].endswith(SHARD)]
    assert len(served) >= 2 and served[0].get("cut")     # cut once, fetched again in the same run
    assert time.monotonic() - t0 < 180
