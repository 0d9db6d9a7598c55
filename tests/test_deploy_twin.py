"""deploy/serve.py for real, over SSH, against the CT200 twin (issue 4), as a user runs it.

The module's tests run in order on twin-1 and build on each other: first deploy, no-op
re-deploy, plan, a gate that fails and rolls back, profile switch, then the refusals, manual
rollbacks and history. The rollbacks after a crash, no health, errors or a crash mid-gate, and a
patched venv with an API key, have a twin of their own (tests/test_rollbacks_twin.py), and so has
the shipped slow baseline failing SGLang's bench_serving gate (tests/test_slow_baseline_twin.py).
"""

from __future__ import annotations

import json
import os
import time

import pytest

from sim_fixtures import sim_twin  # noqa: F401

from dsv4deploy.sglang.patches import MASK_SECRETS_PATCH as MASK

from ct200twin.faultlab import (FAST_START, FAULTS, PYINFRA, QUICK_GATE, REPO, changed_ops, deploy, health,
                                live_venv, main_pid, releases, run, served_context, write_profiles)

pytestmark = pytest.mark.slow

# Test profiles: the shipped ones plus a variant with a shorter gate (same floors' methodology,
# fewer prompts, the built-in client: bench_serving's start costs ~19 s a level) and its own
# context length. The first deploy's gate is SGLang's bench_serving, picked by `auto`.
FIRST_DEPLOY: dict = {}
VARIANTS = {"quick16k": 16384}
# The slow baseline gated by the built-in client: its per-request progress stops the gate once the
# floor is out of reach (bench_serving's stop, on the shipped profile: tests/test_slow_baseline_twin.py)
SLOW = "fp8builtin"


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    variants = {name: f"extends: nvfp4-ctx8k\nserver:\n  context_length: {ctx}\n" + QUICK_GATE + "  runner: builtin\n"
                for name, ctx in VARIANTS.items()}   # the built-in client: these test the rollout, not the runner
    variants[SLOW] = "extends: fp8-ctx1m-baseline\ngate:\n  runner: builtin\n"
    return write_profiles(tmp_path_factory.mktemp("profiles"), variants)


@pytest.fixture(scope="module")
def twin(sim_twin):  # noqa: F811
    """twin-1 with no faults and no leftover service or gate folder from earlier runs."""
    sim_twin.run(f"rm -f {FAULTS}; rm -rf /tmp/dsv4deploy-gate.*; systemctl stop sglang.service stale-sglang.service "
                 "2>/dev/null; systemctl reset-failed 2>/dev/null; rm -rf /var/lib/dsv4deploy /etc/dsv4deploy "
                 "/etc/systemd/system/sglang.service; systemctl daemon-reload", check=False)
    sim_twin.write_file(FAULTS, json.dumps(FAST_START))
    yield sim_twin
    sim_twin.run("rm -f /etc/dsv4deploy-twin/faults.json; systemctl stop stale-sglang.service 2>/dev/null; "
                 "systemctl reset-failed", check=False)


