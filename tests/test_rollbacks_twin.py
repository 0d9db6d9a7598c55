"""Rollbacks on a twin of its own: a release that crashes at start, never gets healthy, fails its
gate with errors or crashes in the middle of it is recorded `failed`, and the release that passed
before serves again, in the same run; and a patch set gets its own venv with an API key in 0600
files only.

An isolated twin (`sim up --fleet rollbacks`, its own network namespace) in `make test`'s process
of the fleet of three, after it: the default twin's process (tests/test_deploy_twin.py) is the
longest of the four, and these need none of its releases. They deploy as tests/test_deploy_twin.py
does, with the twin's own parser for the launch check (SGLang's own: tests/test_deploy_twin.py).
"""

from __future__ import annotations

import json
import time

import pytest

from dsv4deploy.host.accounts import MARKER
from dsv4deploy.render.layout import GATE_USER
from dsv4deploy.sglang.patches import MASK_SECRETS_PATCH as MASK
from ct200twin import faultlab
from ct200twin.faultlab import FAST_START, FAULTS, QUICK_GATE, changed_ops, health, releases, served_context
from sim_fixtures import ROLLBACK_ENV, rollback_twin  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.fleet]

INVENTORY = "inventory/fleet-sim.py"
# quick16k serves first (release 0001); each fault variant has its own context length, which the
# twin's fault file matches (match_argv), so the fault hits that release and not the one the
# rollback restores.
VARIANTS = {"quick16k": 16384, "crash20k": 20480, "never12k": 12288, "errors24k": 24576, "midgate28k": 28672}
PATCH_SHA = "0ff2621cdc51dbe59a0cc7e2a882616a1bd07451ba23dff8e6148e85966c90f9"


def deploy(profile: str, profiles_dir):
    return faultlab.deploy(profile, profiles_dir=profiles_dir, env=ROLLBACK_ENV, inventory=INVENTORY)


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    return faultlab.write_profiles(tmp_path_factory.mktemp("profiles"), {
        name: faultlab.variant(ctx, gate=QUICK_GATE, extra="service:\n  health_timeout_s: 10\n" if name == "never12k" else "")
        for name, ctx in VARIANTS.items()})


@pytest.fixture(scope="module")
def twin(rollback_twin, profiles):  # noqa: F811
    """The rollbacks' twin with no faults, no release of an earlier run, and quick16k serving (0001)."""
    rollback_twin.run("systemctl stop sglang.service 2>/dev/null; systemctl reset-failed 2>/dev/null; "
                      "rm -rf /var/lib/dsv4deploy /etc/dsv4deploy /etc/systemd/system/sglang.service; "
                      "systemctl daemon-reload", check=False)
    rollback_twin.write_file(FAULTS, json.dumps(FAST_START))
    out = deploy("quick16k", profiles)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert [(r["release"], r["status"]) for r in releases(rollback_twin)] == [(1, "deployed")]
    # the accounts it made (or an earlier release made and it adopted) carry its mark
    comments = rollback_twin.run(f"getent passwd sglang {GATE_USER} | cut -d: -f5").stdout.split("\n")[:2]
    assert comments == [MARKER, MARKER]
    yield rollback_twin
    rollback_twin.run(f"rm -f {FAULTS}", check=False)


def with_faults(twin, faults: dict, profile: str, profiles_dir):
    twin.write_file(FAULTS, json.dumps({**FAST_START, **faults}))
    try:
        start = time.monotonic()
        out = deploy(profile, profiles_dir)
        return out, time.monotonic() - start
    finally:
        twin.write_file(FAULTS, json.dumps(FAST_START))


def test_crash_on_start_fails_fast_with_the_journal_and_rolls_back(twin, profiles):
    out, took = with_faults(twin, {"crash_on_start": "simulated CUDA error", "match_argv": "--context-length 20480"},
                            "crash20k", profiles)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "release 0002 (crash20k) failed: unit" in text, text[-3000:]
    assert "simulated CUDA error" in text, "the journal lines are shown"
    assert "rolled back: release 0003 (restores 0001, profile quick16k) is serving" in text
    assert took < 120
    assert [(r["release"], r["status"], r.get("restores")) for r in releases(twin)[-2:]] == [
        (2, "failed", None), (3, "deployed", 1)]
    assert health(twin) == "200" and served_context(twin) == 16384


def test_never_healthy_fails_at_the_budget_and_rolls_back(twin, profiles):
    out, _ = with_faults(twin, {"never_healthy": True, "match_argv": "--context-length 12288"}, "never12k", profiles)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "release 0004 (never12k) failed: not healthy after 10 s (last: 503" in text, text[-3000:]
    why = [line[:600] for line in text.splitlines() if any(k in line for k in (
        "rollback to release", "cannot be restored", "could not restore", "NOTHING IS SERVING", "probe request",
        "server answering", "Errno", "unit crashed", "unit is", "Main process exited"))]
    assert "rolled back: release 0005 (restores 0001" in text, "\n".join(why) or text[-4000:]
    assert health(twin) == "200" and served_context(twin) == 16384


def test_an_error_rate_fails_the_gate_and_rolls_back(twin, profiles):
    out, _ = with_faults(twin, {"error_rate": 0.2, "match_argv": "--context-length 24576"}, "errors24k", profiles)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "release 0006 (errors24k) failed the smoke gate: C=64 failed: 1 failed request > max 0" in text, text[-3000:]
    assert "rolled back: release 0007 (restores 0001" in text, text[-4000:]
    assert releases(twin)[-2]["status"] == "failed"
    assert health(twin) == "200" and served_context(twin) == 16384


