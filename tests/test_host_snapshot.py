"""host/snapshot.py: many facts, one command. The batch runs here with `sh -c`, as the host
would run it, over real files, packages and accounts of this machine."""

from __future__ import annotations

import grp
import hashlib
import json
import os
import pwd
import subprocess

import pytest

from dsv4deploy.host import snapshot
from dsv4deploy.host.facts import Accounts, DebPackages, FileStates, JsonFile, UnitInfo


def _run(queries, nonce="__dsv4_test"):
    out = subprocess.run(["sh", "-c", snapshot.batch_command(queries, nonce)], capture_output=True, text=True)
    assert out.returncode == 0
    return snapshot.interpret(queries, snapshot.split_output(out.stdout.splitlines(), nonce))


def test_one_command_answers_every_fact_with_its_own_parser(tmp_path):
    f = tmp_path / "unit file"
    f.write_text("[Unit]\n")
    os.chmod(f, 0o640)
    doc = tmp_path / "owner.json"
    doc.write_text(json.dumps({"pid": 7}))
    values = _run({
        "files": (FileStates, {"paths": [str(f), str(tmp_path), str(tmp_path / "missing")]}),
        "packages": (DebPackages, {"names": ["bash", "no-such-package-xyz"]}),
        "accounts": (Accounts, {"users": ["root", "no-such-user-xyz"], "groups": ["root"]}),
        "lock": (JsonFile, {"path": str(doc)}),
        "nolock": (JsonFile, {"path": str(tmp_path / "none.json")}),
    })
    assert values["files"][str(f)] == {"type": "file", "mode": "640", "user": "root", "group": "root",
                                       "sha256": hashlib.sha256(b"[Unit]\n").hexdigest()}
    assert values["files"][str(tmp_path)]["type"] == "dir" and values["files"][str(tmp_path)]["sha256"] is None
    assert str(tmp_path / "missing") not in values["files"]
    assert values["packages"] == {"bash": True}
    assert values["accounts"]["users"]["root"]["home"] == "/root" and values["accounts"]["groups"]["root"] == 0
    assert "no-such-user-xyz" not in values["accounts"]["users"]
    assert values["lock"] == {"pid": 7} and values["nolock"] is None


def test_a_failing_fact_gets_its_default_and_the_others_still_answer(tmp_path):
    class Broken(JsonFile):
        def command(self, path):
            return "echo 'not json'; exit 3"

    values = _run({"broken": (Broken, {"path": "x"}), "files": (FileStates, {"paths": [str(tmp_path)]})})
    assert values["broken"] is None
    assert values["files"][str(tmp_path)]["type"] == "dir"


def test_facts_run_at_the_same_time_and_each_keeps_its_own_lines_and_status(tmp_path):
    """The batch starts every fact at once: a slow first fact finishing last, a fact that prints no
    final newline, one that fails; each gets exactly its own output and exit status, in order,
    and the batch leaves no temporary file behind."""
    class Shell(JsonFile):
        def command(self, path):
            return path

    queries = {"slow": (Shell, {"path": f"sleep 0.3; echo slow; date +%s%N > {tmp_path}/slow"}),
               "quick": (Shell, {"path": f"printf 'a\\nb'; date +%s%N > {tmp_path}/quick"}),
               "failing": (Shell, {"path": "echo partial; exit 4"})}
    temp = tmp_path / "tmp"
    temp.mkdir()
    out = subprocess.run(["sh", "-c", snapshot.batch_command(queries, "__dsv4_t")], capture_output=True, text=True,
                         env={**os.environ, "TMPDIR": str(temp)})             # where mktemp -d makes its folder
    parts = snapshot.split_output(out.stdout.splitlines(), "__dsv4_t")
    assert parts == {"slow": (["slow"], 0), "quick": (["a", "b"], 0), "failing": (["partial"], 4)}
    assert int((tmp_path / "quick").read_text()) < int((tmp_path / "slow").read_text())   # not one after the other
    assert list(temp.iterdir()) == []


def test_output_that_looks_like_a_marker_without_the_nonce_stays_data():
    lines = ["__dsv4_abc k1", "__dsv4_other k2", "line", "", "__dsv4_abcrc k1 0"]
    assert snapshot.split_output(lines, "__dsv4_abc") == {"k1": (["__dsv4_other k2", "line"], 0)}


def test_stdin_of_a_fact_is_closed_so_it_cannot_eat_the_rest_of_the_batch(tmp_path):
    class Reader(JsonFile):
        def command(self, path):
            return "cat"        # would block or swallow input without </dev/null

    values = _run({"r": (Reader, {"path": "x"}), "f": (FileStates, {"paths": [str(tmp_path)]})})
    assert values["r"] is None and values["f"]


def test_unit_info_of_a_unit_systemd_does_not_know():
    # no systemd here (or the unit is unknown): the fact's default, no exception
    values = _run({"unit": (UnitInfo, {"service": "dsv4deploy-no-such-unit"})})
    assert isinstance(values["unit"], dict)


