"""host/release_store.py against a fake host: its commands run here with `sh -c` over a
temporary store (those that would touch / are answered, not run), so a test sees both what the
store writes and how many round trips it costs. Records written before the store existed
(tests/fixtures/releases/) still load and are written back in the same format."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from pyinfra.api import DeployError

from dsv4deploy.release import records as releases
from dsv4deploy.host.io import sh
from dsv4deploy.host.release_store import LockCallback, ReleaseStore, RollbackError, release_write_command
from dsv4deploy.render.layout import Layout
from checkout import load_profile
from dsv4deploy.release.records import Release
from dsv4deploy.host import rollback
from dsv4deploy.host.rollback import Kept, Rollback

FIXTURES = Path(__file__).parent / "fixtures" / "releases"


class Out:
    def __init__(self, stdout: str = "", stderr: str = ""):
        self.stdout, self.stderr = stdout, stderr

    @property
    def stdout_lines(self) -> list[str]:
        return self.stdout.splitlines()


class FakeHost:
    """Runs each command here with sh -c, unless a scripted answer matches part of it."""

    name = "fake"

    def __init__(self):
        self.data = type("Data", (), {})()
        self.commands: list[str] = []
        self.answers: list[tuple[str, bool, str]] = []

    def answer(self, part: str, stdout="", ok: bool = True) -> None:
        """Answer a command holding PART with STDOUT (or STDOUT(command)) instead of running it."""
        self.answers.append((part, ok, stdout))

    def run_shell_command(self, command, **kwargs):
        self.commands.append(command)
        for part, ok, stdout in self.answers:
            if part in command:
                return ok, Out(stdout(command) if callable(stdout) else stdout)
        out = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
        return out.returncode == 0, Out(out.stdout, out.stderr)

    def get_fact(self, cls, **kwargs):
        ok, out = self.run_shell_command(cls().command(**kwargs))
        return cls().process(out.stdout.splitlines())


@pytest.fixture()
def h():
    return FakeHost()


@pytest.fixture()
def store(h, tmp_path):
    return ReleaseStore(h, str(tmp_path / "releases"), lock=str(tmp_path / "state" / "deploy.lock"),
                        root_only=False)


def begin(store: ReleaseStore, tmp_path: Path, profile: str = "nvfp4-ctx8k", manifest: str = "m1") -> Release:
    venv = tmp_path / "venv"
    venv.mkdir(exist_ok=True)
    (venv / "pip-freeze.txt").write_text("sglang==0.5.23\n")
    data = load_profile(profile).data
    rel, command = store.pending(store.records(), files={"/etc/systemd/system/sglang.service": "[Unit]\n"},
                                 profile_doc={"name": profile, "files": [], "data": data}, venv=str(venv),
                                 profile=profile, content_hash="c", manifest_sha256=manifest, sglang_version="0.5.23")
    assert sh(store.h, command)[0]          # what a deploy's switch runs first
    store.begun(rel)
    return rel


def on_disk(store: ReleaseStore, number: int) -> dict:
    return json.loads(Path(store.folder(number), "status.json").read_text())


def test_records_written_before_the_store_load_and_are_written_back_in_the_same_format(h, tmp_path):
    shutil.copytree(FIXTURES, tmp_path / "releases")
    store = ReleaseStore(h, str(tmp_path / "releases"))
    recs = store.records()
    assert [r["release"] for r in recs] == [1, 2] and store.current()["release"] == 2
    assert recs[1]["replicas"][0]["drained_s"] == 0.4
    store.save(recs[1])
    assert (tmp_path / "releases/0002/status.json").read_bytes() == (FIXTURES / "0002/status.json").read_bytes()


def test_a_new_release_is_pending_with_its_folder_in_two_commands(h, store, tmp_path):
    rel = begin(store, tmp_path)
    assert rel.number == 1 and rel.name == "release 0001" and rel.record["status"] == releases.PENDING
    assert len(h.commands) == 2                                      # the records, the folder
    folder = Path(store.folder(1))
    assert (folder / "files/etc/systemd/system/sglang.service").read_text() == "[Unit]\n"
    assert json.loads((folder / "profile.json").read_text())["name"] == "nvfp4-ctx8k"
    assert (folder / "pip-freeze.txt").read_text() == "sglang==0.5.23\n"
    assert on_disk(store, 1) == rel.record
    assert begin(store, tmp_path).number == 2


def test_a_pending_release_runs_nothing_until_the_switch_has_run_its_command(h, store, tmp_path):
    """A deploy's switch carries the pending record in its own command: `pending` sends nothing,
    numbers after the records it is given, and `begun` adds the record to the run's copy."""
    store.mark_deployed(begin(store, tmp_path))
    store.take_lock("deploy nvfp4-ctx8k")
    try:
        h.commands.clear()
        venv = tmp_path / "venv"
        rel, command = store.pending(store.records(), files={"/etc/x.service": "[Unit]\n"},
                                     profile_doc={"name": "p", "files": [], "data": {}}, venv=str(venv),
                                     profile="p", content_hash="c", manifest_sha256="m2", sglang_version="0.5.23")
        assert rel.number == 2 and rel.record["status"] == releases.PENDING and h.commands == []
        assert [r["release"] for r in store.records()] == [1]            # not written yet: not known
        assert subprocess.run(["sh", "-c", command]).returncode == 0      # what the switch runs, first
        store.begun(rel)
        assert store.records()[-1] == on_disk(store, 2) == rel.record and h.commands == []
    finally:
        store.give_back_lock()


def test_a_release_folder_is_written_by_its_one_command(tmp_path):
    """release_write_command, run here with sh -c: files, profile, the venv's freeze, status last."""
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "pip-freeze.txt").write_text("sglang==0.5.23\n")
    folder = tmp_path / "releases" / "0007"
    files = {"/etc/systemd/system/sglang.service": "[Unit]\nDescription='x' \"$y\"\n", "/etc/d/nccl.env": "A=1\n"}
    rec = {"release": 7, "status": "pending"}
    cmd = release_write_command(str(folder), str(venv), files, {"name": "p", "data": {"k": "v"}}, rec)
    assert subprocess.run(["sh", "-c", cmd]).returncode == 0
    for path, text in files.items():
        assert (folder / ("files" + path)).read_text() == text
    assert json.loads((folder / "status.json").read_text()) == rec
    assert json.loads((folder / "profile.json").read_text())["data"] == {"k": "v"}
    assert (folder / "pip-freeze.txt").read_text() == "sglang==0.5.23\n"