def test_a_crash_in_the_middle_of_the_gate_rolls_back(twin, profiles):
    out, took = with_faults(twin, {"crash_after_requests": 10, "match_argv": "--context-length 28672"},
                            "midgate28k", profiles)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "release 0008 (midgate28k) failed the smoke gate" in text, text[-3000:]
    assert "rolled back: release 0009 (restores 0001" in text, text[-4000:]
    assert took < 240
    assert health(twin) == "200" and served_context(twin) == 16384


def test_patched_venv_and_api_key_end_to_end(twin, profiles):
    """A patch set gets its own venv, applied once; an API key lives only in 0600 files."""
    (profiles / "secured.yaml").write_text(
        "extends: quick16k\nserver:\n  api_key: true\nsglang:\n  patches:\n"
        f"    - {{name: twin-marker, file: tests/fixtures/patches/twin-marker.patch, sha256: {PATCH_SHA}}}\n"
        f"    - {{name: {MASK['name']}, file: {MASK['file']}, sha256: {MASK['sha256']}}}\n")
    out = deploy("secured", profiles_dir=profiles)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "Launch check | the twin's parser (stand-in" in (out.stdout + out.stderr)
    venv = json.loads(twin.run("cat /etc/dsv4deploy/sglang/manifest.json").stdout)["venv"]
    assert venv != "/opt/dsv4deploy/venvs/sglang-0.5.23-nopatch" and venv.startswith("/opt/dsv4deploy/venvs/sglang-0.5.23-")
    assert twin.run(f"{venv}/bin/python -c 'import dsv4deploy_patch_marker as m; print(m.APPLIED)'").stdout.strip() == "True"
    assert twin.run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/server_info").stdout == "401"
    key = twin.run("cat /etc/dsv4deploy/secrets/sglang-api-key").stdout.strip()
    assert len(key) >= 32
    assert twin.run(f"curl -s -o /dev/null -w '%{{http_code}}' -H 'Authorization: Bearer {key}' "
                    "http://127.0.0.1:30000/server_info").stdout == "200"
    assert twin.run("stat -c '%a %U' /etc/dsv4deploy/secrets/sglang-sglang-config.yaml").stdout.strip() == "600 root"
    for where in ("cat /etc/systemd/system/sglang.service", "systemctl show -p ExecStart sglang.service",
                  "cat /etc/dsv4deploy/sglang/manifest.json", "cat /var/lib/dsv4deploy/releases/*/status.json"):
        assert key not in twin.run(where).stdout, where
    assert key not in out.stdout + out.stderr
    again = deploy("secured", profiles_dir=profiles)
    assert again.returncode == 0 and changed_ops(again.stdout + again.stderr) == []
    # the unit alone changes: the serving release passed this launch check (same argv, same venv)
    (profiles / "secured-stop.yaml").write_text("extends: secured\nservice:\n  timeout_stop_s: 117\n")
    unit_only = deploy("secured-stop", profiles_dir=profiles)
    text = unit_only.stdout + unit_only.stderr
    assert unit_only.returncode == 0, text[-3000:]
    assert "Restart | restart sglang.service (" in " ".join(changed_ops(text))
    assert not any(op.startswith("Launch check") for op in changed_ops(text))
    assert "passed it with this argv and venv" in text and "not run again" in text


def test_a_login_account_as_service_user_is_refused_before_any_change(twin, profiles):
    """service.user naming an operator's login account (no inventory can know it): the host's
    read shows it and preflight stops the deploy before its first change."""
    twin.run("getent passwd alice >/dev/null || useradd --create-home --shell /bin/bash alice")
    before = twin.run("getent passwd alice").stdout
    (profiles / "alice16k.yaml").write_text("extends: quick16k\nservice:\n  user: alice\n")
    out = deploy("alice16k", profiles)
    text = out.stdout + out.stderr
    assert out.returncode != 0, text[-3000:]
    assert "account 'alice' (service.user: runs the server) cannot be the deploy's: it is a login account" in text
    assert "Nothing was changed on the host" in text
    assert twin.run("getent passwd alice").stdout == before                  # still /bin/bash, its own home
    assert changed_ops(text) == []
    assert [r["profile"] for r in releases(twin)].count("alice16k") == 0 and health(twin) == "200"


def test_the_report_page_shows_every_release_its_rollbacks_and_the_gate_figures(twin):
    """`dsv4deploy report` reads this twin's history over SSH (docs/report.md): every release in
    its status, each failed one with the rollback that followed, and the figures of the gate
    reports it links (tests/test_report_browser.py opens such a page in Chromium)."""
    import re
    from report_checks import mismatches, shown
    out = faultlab.run([str(faultlab.REPO / ".venv/bin/dsv4deploy"), "report", "--inventory", INVENTORY],
                       env=ROLLBACK_ENV)
    assert out.returncode == 0, out.stdout + out.stderr
    host = releases(twin)
    html = (faultlab.REPO / "reports" / f"host-{ROLLBACK_ENV['DSV4_SIM_FLEET']}-1.html").read_text()
    assert shown(html).releases == {f"{r['release']:04d}": r["status"] for r in host}
    for before, after in zip(host, host[1:]):
        if before["status"] == "failed" and after["kind"] == "rollback":
            assert f"rolled back (release {after['release']:04d} restores {after['restores']:04d})" in html
    linked = re.findall(r'href="([^"]+)/gate\.json"', html)
    assert linked, "the gated releases link their reports"
    docs = {folder.rsplit("/", 1)[1][:4]: json.loads((faultlab.REPO / "reports" / folder / "gate.json").read_text())
            for folder in linked}
    assert mismatches(html, docs) == []