def test_a_star_in_a_managed_path_is_a_glob_keyed_by_what_it_found(tmp_path):
    site = tmp_path / "venv dir" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (site / "x.pth").write_text("/opt\n")
    pattern = f"{tmp_path}/venv dir/lib/python3*/site-packages/x.pth"
    values = _run({"files": (FileStates, {"paths": [pattern, f"{tmp_path}/none*/y"]})})
    assert list(values["files"]) == [str(site / "x.pth")]


def test_links_empty_files_and_odd_names_read_as_they_are_and_only_regular_files_are_hashed(tmp_path):
    empty = tmp_path / "an empty file"
    empty.write_bytes(b"")
    text = tmp_path / "two  spaces"
    text.write_text("x\n")
    link = tmp_path / "python"
    link.symlink_to(text)
    dangling = tmp_path / "gone"
    dangling.symlink_to(tmp_path / "nowhere")
    values = _run({"files": (FileStates, {"paths": [str(empty), str(text), str(link), str(dangling)]})})
    files = values["files"]
    assert files[str(empty)]["type"] == "file" and files[str(empty)]["sha256"] == hashlib.sha256(b"").hexdigest()
    assert files[str(text)]["sha256"] == hashlib.sha256(b"x\n").hexdigest()
    me, my_group = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
    assert files[str(link)] == {"type": "link", "mode": "777", "user": me, "group": my_group, "sha256": None}
    assert files[str(dangling)]["type"] == "link"
    tab = tmp_path / "ta\tb"               # sha256sum leaves a tab in a name as is: still its digest line
    tab.write_text("t\n")
    assert _run({"files": (FileStates, {"paths": [f"{tmp_path}/ta*"]})})["files"] == {
        str(tab): {"type": "file", "mode": "644", "user": me, "group": my_group,
                   "sha256": hashlib.sha256(b"t\n").hexdigest()}}


def _smg_body(name: str) -> list[str]:
    from pathlib import Path
    doc = json.loads((Path(__file__).parent / "fixtures" / "smg" / name).read_text())
    return json.dumps(doc["body"], indent=2).splitlines()


def test_gateway_workers_lists_what_smg_routes_to_and_none_when_it_does_not_answer():
    from dsv4deploy.host.facts import GatewayWorkers
    fact = GatewayWorkers()
    two = fact.process(_smg_body("workers_two_ready.json"))
    assert [w["url"] for w in two] == ["http://127.0.0.1:31002", "http://127.0.0.1:31001"]
    assert all(set(w) == {"url", "status", "healthy"} for w in two)
    assert [w["url"] for w in fact.process(_smg_body("workers_one_removed.json"))] != [w["url"] for w in two]
    assert fact.process(_smg_body("workers_no_key.json")) is None          # a 401 body: not a worker list
    assert fact.process([]) is None                                        # nothing answered
    # the API key reaches curl on its stdin, from the shell's own printf: never an argument
    cmd = fact.command("http://127.0.0.1:30000", "/etc/dsv4deploy/secrets/sglang-api-key")
    assert "| curl -s -m 5 -H @- http://127.0.0.1:30000/workers" in cmd and "printf 'Authorization: Bearer %s" in cmd
    assert fact.command("http://127.0.0.1:30000") == "curl -s -m 5 http://127.0.0.1:30000/workers || true"


def test_gateway_workers_command_sends_the_key_on_stdin(tmp_path):
    """Run with a stand-in curl that prints its argv and its stdin: the key is only on stdin."""
    from dsv4deploy.host.facts import GatewayWorkers
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "curl").write_text("#!/bin/sh\necho \"argv: $*\"; cat\n")
    (bin_dir / "curl").chmod(0o755)
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    cmd = GatewayWorkers().command("http://127.0.0.1:30000", str(key))
    out = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True,
                         env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}).stdout
    assert out.splitlines() == ["argv: -s -m 5 -H @- http://127.0.0.1:30000/workers", "Authorization: Bearer s3cret"]


def test_the_first_command_runs_before_every_fact_and_answers_on_its_own(tmp_path):
    """FIRST (the deploy lock) runs before the facts start, so they read what it left; its output
    and status come back apart from theirs, and a failing FIRST does not stop them."""
    class Shell(JsonFile):
        def command(self, path):
            return path

    flag = tmp_path / "taken"
    queries = {"sees": (Shell, {"path": f"cat {flag}"})}
    for first, status in ((f"sleep 0.2; echo mine > {flag}; echo took", 0), ("echo held by 42; exit 1", 1)):
        out = subprocess.run(["sh", "-c", snapshot.batch_command(queries, "__dsv4_t", first=first)],
                             capture_output=True, text=True)
        parts = snapshot.split_output(out.stdout.splitlines(), "__dsv4_t")
        assert parts["sees"] == (["mine"], 0)
        assert parts[snapshot.FIRST] == ((["took"], 0) if status == 0 else (["held by 42"], 1))