def test_deployed_writes_the_handle_and_supersedes_the_one_before(h, store, tmp_path):
    first = store.mark_deployed(begin(store, tmp_path, manifest="m1"))
    assert first.record["status"] == releases.DEPLOYED and on_disk(store, 1)["status"] == releases.DEPLOYED
    rel = begin(store, tmp_path, manifest="m2").with_gate({"passed": True, "summary": "ok"})
    h.commands.clear()
    live = store.mark_deployed(rel)
    assert len(h.commands) == 2                                      # the records, then one write of both
    assert on_disk(store, 2) == live.record and live.record["gate"] == {"passed": True, "summary": "ok"}
    assert live.record["reason"] is None and "deployed_at" in live.record
    assert on_disk(store, 1)["status"] == releases.SUPERSEDED and on_disk(store, 1)["reason"] == "superseded by release 0002"
    assert store.current()["release"] == 2


def test_under_the_lock_a_run_reads_the_records_once_and_keeps_its_copy_current(h, store, tmp_path):
    store.mark_deployed(begin(store, tmp_path, manifest="m1"))
    store.take_lock("deploy nvfp4-ctx8k")
    try:
        assert h.commands[-1].startswith("mkdir -p") and "status.json" in h.commands[-1]   # read with the lock
        h.commands.clear()
        rel = begin(store, tmp_path, manifest="m2")                  # writes 0002, reads nothing
        assert store.current()["release"] == 1 and store.records()[-1]["status"] == releases.PENDING
        live = store.mark_deployed(rel.with_gate({"passed": True, "summary": "ok"}))
        assert len(h.commands) == 2 and not any(c.startswith("set -- ") for c in h.commands)   # begin, save
        assert store.records() == [on_disk(store, 1), on_disk(store, 2)] and store.current() == live.record
        assert ReleaseStore(h, store.dir).current() == live.record   # another handle holds no lock: it reads
        assert len(h.commands) == 3 and h.commands[-1].startswith("set -- ")
    finally:
        store.give_back_lock()
    h.commands.clear()
    assert store.current()["release"] == 2 and h.commands[0].startswith("set -- ")   # no lock: read afresh


def test_a_failed_release_keeps_what_the_run_learnt(h, store, tmp_path):
    rel = begin(store, tmp_path).with_gate({"passed": False}).with_replicas([{"index": 0, "status": "failed"}])
    failed = rel.with_status(releases.FAILED, "smoke gate failed: C=64")
    store.save(failed.record)
    assert on_disk(store, 1) == failed.record
    assert failed.record["status"] == releases.FAILED and failed.record["reason"] == "smoke gate failed: C=64"
    assert failed.record["gate"] == {"passed": False} and failed.record["replicas"][0]["status"] == "failed"
    assert store.current() is None


def test_the_handle_is_frozen_a_change_is_a_new_one(tmp_path):
    rel = Release(releases.new_record([], profile="p", content_hash="c", manifest_sha256="m", sglang_version="v"))
    gated = rel.with_gate({"passed": True})
    assert rel.record["gate"] is None and gated.record["gate"] == {"passed": True} and gated.number == 1
    with pytest.raises(AttributeError):
        rel.record = {}                                             # type: ignore[misc]


def test_a_rollback_entry_keeps_its_cause_once_deployed(h, store, tmp_path):
    old = store.mark_deployed(begin(store, tmp_path, manifest="m1")).record
    new = Release(releases.rollback_record(store.records(), old, "manual rollback to release 0001"))
    store.save(new.record)
    live = store.mark_deployed(new)
    assert live.record["kind"] == "rollback" and live.restores == 1 and live.number == 2
    assert on_disk(store, 2)["reason"] == "manual rollback to release 0001"
    assert on_disk(store, 1)["status"] == releases.SUPERSEDED


def test_settle_interrupted_writes_each_pending_record(h, store, tmp_path):
    begin(store, tmp_path, manifest="m1")
    begin(store, tmp_path, manifest="m2")
    docs = store.settle_interrupted("m2", healthy=True)
    assert [(d["release"], d["status"]) for d in docs] == [(1, releases.FAILED), (2, releases.UNVERIFIED)]
    assert [r["status"] for r in store.records()] == [releases.FAILED, releases.UNVERIFIED]


def test_a_release_target_comes_from_its_kept_profile(h, store, tmp_path):
    rec = begin(store, tmp_path, profile="nvfp4-ctx8k-dp2").record
    assert store.target(rec).is_set and store.target(rec).unit == "sglang-gateway.service"
    Path(store.folder(1), "profile.json").write_text('{"name": "nvfp4-ctx8k-dp2", "da')     # cut short
    with pytest.raises(RollbackError, match="release 0001's profile.json is damaged"):
        store.target(rec)
    os.remove(Path(store.folder(1), "profile.json"))
    with pytest.raises(RollbackError, match="release 0001 has no profile.json: its files were pruned"):
        store.target(rec)


def test_a_kept_profile_or_manifest_is_held_to_the_boundary_rule_before_a_restore_uses_it(h, store, tmp_path):
    """Read back from the host, a kept profile's values reach commands (unit names, ports, paths) as
    a profile's do: one that breaks the rule (a newline in the service name, a venv path with a
    space) cannot be restored, and says which key."""
    rec = begin(store, tmp_path).record
    kept = Path(store.folder(1), "profile.json")
    doc = json.loads(kept.read_text())
    assert store.target(rec).unit == "sglang.service"
    doc["data"]["service"]["name"] = "sglang\nExecStartPre=+/tmp/x"
    kept.write_text(json.dumps(doc))
    with pytest.raises(RollbackError, match=r"release 0001's kept profile.json or manifest holds a value no profile "
                                            r"may \(service.name: "):
        store.target(rec)
    from dsv4deploy.host.release_store import _kept_manifest_problems
    assert _kept_manifest_problems({"patchset": "c6d34365f13f", "gateway": {"venv": "/opt/dsv4deploy/venvs/smg-1"}}) == []
    assert [w for w, _ in _kept_manifest_problems({"patchset": "a b", "gateway": {"venv": "/opt/x; rm -rf /"}})] == [
        ("manifest", "patchset"), ("manifest", "gateway", "venv")]


