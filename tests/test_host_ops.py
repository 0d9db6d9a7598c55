"""host/ops.py: arguments and the host's state in, commands out (pyinfra's own style). Where a
command's effect matters, it runs here with `sh -c` against a temporary tree."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile

import pytest
from pyinfra.api import FileUploadCommand, FunctionCommand

from dsv4deploy.host import ops


class _Host:
    def __init__(self):
        self.noops: list[str] = []

    def noop(self, message):
        self.noops.append(message)


@pytest.fixture
def fake(monkeypatch):
    h = _Host()
    monkeypatch.setattr(ops, "host", h)
    return h


def _cmds(op, **kw) -> list:
    return [c if isinstance(c, (FileUploadCommand, FunctionCommand)) else c.get_raw_value() for c in op._inner(**kw)]


def _run(commands: list, uploads: dict) -> None:
    """Run yielded commands here: uploads write their bytes, strings run with sh -c."""
    for c in commands:
        if isinstance(c, FileUploadCommand):
            with open(c.dest, "wb") as f:
                f.write(c.src.getvalue())
        else:
            assert subprocess.run(["sh", "-c", c]).returncode == 0, c


def _state(content: bytes, mode="644", user="root", group="root"):
    return {"type": "file", "mode": mode, "user": user, "group": group, "sha256": hashlib.sha256(content).hexdigest()}


def test_file_the_same_is_a_noop(fake):
    assert _cmds(ops.file, dest="/etc/x", content=b"a\n", state=_state(b"a\n")) == []
    assert fake.noops


def test_file_with_another_mode_only_gets_chmod_and_chown(fake):
    cmds = _cmds(ops.file, dest="/etc/x", content=b"a\n", state=_state(b"a\n", mode="600"))
    assert cmds == ["chown root:root /etc/x && chmod 644 /etc/x"]


def test_a_small_text_file_is_written_in_one_command(fake, tmp_path):
    dest = tmp_path / "d" / "unit.service"
    text = "[Service]\nExecStart=/x 'a b' \"$c\" `d` \\\n-e\n"
    cmds = _cmds(ops.file, dest=str(dest), content=text.encode(), state=None, mode="640")
    assert len(cmds) == 1 and not any(isinstance(c, FileUploadCommand) for c in cmds)
    _run(cmds, {})
    assert dest.read_text() == text and oct(dest.stat().st_mode & 0o777) == "0o640"
    assert list(dest.parent.iterdir()) == [dest]


def test_a_unit_and_its_files_that_differ_are_written_in_one_command(fake, tmp_path):
    same, changed, new, big = (tmp_path / n for n in ("nccl.env", "manifest.json", "d/sglang.service", "big"))
    same.write_text("NCCL_X=1\n")
    changed.write_text("old\n")
    items = [(str(same), b"NCCL_X=1\n", _state(b"NCCL_X=1\n")), (str(changed), b"{'a': \"b\"}\n", _state(b"old\n")),
             (str(new), b"[Service]\nExecStart=/x 'a b' $c\n", None), (str(big), b"x" * (ops.INLINE_MAX + 1), None)]
    cmds = _cmds(ops.files, items=items)
    assert isinstance(cmds[0], str) and str(same) not in cmds[0]          # one command: the two small ones
    assert any(isinstance(c, FileUploadCommand) for c in cmds[1:])        # the big one is uploaded
    _run(cmds, {})
    assert [f.read_bytes() for f in (same, changed, new, big)] == [content for _, content, _ in items]
    assert _cmds(ops.files, items=[(str(same), b"NCCL_X=1\n", _state(b"NCCL_X=1\n"))]) == [] and fake.noops


def test_a_secret_never_goes_on_a_command_line(fake, tmp_path):
    cmds = _cmds(ops.file, dest=str(tmp_path / "token"), content=b"hf_SECRET", state=None, mode="600", secret=True)
    assert not any("hf_SECRET" in c for c in cmds if isinstance(c, str))


def test_file_that_differs_is_uploaded_through_a_private_temp_file_and_moved(fake, tmp_path):
    dest = tmp_path / "d" / "unit.service"
    cmds = _cmds(ops.file, dest=str(dest), content=b"new\n", state=None, mode="600", secret=True)
    assert "umask 077 && : >" in cmds[0] and isinstance(cmds[1], FileUploadCommand)
    assert cmds[1].dest.endswith(".dsv4deploy-tmp")
    _run(cmds, {})
    assert dest.read_bytes() == b"new\n" and oct(dest.stat().st_mode & 0o777) == "0o600"
    assert list(dest.parent.iterdir()) == [dest]
    # the folder it made is reachable by the service user (a venv made for its lock file first)
    assert oct(dest.parent.stat().st_mode & 0o777) == "0o755"


def test_directory(fake):
    same = {"type": "dir", "mode": "750", "user": "svc", "group": "svc", "sha256": None}
    assert _cmds(ops.directory, path="/var/lib/s", state=same, user="svc", group="svc", mode="750") == []
    cmds = _cmds(ops.directory, path="/var/lib/s", state=None, user="svc", group="svc", mode="750")
    assert cmds == ["mkdir -p /var/lib/s && chown svc:svc /var/lib/s && chmod 750 /var/lib/s"]


def test_directories_that_differ_are_made_or_fixed_in_one_command_parents_first(fake):
    ok = {"type": "dir", "mode": "755", "user": "root", "group": "root", "sha256": None}
    wrong_mode = dict(ok, mode="777")
    items = [("/opt/d", "root", "root", "755", ok), ("/opt/d/a", "root", "root", "755", None),
             ("/opt/d/b", "svc", "svc", "750", wrong_mode)]
    assert _cmds(ops.directories, items=items) == [
        "mkdir -p /opt/d/a && chown root:root /opt/d/a && chmod 755 /opt/d/a && "
        "mkdir -p /opt/d/b && chown svc:svc /opt/d/b && chmod 750 /opt/d/b"]
    assert _cmds(ops.directories, items=[items[0]]) == []


def test_packages_only_the_missing_ones(fake):
    assert _cmds(ops.packages, names=["curl", "patch"], installed={"curl": True, "patch": True}) == []
    cmds = _cmds(ops.packages, names=["curl", "patch"], installed={"curl": True})
    assert len(cmds) == 1 and cmds[0].endswith("--no-install-recommends patch") and "apt-get update" in cmds[0]


def test_system_account(fake):
    """Made with the deploy's mark; an earlier release's account without it gets it."""
    home = "/var/lib/dsv4deploy/sglang"
    mark = "dsv4deploy service account"
    accounts = {"users": {"sglang": {"gid": 999, "home": home, "shell": "/usr/sbin/nologin", "comment": mark}},
                "groups": {"sglang": 999}}
    assert _cmds(ops.system_account, user="sglang", home=home, accounts=accounts, comment=mark) == []
    cmds = _cmds(ops.system_account, user="sglang", home=home, accounts={}, comment=mark)
    assert [c.split()[1] for c in cmds] == ["group", "passwd"] and "groupadd --system sglang" in cmds[0]
    assert "useradd --system --gid sglang --comment 'dsv4deploy service account' " in cmds[1]
    moved = _cmds(ops.system_account, user="sglang", home="/srv/x", accounts=accounts, comment=mark)
    assert moved == ["usermod --comment 'dsv4deploy service account' --home /srv/x --shell /usr/sbin/nologin sglang"]
    unmarked = {**accounts, "users": {"sglang": {**accounts["users"]["sglang"], "comment": ""}}}
    assert _cmds(ops.system_account, user="sglang", home=home, accounts=unmarked, comment=mark) == [
        f"usermod --comment 'dsv4deploy service account' --home {home} --shell /usr/sbin/nologin sglang"]


def _tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_bundle_unpacks_afresh_and_then_is_a_noop(fake, tmp_path):
    dest = tmp_path / "stand-in"
    (dest / "dsv4deploy").mkdir(parents=True)
    (dest / "dsv4deploy" / "gone.py").write_text("old")
    archive = _tar({"dsv4deploy/a.py": b"A"})
    cmds = _cmds(ops.bundle, archive=archive, dest=str(dest), marker_state=None)
    assert sum(isinstance(c, FileUploadCommand) for c in cmds) == 1       # one archive, not file by file
    _run(cmds, {})
    assert (dest / "dsv4deploy" / "a.py").read_text() == "A"
    assert not (dest / "dsv4deploy" / "gone.py").exists()
    marker = (dest / ".bundle-sha256").read_bytes()
    assert marker.decode().strip() == hashlib.sha256(archive).hexdigest()
    assert _cmds(ops.bundle, archive=archive, dest=str(dest), marker_state=_state(marker)) == []
    assert _cmds(ops.bundle, archive=_tar({"dsv4deploy/a.py": b"B"}), dest=str(dest), marker_state=_state(marker))


def test_venv_is_left_alone_when_its_marker_says_the_same_installs(fake, tmp_path):
    marker = {"installs": ["/v/bin/pip install -q sglang==0.5.23"], "lock_sha256": None}
    assert _cmds(ops.venv, path="/v", marker=marker, marker_file="/v/m.json", marker_state=marker, exists=True) == []
    cmds = _cmds(ops.venv, path="/v", marker=marker, marker_file="/v/m.json",
                 marker_state={**marker, "lock_sha256": "x"}, exists=True)
    assert cmds[0] == "rm -f /v/m.json" and cmds[1] == marker["installs"][0]
    assert json.loads(cmds[-1].split("'")[3]) == marker            # the marker is written last
    fresh = _cmds(ops.venv, path="/v", marker=marker, marker_file="/v/m.json", marker_state=None, exists=False)
    assert fresh[0] == "/opt/dsv4deploy/tools/uv-0.13.9/venv/bin/uv venv -q --allow-existing --no-python-downloads --python python3 /v"


def test_uv_is_installed_once_by_pip_with_its_hashes_and_kept_while_the_pins_hold(fake):
    from dsv4deploy.host import installer
    req, prog = installer.requirements(), installer.program()
    assert b"--hash=sha256:" in req and prog.startswith(b"# dsv4deploy host program")
    fresh = _cmds(ops.uv_tool, requirements=req, program=prog, requirements_state=None, program_state=None,
                  installed_state=None)
    assert len(fresh) == 3 and installer.REQUIREMENTS in fresh[0] and installer.PROGRAM in fresh[1]
    assert "--no-deps --require-hashes -r /opt/dsv4deploy/tools/uv-0.13.9/uv.requirements" in fresh[2]
    assert fresh[2].endswith(f"cp {installer.REQUIREMENTS} {installer.INSTALLED}")      # the mark comes last
    # root's pythons start isolated: the login's directory and PYTHONPATH reach neither venv nor pip
    assert "python3 -I -m venv /opt/dsv4deploy/tools/uv-0.13.9/venv && " in fresh[2]
    assert "/opt/dsv4deploy/tools/uv-0.13.9/venv/bin/python -I -m pip install " in fresh[2]
    assert installer.install_command("/v", ["x"]).split(" install ")[0].endswith(
        "/uv-0.13.9/venv/bin/python -I /opt/dsv4deploy/tools/uv-0.13.9/uvpip.py")
    same = dict(requirements_state=_state(req), program_state=_state(prog), installed_state=_state(req))
    assert _cmds(ops.uv_tool, requirements=req, program=prog, **same) == []
    newer = _cmds(ops.uv_tool, requirements=req, program=prog + b"\n", **same)      # uvpip.py only: no reinstall
    bootstrap = installer.bootstrap_commands()[0]
    assert len(newer) == 1 and installer.PROGRAM in newer[0] and bootstrap not in newer
    repin = _cmds(ops.uv_tool, requirements=req + b"# x\n", program=prog, **same)
    assert bootstrap in repin


def test_unit_running_and_restart(fake):
    assert _cmds(ops.unit_running, unit="s.service", info={"ActiveState": "active", "UnitFileState": "enabled"}) == []
    assert _cmds(ops.unit_running, unit="s.service", info={"ActiveState": "failed", "UnitFileState": "enabled"}) == [
        "systemctl reset-failed s.service || true", "systemctl enable --now s.service"]
    assert ops.restart_command("s.service") == (
        "systemctl daemon-reload && { systemctl reset-failed s.service || true; } && systemctl restart s.service")
    assert ops.restart_command("s.service", first="systemctl stop g.service && ").startswith(
        "systemctl stop g.service && systemctl daemon-reload && ")


def test_the_switch_is_one_command_the_record_first_then_the_files_then_the_restart(fake, tmp_path):
    """A release's pending record, the unit's files that differ and the restart ride in one
    command, each only if the one before succeeded; DONE follows it (the run learns the record)."""
    log, unit, same = tmp_path / "log", tmp_path / "unit", tmp_path / "same"
    same.write_text("same\n")
    items = [(str(same), b"same\n", _state(b"same\n")), (str(unit), b"[Service]\n", None)]
    record, restart = f"echo record >> {log}", f"test -s {unit} && echo restart >> {log}"
    cmds = _cmds(ops.files, items=items, before=record, after=restart, done=print)
    assert len(cmds) == 2 and isinstance(cmds[0], str) and isinstance(cmds[1], FunctionCommand)
    assert cmds[0].index(record) < cmds[0].index(str(unit)) < cmds[0].index(restart) and str(same) not in cmds[0]
    _run(cmds[:1], {})
    assert log.read_text() == "record\nrestart\n" and unit.read_bytes() == b"[Service]\n"
    # the record cannot be written: no file changes, no restart
    unit.unlink()
    log.unlink()
    failed = _cmds(ops.files, items=items, before=f"false && {record}", after=restart)
    assert subprocess.run(["sh", "-c", failed[0]]).returncode != 0
    assert not unit.exists() and not log.exists()
    # nothing differs, no record, no reason: no command at all
    assert _cmds(ops.files, items=items[:1], before="", after="") == []
    # only the restart (a new venv: the files are the same)
    assert _cmds(ops.files, items=items[:1], before=record, after=restart) == [f"{{ {record}; }} && {{ {restart}; }}"]


def test_a_switch_longer_than_one_shell_argument_is_split_into_commands_in_order(fake, tmp_path, monkeypatch):
    """sshd hands the command to the shell as one argument (Linux: at most 128 KiB): past
    COMMAND_MAX the parts go in as few commands as fit, in order."""
    monkeypatch.setattr(ops, "COMMAND_MAX", 900)
    log = tmp_path / "log"
    items = [(str(tmp_path / f"f{i}"), b"x" * 100 + b"\n", None) for i in range(3)]
    cmds = _cmds(ops.files, items=items, before=f"echo record >> {log}", after=f"echo restart >> {log}")
    assert len(cmds) > 1 and all(len(c) <= 900 for c in cmds)
    assert "echo record" in cmds[0] and cmds[-1].endswith(f"echo restart >> {log}; }}")
    _run(cmds, {})
    assert log.read_text() == "record\nrestart\n" and all((tmp_path / f"f{i}").stat().st_size == 101 for i in range(3))


def test_a_file_too_large_for_the_switch_command_is_uploaded_before_the_restart(fake, tmp_path):
    big, log = tmp_path / "big", tmp_path / "log"
    cmds = _cmds(ops.files, items=[(str(big), b"x" * (ops.INLINE_MAX + 1), None)], before=f"echo record >> {log}",
                 after=f"test -s {big} && echo restart >> {log}")
    assert "echo record" in cmds[0] and "restart" not in cmds[0] and cmds[-1].endswith(f"echo restart >> {log}")
    _run(cmds, {})
    assert log.read_text() == "record\nrestart\n" and big.stat().st_size == ops.INLINE_MAX + 1


def test_api_key_only_prints_yes_no_and_is_made_once(fake):
    assert _cmds(ops.api_key, key_file="/k", config_file="/c", state={"key": True, "config": True},
                 legacy_env="/e") == []
    only_config = _cmds(ops.api_key, key_file="/k", config_file="/c", state={"key": True, "config": False},
                        legacy_env="/e")
    assert len(only_config) == 1 and only_config[0].startswith("umask 077;")


def _fact(tmp_path, **kw) -> dict:
    """ApiKeyState as the host reads it, its command run here with sh -c."""
    from dsv4deploy.host.facts import ApiKeyState

    out = subprocess.run(["sh", "-c", ApiKeyState().command(**kw)], capture_output=True, text=True).stdout
    return ApiKeyState().process(out.splitlines())


def test_three_keys_are_three_files_and_rotating_one_keeps_the_others(fake, tmp_path):
    """The inference key, SGLang's admin key and the gateway's control-plane key are generated
    apart; SGLang's config holds the first two; removing one key file and deploying again makes a
    new key for it alone (and the config follows when it holds that key)."""
    k, c, a, g = (str(tmp_path / n) for n in ("api-key", "sglang-config.yaml", "admin-key", "control-key"))
    query = dict(key_file=k, config_file=c, admin_file=a, others=[a, g])

    def deploy():
        state = _fact(tmp_path, **query)
        present = set(state["present"])
        _run(_cmds(ops.generated_key, key_file=a, present=a in present), {})
        _run(_cmds(ops.api_key, key_file=k, config_file=c, state=state, legacy_env=str(tmp_path / "e"),
                   admin_file=a), {})
        _run(_cmds(ops.generated_key, key_file=g, present=g in present), {})
        return {n: open(n).read() for n in (k, a, g)}

    first = deploy()
    assert len({v.strip() for v in first.values()}) == 3 and all(len(v.strip()) == 48 for v in first.values())
    assert all(oct((tmp_path / n).stat().st_mode)[-3:] == "600" for n in ("api-key", "admin-key", "control-key",
                                                                          "sglang-config.yaml"))
    import yaml
    assert yaml.safe_load(open(c)) == {"api-key": first[k].strip(), "admin-api-key": first[a].strip()}
    assert _fact(tmp_path, **query) == {"key": True, "config": True, "present": sorted([a, g])}
    assert deploy() == first                                   # nothing to do the second time

    for rotated in (a, g):
        (tmp_path / rotated).unlink()
        after = deploy()
        assert after[rotated] != first[rotated]
        assert {n: v for n, v in after.items() if n != rotated} == {n: v for n, v in first.items() if n != rotated}
        first = after
    assert yaml.safe_load(open(c)) == {"api-key": first[k].strip(), "admin-api-key": first[a].strip()}