def test_make_deploy_serves_the_profile_passes_the_gate_and_records_it(twin):
    out = run(["make", "deploy", "PROFILE=nvfp4-ctx8k"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert twin.run("systemctl is-active sglang.service").stdout.strip() == "active"
    assert health(twin) == "200"
    (rec,) = releases(twin)
    assert (rec["release"], rec["profile"], rec["status"]) == (1, "nvfp4-ctx8k", "deployed")
    assert rec["gate"]["passed"] and rec["gate"]["level"] == "C=64"
    assert 480 < rec["gate"]["output_throughput"] < 580, "near the measured 531.7 tok/s"
    assert served_context(twin) == 8192
    listing = twin.run("ls /var/lib/dsv4deploy/releases/0001 /var/lib/dsv4deploy/releases/0001/gate").stdout
    for name in ("profile.json", "status.json", "files", "pip-freeze.txt", "gate.json", "gate.md", "gate.png"):
        assert name in listing
    freeze = twin.run("cat /var/lib/dsv4deploy/releases/0001/pip-freeze.txt").stdout.splitlines()
    assert "sglang==0.5.23" in freeze and any(line.startswith("aiohttp==") for line in freeze)
    # the venv is the real host's lock (CUDA torch from PyPI), and the launch check SGLang's own in it
    assert "torch==2.14.1" in freeze and "sglang-kernel==0.4.10" in freeze
    assert any(op.startswith("Launch check | SGLang 0.5.23's own parser with its ServerArgs checks parses the rendered argv")
               for op in changed_ops(out.stdout + out.stderr))
    assert (REPO / "reports/127.0.0.2/0001-nvfp4-ctx8k/gate.md").is_file()
    assert twin.run("stat -c '%a %U' /etc/dsv4deploy/secrets /etc/dsv4deploy/secrets/sglang-api-key").stdout.split(
        "\n")[:2] == ["700 root", "600 root"]
    FIRST_DEPLOY["output"] = out.stdout + out.stderr
    assert twin.run("test -e /var/lib/dsv4deploy/deploy.lock", check=False).returncode != 0, "lock given back"


def test_the_api_key_is_only_in_its_0600_files_and_the_server_is_sandboxed(twin):
    """The shipped profile serves with an API key: generated on the host, handed to SGLang as a
    systemd credential, masked by the shipped SGLang patch; nowhere else."""
    key = twin.run("cat /etc/dsv4deploy/secrets/sglang-api-key").stdout.strip()
    assert len(key) >= 32
    pid = main_pid(twin)
    journal = twin.run("journalctl --no-pager -o cat").stdout
    places = {
        "unit": twin.run("cat /etc/systemd/system/sglang.service").stdout,
        "systemd's view": twin.run("systemctl show sglang.service").stdout,
        "manifest": twin.run("cat /etc/dsv4deploy/sglang/manifest.json").stdout,
        "release records and reports on the host": twin.run("cat /var/lib/dsv4deploy/releases/*/*.json "
                                                            "/var/lib/dsv4deploy/releases/*/gate/*.json "
                                                            "/var/lib/dsv4deploy/releases/*/gate/*.md").stdout,
        "the journal": journal,
        "the server's environment": twin.run(f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout,
        "the server's argv": twin.run(f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout,
        "reports here": "".join(p.read_text(errors="replace") for p in (REPO / "reports").rglob("*") if p.is_file()),
        "the control node's output": FIRST_DEPLOY["output"],
    }
    for where, text in places.items():
        assert text and key not in text, where
    # the places above are the right ones: the masked line and the credential are really there
    assert "server_args=ServerArgs(" in journal and "api_key='<redacted>'" in journal
    assert "LoadCredential=sglang-config.yaml:/etc/dsv4deploy/secrets/sglang-sglang-config.yaml" in places["unit"]
    assert "--config /run/credentials/sglang.service/sglang-config.yaml" in places["the server's argv"]
    assert twin.run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/server_info").stdout == "401"
    info = json.loads(twin.run(f"curl -s -H 'Authorization: Bearer {key}' http://127.0.0.1:30000/server_info").stdout)
    assert info["api_key"] == "<redacted>" and key not in json.dumps(info)
    # the sandbox, as systemd on the host rates it, and the gate client's own user
    rating = twin.run("systemd-analyze security sglang.service | tail -n 1").stdout
    assert float(rating.split(":")[1].split()[0]) <= 2.0, rating
    assert twin.run("systemd-analyze verify /etc/systemd/system/sglang.service 2>&1").stdout.strip() == ""
    gate = json.loads(twin.run("cat /var/lib/dsv4deploy/releases/0001/gate/gate.json").stdout)
    gate_uid = int(twin.run("id -u dsv4deploy-gate").stdout)
    result = gate["result"]
    if result["runner"] == "builtin":
        assert result["client"]["uid"] == gate_uid != 0
        # the built-in client is uploaded into a root-owned 0700 folder (bench_serving needs none)
        assert twin.run("stat -c '%a %U' /opt/dsv4deploy/gate").stdout.strip() == "700 root"
    else:   # the twin's venv is the real host's: the auto runner takes SGLang's bench_serving, as on CT200
        assert result["runner"] == "bench_serving" and result["client"]["runner_choice"].startswith("auto: ")
        for level in result["levels"]:   # the checkpoint's tokenizer counts what came back as the server did
            # every prompt sent completed: all of the level's, or the first round that passed it early
            early = (level["early_stop"] or {}).get("rule") == "pass"
            assert level["completed"] == (level["early_stop"]["requests_done"] if early else level["num_prompts"]), level
            assert level["extra"]["total_output_tokens_retokenized"] == level["total_output_tokens"], level
        assert twin.run("ls -d /tmp/dsv4deploy-gate.* 2>/dev/null | wc -l").stdout.strip() == "0", "its caches removed"


def test_second_run_changes_nothing_and_restarts_nothing(twin):
    pid = main_pid(twin)
    out = deploy("nvfp4-ctx8k")
    assert out.returncode == 0, out.stderr[-3000:]
    assert changed_ops(out.stderr + out.stdout) == []
    assert main_pid(twin) == pid
    assert len(releases(twin)) == 1


def test_plan_shows_the_unit_diff_and_changes_nothing(twin):
    pid, before = main_pid(twin), releases(twin)
    same = run(["make", "plan", "PROFILE=nvfp4-ctx8k"])
    assert same.returncode == 0, (same.stdout + same.stderr)[-3000:]
    assert "plan: nothing to change: release 0001 (nvfp4-ctx8k) is deployed and sglang.service is active" in same.stdout
    assert "sim: " not in same.stdout + same.stderr                   # it boots nothing
    out = run(["make", "plan", "PROFILE=fp8-ctx1m-baseline"])
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-3000:]
    assert "--- /etc/systemd/system/sglang.service (on the host)" in text
    assert "+Description=SGLang 0.5.23 serving deepseek-ai/DeepSeek-V4-Flash" in text
    assert "-WantedBy=multi-user.target" not in text                  # an unchanged last line is not a change
    assert "plan: restart sglang.service because: " in text and "unit files: unit sglang.service" in text
    assert "plan: record release 0002 (fp8-ctx1m-baseline) as pending before the switch" in text
    assert "smoke gate C=64 >= 400 tok/s" in text and "failed: roll back to release 0001 (nvfp4-ctx8k)" in text
    assert main_pid(twin) == pid and releases(twin) == before
    assert "nvfp4-ctx8k" in twin.run("cat /etc/systemd/system/sglang.service").stdout
    assert twin.run("test -e /var/lib/dsv4deploy/deploy.lock", check=False).returncode != 0


def test_the_slow_baseline_fails_its_gate_early_and_rolls_back(twin, profiles):
    start = time.monotonic()
    out = deploy(SLOW, profiles_dir=profiles)
    took = time.monotonic() - start
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert f"release 0002 ({SLOW}) failed the smoke gate: C=64" in text, text[-3000:]
    assert "C=64 output throughput" in text and "< floor 400 tok/s" in text and "stopped early" in text
    assert took < 180, "the full gate of this profile would take about 27 minutes"
    assert "rolled back: release 0003 (restores 0001, profile nvfp4-ctx8k) is serving" in text
    assert "Traceback" not in text
    recs = releases(twin)
    assert [(r["release"], r["profile"], r["status"]) for r in recs] == [
        (1, "nvfp4-ctx8k", "superseded"), (2, SLOW, "failed"), (3, "nvfp4-ctx8k", "deployed")]
    assert recs[1]["gate"]["passed"] is False
    assert health(twin) == "200" and served_context(twin) == 8192


def test_switching_profile_restarts_once_and_supersedes(twin, profiles):
    pid = main_pid(twin)
    out = deploy("quick16k", profiles_dir=profiles)
    assert out.returncode == 0, out.stderr[-3000:]
    ops = changed_ops(out.stderr + out.stdout)
    assert sum(op.startswith("Restart | restart sglang.service (") for op in ops) == 1
    assert "Restart | sglang.service running and enabled" not in ops
    assert main_pid(twin) != pid and health(twin) == "200"
    recs = releases(twin)
    assert [(r["release"], r["status"]) for r in recs[-2:]] == [(3, "superseded"), (4, "deployed")]
    assert served_context(twin) == 16384


def test_bad_profile_changes_nothing(twin, profile_dir):
    profile_dir.write("oom", "extends: nvfp4-ctx8k\nserver:\n  mem_fraction_static: 0.85\n")
    pid = main_pid(twin)
    out = run(["make", "deploy", "PROFILE=oom"], env={"DSV4_PROFILES_DIR": str(profile_dir.path)})
    assert out.returncode == 2
    assert "CUDA-graph capture would run out of GPU memory" in out.stdout + out.stderr
    assert "Traceback" not in out.stdout + out.stderr
    assert main_pid(twin) == pid and len(releases(twin)) == 4


def test_sglangs_own_parser_refuses_an_argv_the_twins_parser_would_pass(twin, profiles):
    """The launch check on the twin is SGLang 0.5.23's own parser: it knows each flag's choices,
    which the twin's parser (flags and arity only) does not. Refused before anything changes,
    with argparse's message alone (not the 500-line usage above it), from the parser's captured
    table and from SGLang imported alike."""
    (profiles / "badchoice.yaml").write_text("extends: quick16k\nserver:\n  extra_args: [--attention-backend, bogus]\n")
    count, pid = len(releases(twin)), main_pid(twin)
    out = deploy("badchoice", profiles_dir=profiles)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "sglang serve: error: argument --attention-backend: invalid choice: 'bogus'" in text, text[-3000:]
    assert "usage: sglang serve" not in text
    assert changed_ops(text) == [] and len(releases(twin)) == count and main_pid(twin) == pid
    venv = live_venv(twin)
    passes = twin.run(f"{venv}/bin/python -m ct200twin.server.args --model-path m --attention-backend bogus", check=False)
    assert passes.returncode == 0, "the twin's parser has no choices: only SGLang's own catches this"
    # that verdict came from the parser table an earlier check captured, as the service account in
    # the server's sandbox, in the venv's one folder that account owns (the rest of the venv is
    # root's); without the table SGLang is imported, says the same, and captures it again
    table = f"{venv}/dsv4deploy-parser/table.json"
    assert twin.run(f"stat -c %U:%a {venv}/dsv4deploy-parser {table} {venv} {venv}/dsv4deploy.lock"
                    ).stdout.split() == ["sglang:755", "sglang:644", "root:755", "root:644"]
    twin.run(f"rm {table}")
    again = deploy("badchoice", profiles_dir=profiles)
    assert again.returncode != 0 and main_pid(twin) == pid
    assert "sglang serve: error: argument --attention-backend: invalid choice: 'bogus'" in again.stdout + again.stderr
    assert twin.run(f"test -s {table}", check=False).returncode == 0


def test_an_argv_that_parses_but_serverargs_refuses_stops_nothing(twin, profiles):
    """SGLang 0.5.23 parses `--sampling-mask-max-tokens 0` (an int) and refuses it only when it
    resolves its ServerArgs at start ("must be positive"): the launch check runs that resolution
    (its model-independent part, which needs no GPU), so the old release keeps serving."""
    (profiles / "badmask.yaml").write_text("extends: quick16k\nserver:\n  extra_args: [--sampling-mask-max-tokens, '0']\n")
    count, pid = len(releases(twin)), main_pid(twin)
    out = deploy("badmask", profiles_dir=profiles)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "SGLang's ServerArgs refuses this argv: ValueError: --sampling-mask-max-tokens must be positive" in text, \
        text[-3000:]
    assert changed_ops(text) == [] and len(releases(twin)) == count and main_pid(twin) == pid
    assert health(twin) == "200"


def test_too_few_gpus_refuses_before_changing_anything(twin):
    pid = main_pid(twin)
    twin.set_gpus(count=2)
    try:
        out = deploy("nvfp4-ctx8k")
    finally:
        twin.set_gpus(reset=True)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "preflight refused the host" in text and "tp_size 4 needs 4 GPUs; nvidia-smi lists 2 usable" in text
    assert changed_ops(text) == []
    assert main_pid(twin) == pid and len(releases(twin)) == 4


def test_no_driver_shows_the_driver_steps_in_the_plan(twin):
    twin.set_gpus(driver_installed=False)
    try:
        out = deploy("fp8-ctx1m-baseline", dry=True)
        assert twin.run("command -v nvidia-smi", check=False).returncode != 0, "a plan installs nothing"
    finally:
        twin.set_gpus(reset=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "NVIDIA driver and CUDA toolkit | stand-in: driver 580 (the inventory's command)" in out.stdout + out.stderr


def test_stale_server_on_the_port_is_detected(twin):
    twin.run("systemctl stop sglang.service")
    twin.write_file("/etc/dsv4deploy-twin/stale.json", json.dumps({"stale_model_path": "/srv/old-model"}))
    twin.run("systemd-run --unit stale-sglang -E DSV4_TWIN_FAULTS=/etc/dsv4deploy-twin/stale.json "
             f"-E PATH=/usr/bin:/bin {live_venv(twin)}/bin/python "
             "-m ct200twin.server.main --model-path /srv/old-model --port 30000")
    try:
        for _ in range(50):
            if health(twin) == "200":
                break
            time.sleep(0.2)
        out = deploy("fp8-ctx1m-baseline")
    finally:
        twin.run("systemctl stop stale-sglang.service", check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "port 30000 is already held by PID" in text and "stale server" in text
    assert len(releases(twin)) == 4


def test_manual_rollback_returns_to_the_previous_release(twin):
    out = run(["make", "rollback"])
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    recs = releases(twin)
    assert (recs[-1]["kind"], recs[-1]["restores"], recs[-1]["status"]) == ("rollback", 1, "deployed")
    assert served_context(twin) == 8192


def test_rollback_to_a_named_release_and_refusals(twin):
    out = run(["make", "rollback", "TO=4"])
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert releases(twin)[-1]["restores"] == 4 and served_context(twin) == 16384
    count = len(releases(twin))
    out = run(["make", "rollback", "TO=99"])
    assert out.returncode != 0 and "unknown release 0099" in out.stdout + out.stderr
    out = run(["make", "rollback", "TO=2"])
    assert out.returncode != 0 and "release 0002 is failed" in out.stdout + out.stderr
    assert len(releases(twin)) == count


def test_history_lists_every_release_with_its_gate(twin):
    out = run(["make", "history"])
    assert out.returncode == 0, out.stderr
    for needle in ("nvfp4-ctx8k", SLOW, "failed", "rollback of 0001", "deployed",
                   "pass: C=64", "FAIL: C=64"):
        assert needle in out.stdout, needle
    doc = json.loads(run([str(REPO / ".venv/bin/dsv4deploy"), "history", "--json"]).stdout)
    assert [r["release"] for r in doc["127.0.0.2"]] == [r["release"] for r in releases(twin)]


def test_a_sha256_mismatch_in_a_patch_is_refused_before_any_change(twin, profiles):
    (profiles / "badpatch.yaml").write_text(
        "extends: quick16k\nsglang:\n  patches:\n    - {name: twin-marker, file: tests/fixtures/patches/twin-marker.patch, "
        f"sha256: {'a' * 64}}}\n    - {{name: {MASK['name']}, file: {MASK['file']}, sha256: {MASK['sha256']}}}\n")
    count, pid = len(releases(twin)), main_pid(twin)
    out = deploy("badpatch", profiles_dir=profiles)
    assert out.returncode != 0
    assert "patch twin-marker:" in out.stdout + out.stderr and "the profile pins aaaa" in out.stdout + out.stderr
    assert changed_ops(out.stdout + out.stderr) == [] and len(releases(twin)) == count and main_pid(twin) == pid


def test_the_085_profile_forced_past_validation_crashes_at_graph_capture(twin, profiles):
    """The validator refuses TP4 at 0.85 with decode graphs up to 32; forced onto the twin as a
    unit anyway, the server OOMs at CUDA-graph capture, as the campaign's did."""
    from checkout import load_profile
    from dsv4deploy.render.unit import render

    (profiles / "oom085.yaml").write_text("extends: nvfp4-ctx8k\nserver:\n  mem_fraction_static: 0.85\n  port: 30085\n")
    os.environ["DSV4_PROFILES_DIR"] = str(profiles)
    try:
        argv = render(load_profile("oom085"), module="ct200twin.server.main").argv
    finally:
        del os.environ["DSV4_PROFILES_DIR"]
    twin.run("systemctl reset-failed oom085 2>/dev/null", check=False)
    twin.run("systemd-run --unit oom085 -E PATH=/usr/bin:/bin " + " ".join(argv))
    deadline = time.monotonic() + 60         # by the clock: a command to the twin takes ~15 ms
    while time.monotonic() < deadline:
        state = twin.run("systemctl show -p ActiveState --value oom085", check=False).stdout.strip()
        if state in ("failed", "inactive"):
            break
        time.sleep(0.2)
    journal = twin.run("journalctl -u oom085 --no-pager -o cat", check=False).stdout
    twin.run("systemctl reset-failed oom085", check=False)  # leave the twin's systemd not degraded
    assert state == "failed"
    assert "Capture cuda graph failed: CUDA out of memory" in journal
    assert "Capture target decode CUDA graph begin" in journal