def not_into_this_machines_root(store: ReleaseStore, source: int = 1):
    """An answer that runs a put_back here up to its copy into / (which it leaves out)."""
    return lambda cmd: sh_here(cmd.split(f" && cp -a {store.folder(source)}/files/. /")[0])


def test_a_restore_writes_its_entry_copies_the_kept_files_and_puts_them_back_in_one_command(h, store, tmp_path):
    begin(store, tmp_path)
    entry = Release(releases.rollback_record(store.records(), store.records()[0], "manual rollback to release 0001"))
    h.answer("/files/. / &&", not_into_this_machines_root(store))
    h.commands.clear()
    assert store.put_back(1, entry, then="systemctl daemon-reload") == (True, "")
    assert len(h.commands) == 1
    assert h.commands[0].endswith(f" && cp -a {store.folder(1)}/files/. / && systemctl daemon-reload")
    assert on_disk(store, 2) == entry.record                         # the entry, with its own copy
    assert Path(store.folder(2), "files/etc/systemd/system/sglang.service").exists()
    assert Path(store.folder(2), "profile.json").read_text() == Path(store.folder(1), "profile.json").read_text()


def test_prune_keeps_the_last_releases_and_what_they_use(h, store, tmp_path):
    for n in range(1, 13):
        rel = begin(store, tmp_path, manifest=f"m{n}")
        if n == 2:
            store.mark_deployed(rel)                                 # the live one stays, however old
    layout = Layout.of(load_profile("nvfp4-ctx8k").data)
    old = "/opt/dsv4deploy/venvs/sglang-0.4.0-old"
    kept_files = [f"{store.folder(n)}/files" for n in range(2, 13)]     # 0002 is live, 0003 and later are kept
    listing = "\n".join([layout.venv, layout.model_dir, old, f"{store.folder(1)}/files", f"{store.folder(1)}/profile.json",
                         *kept_files])
    # the kept profiles are read here from tmp_path; what is on disk is answered (it names /opt, /srv)
    h.answer("echo ---", lambda cmd: sh_here(cmd.split("echo ---")[0] + "echo ---") + listing + "\n")
    h.answer("rm -rf", "")
    h.commands.clear()
    store.prune()
    assert len(h.commands) == 3                                      # records, read, remove
    rm = h.commands[-1].split()
    assert rm[:4] == ["rm", "-rf", f"{store.folder(1)}/files", f"{store.folder(1)}/profile.json"]
    assert not any(p.startswith(store.folder(2)) or p.startswith(store.folder(3)) for p in rm)
    assert old in rm and layout.venv not in rm and layout.model_dir not in rm
    # the next prune: release 0001's files are gone already, nothing else is unused: no remove
    h.answers[0] = ("echo ---", True, lambda cmd: sh_here(cmd.split("echo ---")[0] + "echo ---")
                    + "\n".join([layout.venv, layout.model_dir, *kept_files]) + "\n")
    h.commands.clear()
    store.prune()
    assert len(h.commands) == 2 and not any(c.startswith("rm -rf") for c in h.commands)


def test_prune_removes_a_servers_home_with_its_venv_and_keeps_the_kept_ones(h, store, tmp_path):
    """A venv's server home (Layout.home: HOME and the JIT caches) goes when its venv goes, and
    only then: the same venv's next start finds its caches, a removed one leaves nothing behind."""
    from dsv4deploy.render.layout import HOMES
    for n in range(1, 4):
        begin(store, tmp_path, manifest=f"m{n}")
    store.mark_deployed(Release(store.records()[-1]))
    layout = Layout.of(load_profile("nvfp4-ctx8k").data)
    old = "/opt/dsv4deploy/venvs/sglang-0.4.0-old"
    old_homes = [f"{HOMES}/sglang/sglang-0.4.0-old", f"{HOMES}/other/sglang-0.4.0-old"]
    kept_home = layout.home
    listing = "\n".join([layout.venv, old, layout.model_dir, kept_home, *old_homes])
    h.answer("echo ---", lambda cmd: sh_here(cmd.split("echo ---")[0] + "echo ---") + listing + "\n")
    h.answer("rm -rf", "")
    h.commands.clear()
    store.prune()
    assert f" {HOMES}/*/* " in h.commands[-2]                          # the listing looks for them
    rm = h.commands[-1].split()
    assert rm[:2] == ["rm", "-rf"] and sorted(rm[2:]) == sorted([old, *old_homes])