def test_a_damaged_release_record_stops_the_read_instead_of_reading_as_none(tmp_path):
    """Read as "no records", a damaged status.json would let the next release take a number the
    host already holds: the records are strict, the other facts are not."""
    from pyinfra.api import DeployError

    from dsv4deploy.host.facts import Releases
    for n, text in ((1, json.dumps({"release": 1, "status": "deployed"})), (2, '{"release": 2, "stat')):
        (tmp_path / f"{n:04d}").mkdir()
        (tmp_path / f"{n:04d}" / "status.json").write_text(text)
    with pytest.raises(DeployError, match=r"a release record on the host \(a releases/NNNN/status.json\) is damaged"):
        _run({"releases": (Releases, {"releases_dir": str(tmp_path)})})
    (tmp_path / "0002" / "status.json").write_text(json.dumps({"release": 2, "status": "failed"}))
    assert [r["release"] for r in _run({"releases": (Releases, {"releases_dir": str(tmp_path)})})["releases"]] == [1, 2]
    # an empty record (a full disk, a crash) and one of blank lines are damaged too, not "no record"
    (tmp_path / "0003").mkdir()
    (tmp_path / "0003" / "status.json").write_text("")
    with pytest.raises(DeployError, match=r"is empty or not a file: .*/0003/status.json"):
        _run({"releases": (Releases, {"releases_dir": str(tmp_path)})})
    (tmp_path / "0003" / "status.json").unlink()
    (tmp_path / "0003" / "status.json").mkdir()             # not a file: damaged, even as the first one
    (tmp_path / "0001" / "status.json").rename(tmp_path / "0001" / "kept.json")
    (tmp_path / "0001" / "status.json").mkdir()
    with pytest.raises(DeployError, match=r"is empty or not a file: .*/0001/status.json"):
        _run({"releases": (Releases, {"releases_dir": str(tmp_path)})})
    (tmp_path / "0001" / "status.json").rmdir()
    (tmp_path / "0001" / "kept.json").rename(tmp_path / "0001" / "status.json")
    (tmp_path / "0003" / "status.json").rmdir()
    (tmp_path / "0003" / "status.json").write_text("\n\n")
    with pytest.raises(DeployError, match=r"is damaged"):
        _run({"releases": (Releases, {"releases_dir": str(tmp_path)})})


def test_a_gateway_started_from_other_files_than_those_in_place_reads_as_stale(tmp_path):
    """The marker the deploy writes when it (re)starts the gateway (its MainPID, its files' sha256)
    against now: other files under the same process is stale; no marker (a boot) or another
    process (systemd or a person restarted it since) says nothing."""
    from dsv4deploy.host.facts import GatewayStale, pid_and_files_command

    pid = tmp_path / "pid"
    pid.write_text("4242\n")
    fake = tmp_path / "systemctl"
    fake.write_text(f"#!/bin/sh\ncat {pid}\n")
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    unit, launcher, marker = tmp_path / "gateway.service", tmp_path / "launch.py", tmp_path / "started"
    unit.write_text("ExecStart=smg --policy round_robin\n")
    launcher.write_text("print('launch')\n")
    args = {"unit": "sglang-gateway.service", "files": [str(unit), str(launcher)], "marker": str(marker)}

    def stale() -> bool:
        out = subprocess.run(["sh", "-c", GatewayStale().command(**args)], capture_output=True, text=True, env=env)
        return GatewayStale().process(out.stdout.splitlines())

    assert stale() is False                                  # no marker: booted, or never started by a deploy
    subprocess.run(["sh", "-c", f"{{ {pid_and_files_command(args['unit'], args['files'])}; }} > {marker}"], env=env,
                   check=True)
    assert stale() is False
    unit.write_text("ExecStart=smg --policy random\n")       # a run wrote new files and was cut off
    assert stale() is True
    launcher.write_text("print('other')\n")
    unit.write_text("ExecStart=smg --policy round_robin\n")  # the launcher alone differs
    assert stale() is True
    pid.write_text("5000\n")                                 # restarted since by systemd or by hand
    assert stale() is False
    assert GatewayStale().process(["0 abc", "0 def"]) is False    # not running


def test_a_fact_asked_for_twice_runs_once_and_both_names_get_its_value(tmp_path):
    """A deploy reads its server's unit as `unit` and as `unit:sglang`: one systemctl, two names."""
    from test_release_store import FakeHost

    doc = tmp_path / "owner.json"
    doc.write_text(json.dumps({"pid": 7}))
    h = FakeHost()
    snap = snapshot.read(h, {"a": (JsonFile, {"path": str(doc)}), "b": (JsonFile, {"path": str(doc)}),
                             "other": (JsonFile, {"path": str(tmp_path / "none.json")})})
    assert snap["a"] == snap["b"] == {"pid": 7} and snap["other"] is None
    assert snap["a"] is not snap["b"]                  # each name its own copy
    assert len(h.commands) == 1 and h.commands[0].count(str(doc)) == 1
    assert list(snap.values) == ["a", "b", "other"]