def _kept_manifest(store: ReleaseStore, number: int, venv: str, gateway_venv: str | None = None) -> None:
    """Release NUMBER's kept manifest, as a dsv4deploy with other lock files wrote it."""
    path = Path(store.folder(number), "files/etc/dsv4deploy/sglang/manifest.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"venv": venv, "patchset": venv.rsplit("-", 1)[1], "sglang_version": "0.5.23"}
    if gateway_venv:
        doc["gateway"] = {"venv": gateway_venv}
    path.write_text(json.dumps(doc, indent=2) + "\n")


def test_prune_keeps_the_venv_a_kept_release_was_built_with_after_the_lock_files_changed(h, store, tmp_path):
    """After an upgrade of dsv4deploy whose data/sglang/<v>.lock changed, the same profile names a
    new venv; the releases kept from before still start the old one (their kept unit says so), so
    pruning keeps it, and a restore looks for it."""
    for n in range(1, 4):
        begin(store, tmp_path, manifest=f"m{n}")
    store.mark_deployed(Release(store.records()[-1]))
    old_venv = "/opt/dsv4deploy/venvs/sglang-0.5.23-0ld10ck0ld1"
    _kept_manifest(store, 1, old_venv)
    layout = Layout.of(load_profile("nvfp4-ctx8k").data)
    assert layout.venv != old_venv
    listing = "\n".join([layout.venv, old_venv, layout.model_dir])
    h.answer("echo ---", lambda cmd: sh_here(cmd.split("echo ---")[0] + "echo ---") + listing + "\n")
    h.answer("rm -rf", "")
    h.commands.clear()
    store.prune()
    assert not any(c.startswith("rm -rf") for c in h.commands)         # nothing unused: the old venv is kept
    t = store.target(store.records()[0])
    assert t.layout.venv == old_venv and t.layout.python == f"{old_venv}/bin/python"
    assert store.target(store.records()[1]).layout.venv == layout.venv   # no kept manifest: as the profile says
    # pyinfra hands back a command's lines joined, without the last newline: the same with no manifest
    profile = Path(store.folder(2), "profile.json").read_text()
    h.answer("manifest.json | head -c", f"{profile}\n@@dsv4deploy-kept-manifest@@")
    assert store.target(store.records()[1]).layout.venv == layout.venv


def test_a_replica_sets_kept_gateway_venv_is_the_one_its_manifest_names(h, store, tmp_path):
    rec = begin(store, tmp_path, profile="nvfp4-ctx8k-dp2").record
    _kept_manifest(store, 1, "/opt/dsv4deploy/venvs/sglang-0.5.23-0ld10ck0ld1", gateway_venv="/opt/dsv4deploy/venvs/smg-old")
    t = store.target(rec)
    assert t.is_set and t.gateway_venv == "/opt/dsv4deploy/venvs/smg-old"
    assert t.replica(0).layout.venv == "/opt/dsv4deploy/venvs/sglang-0.5.23-0ld10ck0ld1"


def sh_here(command: str) -> str:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout


def test_nothing_to_prune_removes_nothing(h, store, tmp_path):
    store.mark_deployed(begin(store, tmp_path))
    h.answer("echo ---", "---\n")
    h.commands.clear()
    store.prune()
    assert len(h.commands) == 2 and not any(c.startswith("rm -rf") for c in h.commands)


def test_going_live_writes_the_records_and_reads_for_pruning_in_one_command(h, store, tmp_path):
    """After a passed gate: the records (and the gate's reports, carried along) and the prune's
    listing in one round trip, the removal in a second, none for the records under the lock."""
    for n in range(1, 12):
        store.mark_deployed(begin(store, tmp_path, manifest=f"m{n}"))
    layout = Layout.of(load_profile("nvfp4-ctx8k").data)
    store.take_lock("deploy nvfp4-ctx8k")
    try:
        rel = begin(store, tmp_path, manifest="m12").with_gate({"passed": True, "summary": "ok"})
        listing = "\n".join([layout.venv, layout.model_dir, f"{store.folder(1)}/files", f"{store.folder(1)}/profile.json"])
        h.answer("echo ---;", lambda cmd: sh_here(cmd.split("echo ---;")[0] + "echo ---; }") + listing + "\n")
        h.answer("rm -rf", "")
        reports = tmp_path / "reports"
        h.commands.clear()
        live = store.go_live(rel, also=f"mkdir -p {reports} && touch {reports}/gate.json")
        assert len(h.commands) == 2 and h.commands[1].split()[:4] == [
            "rm", "-rf", f"{store.folder(1)}/files", f"{store.folder(1)}/profile.json"]
        assert live.record["status"] == releases.DEPLOYED and on_disk(store, 12) == live.record
        assert on_disk(store, 11)["status"] == releases.SUPERSEDED and (reports / "gate.json").exists()
    finally:
        store.give_back_lock()


def test_with_the_prune_read_ahead_the_last_step_goes_live_and_gives_the_lock_back_in_one_command(h, store, tmp_path):
    """A deploy reads the prune's listing while its server starts (prune_survey): after its gate,
    the records, the reports, the removal and the lock's release are one command, and the lock
    is not given back a second time when the run ends."""
    for n in range(1, 12):
        store.mark_deployed(begin(store, tmp_path, manifest=f"m{n}"))
    layout = Layout.of(load_profile("nvfp4-ctx8k").data)
    old_venv = "/opt/dsv4deploy/venvs/sglang-0.5.13-aaaaaaaaaaaa"
    st = FakeState()
    store.take_lock("deploy nvfp4-ctx8k", state=st)
    (cb,) = st.handlers
    rel = begin(store, tmp_path, manifest="m12").with_gate({"passed": True, "summary": "ok"})
    listing = "\n".join([layout.venv, old_venv, layout.model_dir, f"{store.folder(1)}/files",
                         f"{store.folder(1)}/profile.json", f"{store.folder(2)}/files"])
    h.answer("echo ---;", lambda cmd: sh_here(cmd.split("echo ---;")[0] + "echo ---") + listing + "\n")
    survey = store.prune_survey()
    assert f"{store.folder(12)}/profile.json\t" in survey           # each kept profile named by its path
    reports = tmp_path / "reports"
    h.commands.clear()
    h.answer(f"rm -rf {store.folder(1)}/files", lambda cmd: sh_here(cmd.replace(old_venv, "")))   # / is not ours
    live = store.go_live(rel, also=f"mkdir -p {reports} && touch {reports}/gate.json", survey=survey, last=True)
    assert len(h.commands) == 1
    assert (f"rm -rf {store.folder(1)}/files {store.folder(1)}/profile.json {store.folder(2)}/files {old_venv}; "
            f"flock {store.lock}.flock sh -c ") in h.commands[0]          # the lock, if it is still this run's
    assert live.record["status"] == releases.DEPLOYED and on_disk(store, 12) == live.record
    assert on_disk(store, 11)["status"] == releases.SUPERSEDED and (reports / "gate.json").exists()
    assert not Path(store.lock).exists() and not store.holds_lock()
    cb.operation_end(st, "op2")                                      # the run's last operation ends
    assert len(h.commands) == 1 and not cb.held


def test_reports_that_cannot_be_kept_are_a_warning_and_the_release_still_goes_live(h, store, tmp_path, capsys):
    rel = begin(store, tmp_path).with_gate({"passed": True, "summary": "ok"})
    h.answer("ls -d", lambda cmd: sh_here(cmd.split("echo ---;")[0] + "echo ---; }"))
    live = store.go_live(rel, also="false")
    assert live.record["status"] == releases.DEPLOYED and on_disk(store, 1)["status"] == releases.DEPLOYED
    assert "warning: could not keep the gate's reports with release 0001" in capsys.readouterr().out


# --- the lock ---------------------------------------------------------------------------------

def owner(store: ReleaseStore) -> dict:
    return json.loads(Path(store.lock, "owner.json").read_text())


def test_the_lock_is_taken_in_one_command_and_given_back(h, store):
    store.take_lock("deploy nvfp4-ctx8k")
    assert len(h.commands) == 1 and owner(store)["pid"] == os.getpid() and owner(store)["what"] == "deploy nvfp4-ctx8k"
    store.give_back_lock()
    assert not Path(store.lock).exists()


def test_a_held_lock_refuses_with_its_holder_and_the_way_out(h, store):
    Path(store.lock).mkdir(parents=True)
    Path(store.lock, "owner.json").write_text(json.dumps({"controller": "elsewhere", "pid": 4242,
                                                         "started": "2025-01-01T00:00:00+00:00", "what": "rollback"}))
    with pytest.raises(DeployError) as err:
        store.take_lock("deploy nvfp4-ctx8k")
    assert str(err.value).startswith("another deploy holds the lock on this host: PID 4242 on elsewhere since "
                                     "2025-01-01T00:00:00+00:00 (rollback). If that run is gone, run again with "
                                     "--data break_lock=true (through make: make deploy PROFILE=nvfp4-ctx8k")
    store.take_lock("rollback", break_lock=True)
    assert owner(store)["pid"] == os.getpid()


def test_two_runs_that_found_the_same_dead_owner_do_not_both_take_the_lock(h, store, tmp_path):
    """Both read the dead run's owner; the first takes the lock over; the second's takeover, coming
    after, finds another owner there and removes nothing: it is refused, naming the first."""
    import socket
    Path(store.lock).mkdir(parents=True)
    dead = json.dumps({"controller": socket.gethostname(), "pid": 1 << 30})
    Path(store.lock, "owner.json").write_text(dead + "\n")
    store._break(dead)                                   # the first run's takeover
    Path(store.lock).mkdir()                             # ... and its mkdir
    first = {"controller": "elsewhere", "pid": 4242, "started": "2026-12-03T10:00:00+00:00", "what": "deploy a"}
    Path(store.lock, "owner.json").write_text(json.dumps(first) + "\n")
    store._break(dead)                                   # the second run, late with what it saw
    assert owner(store) == first                         # not removed
    with pytest.raises(DeployError, match="PID 4242 on elsewhere"):
        store.take_lock("deploy b")


def test_a_run_whose_lock_was_broken_leaves_the_new_holders_lock_when_it_ends(h, store, tmp_path):
    """Run A holds the lock; run B breaks it (break_lock=true) and takes it; when A ends, giving its
    lock back removes nothing: the lock is B's."""
    store.take_lock("deploy a")
    other = ReleaseStore(h, store.dir, lock=store.lock, root_only=False)
    other.take_lock("deploy b", break_lock=True)         # B, from another process in real life
    b = owner(store)
    assert b["what"] == "deploy b"
    store.give_back_lock()                               # A ends
    assert owner(store) == b                             # B's lock stays
    other.give_back_lock()                               # B ending: its own lock goes
    assert not Path(store.lock).exists()


def test_a_lock_left_by_a_dead_run_of_this_controller_is_taken_over(h, store, monkeypatch):
    import socket
    Path(store.lock).mkdir(parents=True)
    Path(store.lock, "owner.json").write_text(json.dumps({"controller": socket.gethostname(), "pid": 1 << 30}))
    store.take_lock("rollback")
    assert owner(store)["pid"] == os.getpid()


class FakeState:
    def __init__(self):
        self.handlers = []
        self.order = ["op1", "op2"]

    def add_callback_handler(self, handler):
        self.handlers.append(handler)

    def get_op_order(self):
        return self.order


def test_the_lock_is_given_back_when_the_last_operation_ends(h, store):
    st = FakeState()
    store.take_lock("rollback", state=st)
    (cb,) = st.handlers
    assert isinstance(cb, LockCallback) and cb.host is h
    cb.operation_end(st, "op1")
    assert Path(store.lock).exists()
    cb.operation_end(st, "op2")
    assert not Path(store.lock).exists() and not cb.held
    n = len(h.commands)
    cb._release()                                                    # at exit: already given back, no command
    assert len(h.commands) == n


# --- the deploy's read, under the lock it takes -----------------------------------------------

def locked_read(h, store):
    """What tasks.read_locked does: the host's read (here its records and the lock's owner) run
    after the command that takes the lock, in one command."""
    from dsv4deploy.host import snapshot
    from dsv4deploy.host.facts import JsonFile, Releases
    from dsv4deploy.host.state import HostState

    def read(first):
        snap = snapshot.read(h, {"releases": (Releases, {"releases_dir": store.dir}),
                                 "lock": (JsonFile, {"path": f"{store.lock}/owner.json"})}, first=first)
        return HostState(values=snap.values, first=snap.first)
    return read


def test_a_deploy_reads_the_host_in_the_command_that_takes_the_lock(h, store, tmp_path):
    """One command takes the lock and reads the host under it; the records it read are the run's
    copy (no command of their own later), and the read's own owner is not shown as another holder."""
    rel = begin(store, tmp_path)
    store.save(rel.with_status(releases.DEPLOYED).record)
    fresh = ReleaseStore(h, store.dir, lock=store.lock, root_only=False)
    n = len(h.commands)
    state = fresh.read_locked("deploy nvfp4-ctx8k", locked_read(h, fresh))
    assert len(h.commands) == n + 1 and owner(store)["what"] == "deploy nvfp4-ctx8k"
    assert [r["release"] for r in state["releases"]] == [1] and state["lock"]["pid"] == os.getpid()
    assert state.lock_holder is None
    assert fresh.current()["release"] == 1 and len(h.commands) == n + 1
    fresh.give_back_lock()
    assert not Path(store.lock).exists()


def test_a_deploy_whose_read_finds_the_lock_held_is_refused_and_leaves_it(h, store):
    Path(store.lock).mkdir(parents=True)
    theirs = json.dumps({"controller": "elsewhere", "pid": 4242, "started": "2026-12-03T10:00:00+00:00",
                         "what": "deploy a"}, sort_keys=True)
    Path(store.lock, "owner.json").write_text(theirs + "\n")
    with pytest.raises(DeployError, match=r"another deploy holds the lock on this host: PID 4242 on elsewhere"):
        store.read_locked("deploy b", locked_read(h, store))
    assert Path(store.lock, "owner.json").read_text() == theirs + "\n" and len(h.commands) == 1


def test_a_read_that_fails_after_taking_the_lock_gives_it_back(h, store, tmp_path):
    """A damaged record stops the read after its mkdir took the lock; a read whose command fails
    has no answer of the lock at all. Either way the run says so and no dead run holds the host."""
    begin(store, tmp_path)
    Path(store.folder(1), "status.json").write_text('{"release": 1, "sta')
    with pytest.raises(DeployError, match=r"a release record on the host .* is damaged"):
        store.read_locked("deploy b", locked_read(h, store))
    assert not Path(store.lock).exists()
    Path(store.folder(1), "status.json").write_text('{"release": "1", "status": "deployed"}')   # not a number
    with pytest.raises(DeployError, match="is damaged"):
        store.take_lock("rollback")
    assert not Path(store.lock).exists()
    h.answer("d=$(mktemp -d)", "", ok=False)                 # sudo, the shell or the link failed
    with pytest.raises(DeployError, match="the host's state could not be read"):
        store.read_locked("deploy b", locked_read(h, store))
    assert not Path(store.lock).exists()


def test_a_deploy_whose_read_finds_a_dead_runs_lock_takes_it_over_and_reads_again(h, store):
    import socket
    Path(store.lock).mkdir(parents=True)
    Path(store.lock, "owner.json").write_text(json.dumps({"controller": socket.gethostname(), "pid": 1 << 30}) + "\n")
    state = store.read_locked("deploy b", locked_read(h, store))
    assert owner(store)["what"] == "deploy b" and state.lock_holder is None
    assert len(h.commands) == 3        # the read that found it, the takeover, the read under this run's lock


# --- the rollback's choice and its outcome ----------------------------------------------------

def rec(n: int, status: str, manifest: str = "") -> dict:
    return {"release": n, "status": status, "manifest_sha256": manifest or f"m{n}", "profile": "p"}


def test_a_manual_rollback_chooses_the_release_before_the_live_one():
    recs = [rec(1, releases.SUPERSEDED), rec(2, releases.FAILED), rec(3, releases.SUPERSEDED, "m4"),
            rec(4, releases.DEPLOYED)]
    assert rollback.choose(recs, None)["release"] == 1             # 3 renders like the live one: no change
    assert rollback.choose(recs, 3)["release"] == 3
    with pytest.raises(DeployError, match="release 0002 is failed: only a release that passed"):
        rollback.choose(recs, 2)
    with pytest.raises(DeployError, match=r"unknown release 0009 \(releases on this host: 0001, 0002, 0003, 0004\)"):
        rollback.choose(recs, 9)
    with pytest.raises(DeployError, match="no earlier release to roll back to"):
        rollback.choose([rec(1, releases.DEPLOYED)], None)


def test_after_a_cut_off_run_a_manual_rollback_goes_back_to_the_last_release_that_passed():
    """A run cut off after its switch left release 3 pending (or settled unverified) with its files
    in place: the last release that passed is 2, the deployed one, not the one before it."""
    for left in (releases.PENDING, releases.UNVERIFIED):
        recs = [rec(1, releases.SUPERSEDED), rec(2, releases.DEPLOYED), rec(3, left)]
        assert rollback.choose(recs, None, live_manifest_sha256="m3")["release"] == 2
        # cut off before its switch: 2's files are in place, so back to the one before it
        assert rollback.choose(recs, None, live_manifest_sha256="m2")["release"] == 1
        assert rollback.choose(recs, None)["release"] == 1                  # nothing read: as before
        assert rollback.choose(recs, 1, live_manifest_sha256="m3")["release"] == 1
    # a pending release older than the live one says nothing about the files in place
    recs = [rec(1, releases.SUPERSEDED), rec(2, releases.FAILED, "m3"), rec(3, releases.DEPLOYED, "m4")]
    assert rollback.choose(recs, None, live_manifest_sha256="m3")["release"] == 1


def test_a_failure_with_no_release_that_passed_stops_the_units(h, tmp_path, monkeypatch):
    store = ReleaseStore(h, str(tmp_path / "releases"))
    rel = begin(store, tmp_path)
    h.answer("systemctl stop", "")
    t = store.target(rel.record)
    out = Rollback(store).after_failure(rel, t, "not healthy after 10 s")
    assert out == "no earlier release passed, so nothing to roll back to: sglang.service is stopped and left stopped"
    assert h.commands[-1] == "systemctl stop sglang.service"
    assert on_disk(store, 1)["status"] == releases.FAILED and on_disk(store, 1)["reason"] == "not healthy after 10 s"


def test_a_previous_release_whose_files_were_pruned_cannot_come_back(h, tmp_path, monkeypatch):
    store = ReleaseStore(h, str(tmp_path / "releases"))
    store.mark_deployed(begin(store, tmp_path, manifest="m1"))
    os.remove(Path(store.folder(1), "profile.json"))
    rel = begin(store, tmp_path, manifest="m2")
    h.answer("systemctl stop", "")
    out = Rollback(store).after_failure(rel, store.target(rel.record), "smoke gate failed: C=64")
    assert out.startswith("release 0001 has no profile.json: its files were pruned\n"
                          "NOTHING IS SERVING (sglang.service stopped)")
    # the failed release answered (its gate failed, not its health): it does not go on serving unrecorded
    assert h.commands[-1] == "systemctl stop sglang.service"
    assert "make deploy PROFILE=nvfp4-ctx8k" in out
    assert on_disk(store, 2)["status"] == releases.FAILED and on_disk(store, 2)["reason"] == "smoke gate failed: C=64"


def test_a_restore_is_a_new_entry_with_its_own_copy_then_deployed(h, tmp_path, monkeypatch):
    store = ReleaseStore(h, str(tmp_path / "releases"))
    monkeypatch.setattr(rollback, "confirm", lambda *a, **kw: None)
    monkeypatch.setattr(rollback, "probe", lambda *a, **kw: None)
    first = store.mark_deployed(begin(store, tmp_path, manifest="m1")).record
    store.mark_deployed(begin(store, tmp_path, manifest="m2"))
    h.answer("test -x", "")                                          # its venv, weights and files are there
    h.answer("/files/. / &&", not_into_this_machines_root(store))   # never copy into this machine's /
    h.commands.clear()
    new = Rollback(store).restore(first, "manual rollback to release 0001")
    assert len(h.commands) == 6      # records, profile, what is gone, entry+copy+files back, records, the writes
    assert new.number == 3 and new.restores == 1 and new.record["status"] == releases.DEPLOYED
    assert on_disk(store, 3)["reason"] == "manual rollback to release 0001"
    assert on_disk(store, 2)["status"] == releases.SUPERSEDED
    assert Path(store.folder(3), "files/etc/systemd/system/sglang.service").exists()   # restorable in turn
    assert f" && cp -a {store.folder(1)}/files/. / && systemctl daemon-reload && " in h.commands[3]
    assert h.commands[3].endswith("systemctl reset-failed sglang.service; systemctl restart sglang.service 2>&1")


def test_a_restore_whose_files_are_gone_is_a_failed_entry_naming_them(h, tmp_path, monkeypatch):
    store = ReleaseStore(h, str(tmp_path / "releases"))
    first = store.mark_deployed(begin(store, tmp_path, manifest="m1")).record
    shutil.rmtree(Path(store.folder(1), "files"))
    h.answer("test -x", f"its kept files ({store.folder(1)}/files)\n")
    with pytest.raises(RollbackError, match=r"release 0001 cannot be restored: gone from the host: its kept files"):
        Rollback(store).restore(first, "manual rollback to release 0001")
    assert on_disk(store, 2)["status"] == releases.FAILED and on_disk(store, 2)["kind"] == "rollback"
    assert on_disk(store, 2)["reason"].startswith("rollback failed: release 0001 cannot be restored")


def test_a_rollback_prepared_while_the_server_started_goes_straight_to_the_files(h, tmp_path, monkeypatch):
    """ready_to_restore reads and checks the previous release ahead of need (a deploy does it
    while its new server starts); the rollback after a failure then goes straight to the files,
    and the failed release's record rides in that same command."""
    store = ReleaseStore(h, str(tmp_path / "releases"))
    monkeypatch.setattr(rollback, "confirm", lambda *a, **kw: None)
    monkeypatch.setattr(rollback, "probe", lambda *a, **kw: None)
    good = store.mark_deployed(begin(store, tmp_path, manifest="m1")).record
    h.answer("test -x", "")                                          # its venv, weights and files are there
    h.answer("/files/. / &&", not_into_this_machines_root(store))   # never copy into this machine's /
    ready = Rollback(store).ready(good)
    assert ready.record == good and ready.target.unit == "sglang.service" and ready.checked
    store.take_lock("deploy nvfp4-ctx8k")
    try:
        bad = begin(store, tmp_path, manifest="m2")
        h.commands.clear()
        out = Rollback(store).after_failure(bad, store.target(bad.record), "not healthy after 10 s", ready=ready)
        h.commands.remove(h.commands[0])                             # the test's own store.target(bad)
        # the failed record + the entry + its copy + the files back + restart, then the records
        assert len(h.commands) == 2 and not any(c.startswith(("cat ", "test -x")) for c in h.commands)
        assert f"{store.folder(2)}/status.json" in h.commands[0] and "/files/. / &&" in h.commands[0]
        assert out.startswith("rolled back: release 0003 (restores 0001")
        assert on_disk(store, 2)["status"] == releases.FAILED and on_disk(store, 2)["reason"] == "not healthy after 10 s"
        assert on_disk(store, 3)["status"] == releases.DEPLOYED and on_disk(store, 3)["restores"] == 1
    finally:
        store.give_back_lock()


def test_a_rollback_that_ends_the_run_gives_the_lock_back_with_its_last_record(h, tmp_path, monkeypatch):
    store = ReleaseStore(h, str(tmp_path / "releases"), lock=str(tmp_path / "state" / "deploy.lock"),
                        root_only=False)
    monkeypatch.setattr(rollback, "confirm", lambda *a, **kw: None)
    monkeypatch.setattr(rollback, "probe", lambda *a, **kw: None)
    good = store.mark_deployed(begin(store, tmp_path, manifest="m1")).record
    h.answer("/files/. / &&", not_into_this_machines_root(store))
    st = FakeState()
    store.take_lock("deploy nvfp4-ctx8k", state=st)
    (cb,) = st.handlers
    bad = begin(store, tmp_path, manifest="m2")
    ready = Kept(good, store.target(good), checked=True)
    h.commands.clear()
    Rollback(store).after_failure(bad, ready.target, "not healthy after 10 s", ready=ready, last=True)
    assert len(h.commands) == 2 and f"; flock {store.lock}.flock sh -c " in h.commands[1]   # the files; the records + the lock
    assert not Path(store.lock).exists() and on_disk(store, 3)["status"] == releases.DEPLOYED
    cb.operation_end(st, "op2")
    assert len(h.commands) == 2 and not cb.held


def test_a_previous_release_that_is_not_restorable_is_not_ready_and_the_rollback_says_why(h, tmp_path, monkeypatch):
    store = ReleaseStore(h, str(tmp_path / "releases"))
    good = store.mark_deployed(begin(store, tmp_path, manifest="m1")).record
    h.answer("test -x", "its venv (/opt/dsv4deploy/venvs/x)\n")
    assert Rollback(store).ready(good) is None and Rollback(store).ready(None) is None
    bad = begin(store, tmp_path, manifest="m2")
    h.answer("systemctl stop", "")
    out = Rollback(store).after_failure(bad, store.target(bad.record), "not healthy after 10 s", ready=None)
    assert "cannot be restored: gone from the host: its venv" in out and "NOTHING IS SERVING" in out
    assert h.commands[-1] == "systemctl stop sglang.service"
    assert on_disk(store, 2)["status"] == releases.FAILED and on_disk(store, 2)["reason"] == "not healthy after 10 s"
    assert on_disk(store, 3)["status"] == releases.FAILED and on_disk(store, 3)["kind"] == "rollback"


def test_the_records_fact_reads_every_record_as_written_by_any_version(tmp_path):
    """The Releases fact's one command (one awk for all, each record on its own line) against
    records written before the store existed, a release folder without a record, and none."""
    from dsv4deploy.host.facts import Releases
    store = tmp_path / "releases"
    shutil.copytree(FIXTURES, store)
    (store / "0099").mkdir()                                          # a folder whose record is gone
    expected = sorted((json.loads(p.read_text()) for p in store.glob("[0-9]*/status.json")), key=lambda d: d["release"])
    assert len(expected) >= 2
    fact = Releases()
    assert fact.process(sh_here(fact.command(releases_dir=str(store))).splitlines()) == expected
    assert sh_here(fact.command(releases_dir=str(tmp_path / "none"))) == ""


def test_a_deploy_reads_the_records_it_decides_from_not_the_whole_history(tmp_path, monkeypatch):
    """RecentReleases (the deploy's read): the newest by number (as numbers: 10000 after 9999),
    every release whose files are kept, every one deployed, pending or unverified however old;
    not the pruned, ended ones. An empty record anywhere, or one awk cannot read, still stops it."""
    from dsv4deploy.host import facts
    monkeypatch.setattr(facts, "RECENT", 3)
    store = tmp_path / "releases"
    status = {2: "pending", 3: "deployed", 4: "unverified"}
    for n in [*range(1, 9), 9998, 9999, 10000, 10001]:
        folder = store / f"{n:04d}"
        folder.mkdir(parents=True)
        (folder / "status.json").write_text(json.dumps({"release": n, "status": status.get(n, "superseded"),
                                                        "gate": {"levels": [{"status": "ok"}]}}, indent=2) + "\n")
        if n == 6:
            (folder / "profile.json").write_text("{}\n")          # its files are kept: a rollback can restore it
    recent, every = facts.RecentReleases(), facts.Releases()

    def read(fact):
        return fact.process(sh_here(fact.command(releases_dir=str(store))).splitlines())
    got = read(recent)
    assert [r["release"] for r in got] == [2, 3, 4, 6, 9999, 10000, 10001]
    assert len(read(every)) == 12
    assert releases.next_number(got) == 10002 and releases.current(got)["release"] == 3
    (store / "0005" / "profile.json").mkdir()                   # something awk cannot read as a file
    with pytest.raises(ValueError, match="could not all be read"):
        read(recent)
    (store / "0005" / "profile.json").rmdir()
    (store / "0001" / "status.json").write_text("")
    with pytest.raises(ValueError, match="0001/status.json"):
        read(recent)
    assert sh_here(recent.command(releases_dir=str(tmp_path / "none"))) == ""


def test_a_manual_rollback_that_fails_after_its_switch_puts_the_release_that_served_back(h, tmp_path, monkeypatch):
    """`make rollback TO=1` put 0001's files in place and its server never became healthy: the
    release that served before (0002) comes back as a new entry, probed, so the host ends where it
    was; the failed attempt stays in the history."""
    from dsv4deploy.sglang.health import HealthError
    store = ReleaseStore(h, str(tmp_path / "releases"))
    monkeypatch.setattr(rollback, "probe", lambda *a, **kw: None)
    monkeypatch.setattr(rollback, "journal_tail", lambda *a, **kw: "CUDA error")
    first = store.mark_deployed(begin(store, tmp_path, manifest="m1")).record
    live = store.mark_deployed(begin(store, tmp_path, manifest="m2")).record
    h.answer("test -x", "")
    h.answer("/files/. / &&", not_into_this_machines_root(store))
    tries = []

    def confirm(h_, t, **kw):
        tries.append(len(tries))
        if len(tries) == 1:
            raise HealthError("not healthy after 1800 s")
    monkeypatch.setattr(rollback, "confirm", confirm)
    with pytest.raises(rollback.RollbackError) as exc:
        Rollback(store, poll_s=0.1).manual(first, live)
    assert exc.value.switched
    said = str(exc.value).splitlines()
    assert said[0] == "rollback to release 0001 failed: not healthy after 1800 s" and "CUDA error" in said
    assert said[-1] == ("release 0002 (nvfp4-ctx8k), which served before, is serving again (release 0004); "
                        "the failed rollback to release 0001 is in the history")
    assert [(r["release"], r["status"], r.get("restores")) for r in store.records()] == [
        (1, releases.SUPERSEDED, None), (2, releases.SUPERSEDED, None), (3, releases.FAILED, 1),
        (4, releases.DEPLOYED, 2)]
    # and when the release that served cannot come back either: its units stop, and the message says so
    tries.clear()
    monkeypatch.setattr(rollback, "confirm", lambda *a, **kw: (_ for _ in ()).throw(HealthError("crash")))
    h.answer("systemctl stop", "")
    said = Rollback(store, poll_s=0.1).back_to_live(store.records()[-1], first)
    assert "NOTHING IS SERVING (sglang.service stopped): neither release 0001 nor 0004" in said


def test_a_login_that_is_not_root_is_refused_at_the_lock_with_nothing_written(h, tmp_path):
    """The host's lock command asks who runs it first: a login without root (no sudo) gets the
    login's own refusal, not "another deploy holds the lock", and the lock's folder is not made."""
    store = ReleaseStore(h, str(tmp_path / "releases"), lock=str(tmp_path / "state" / "deploy.lock"))
    h.answer("dsv4deploy-login-not-root", stdout="dsv4deploy-login-not-root ops 1000 yes\n", ok=False)
    with pytest.raises(DeployError) as err:
        store.take_lock("deploy nvfp4-ctx8k")
    assert str(err.value) == ("the deploy logs in as ops (uid 1000) without sudo, but it writes /opt, /etc, /srv, "
                              "/var/lib and systemd units as root: ops has passwordless sudo there: use it (CT200_SUDO=1 "
                              "with inventory/ct200.py, pyinfra's --sudo, or host data _sudo: True). Nothing was changed "
                              "on the host.")
    assert not store.holds_lock() and not (tmp_path / "state").exists()
