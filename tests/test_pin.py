"""`dsv4deploy pin PROFILE` against the local hub: one value written in place (comments and every
other byte kept), idempotent, and a clean refusal (file unchanged) for every bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")

from dsv4deploy.profile.errors import ProfileError  # noqa: E402
from dsv4deploy.cli.pin import PinError, insert_value, pin, replace_value  # noqa: E402
from checkout import load_profile  # noqa: E402
from ct200twin.host.checkpoint import make_checkpoint  # noqa: E402
from ct200twin.host.hub import serve_hub  # noqa: E402
from ct200twin.host.hub_repo import scan_repo  # noqa: E402
from hub_fixtures import no_agent_registry_fetch  # noqa: F401,E402

NVFP4 = "nvidia/DeepSeek-V4-Flash-NVFP4"
FP8 = "deepseek-ai/DeepSeek-V4-Flash"
ZERO = "0" * 40
TOKEN = "hf_pin_token_0123456789"
REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ckpt")
    make_checkpoint(NVFP4, root=root)
    make_checkpoint(FP8, root=root, shards=2)
    return root


def commit(root: Path, repo: str) -> str:
    return scan_repo(repo, root / repo.replace("/", "--")).commit


@pytest.fixture
def hub(checkpoints, monkeypatch):
    with serve_hub(checkpoints) as h:
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        for var in ("DSV4_HF_TOKEN", "DSV4_HF_TOKEN_FILE", "HF_HUB_OFFLINE"):
            monkeypatch.delenv(var, raising=False)
        yield h


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.glob("*.yaml"))}


def only_changed(before: dict, after: dict) -> list[str]:
    return [name for name in before if before[name] != after[name]]


# ------------------------------------------------------------------------------------ writing
def test_own_revision_replaced_on_its_line_and_nothing_else(hub, checkpoints, profile_dir):
    before = snapshot(profile_dir.path)
    result = pin("fp8-ctx1m-baseline")
    sha = commit(checkpoints, FP8)
    after = snapshot(profile_dir.path)
    assert only_changed(before, after) == ["fp8-ctx1m-baseline.yaml"]
    old, new = before["fp8-ctx1m-baseline.yaml"], after["fp8-ctx1m-baseline.yaml"]
    assert new == old.replace(ZERO.encode(), sha.encode(), 1)
    assert result.changed and result.old == ZERO and result.new == sha and result.line == 9
    assert str(result).endswith(f"fp8-ctx1m-baseline.yaml:9: model.revision: {ZERO} -> {sha}")
    assert load_profile("fp8-ctx1m-baseline").model["revision"] == sha


def test_inherited_revision_goes_into_the_named_profile(hub, checkpoints, profile_dir):
    before = snapshot(profile_dir.path)
    result = pin("nvfp4-ctx8k")
    sha = commit(checkpoints, NVFP4)
    after = snapshot(profile_dir.path)
    assert only_changed(before, after) == ["nvfp4-ctx8k.yaml"]  # the base and its other users untouched
    lines = after["nvfp4-ctx8k.yaml"].decode().splitlines(keepends=True)
    assert lines[result.line - 2:result.line] == ["model:\n", f'  revision: "{sha}"\n']
    assert "".join(lines[:result.line - 2] + lines[result.line:]).encode() == before["nvfp4-ctx8k.yaml"]
    assert "nvfp4-tp8-nop2p" in result.notes[0] and "--into-base" in result.notes[0]
    assert load_profile("nvfp4-ctx8k").model["revision"] == sha
    assert load_profile("nvfp4-tp8-nop2p").model["revision"] == ZERO


def test_into_base_replaces_the_base_value(hub, checkpoints, profile_dir):
    before = snapshot(profile_dir.path)
    result = pin("nvfp4-ctx8k", into_base=True)
    after = snapshot(profile_dir.path)
    assert only_changed(before, after) == ["_ct200-base.yaml"]
    assert after["_ct200-base.yaml"] == before["_ct200-base.yaml"].replace(
        ZERO.encode(), commit(checkpoints, NVFP4).encode(), 1)
    assert b"# huggingface.co was unreachable" in after["_ct200-base.yaml"]  # comments kept
    assert result.file.endswith("_ct200-base.yaml") and "nvfp4-tp8-nop2p" in result.notes[0]


def test_pinning_twice_changes_nothing(hub, profile_dir):
    pin("nvfp4-ctx8k")
    path = profile_dir.path / "nvfp4-ctx8k.yaml"
    text, mtime = path.read_bytes(), path.stat().st_mtime_ns
    again = pin("nvfp4-ctx8k")
    assert not again.changed and "already pinned" in str(again)
    assert path.read_bytes() == text and path.stat().st_mtime_ns == mtime


def test_dry_run_writes_nothing(hub, profile_dir):
    before = snapshot(profile_dir.path)
    assert pin("fp8-ctx1m-baseline", dry_run=True).changed
    assert snapshot(profile_dir.path) == before


@pytest.mark.parametrize("line, written", [
    ('  revision: "{z}"   # keep me\n', '  revision: "{s}"   # keep me\n'),
    ("  revision: '{z}'\n", "  revision: '{s}'\n"),
    ("  revision: {z}\n", '  revision: "{s}"\n'),  # plain: quoted, so no commit reads as a number
])
def test_quote_style_and_trailing_comment_kept(line, written):
    sha = "ab" * 20
    text = f"# head\nextends: _ct200-base\nmodel:\n  repo: x/y\n{line.format(z=ZERO)}server: {{}}\n"
    new, at = replace_value(text, "p.yaml", sha)
    assert new == text.replace(line.format(z=ZERO), written.format(s=sha)) and at == 5


def test_crlf_and_flow_mapping_and_insertions():
    sha = "cd" * 20
    crlf = f'extends: b\r\nmodel:\r\n  repo: x/y   # r\r\n  revision: "{ZERO}"\r\n'
    assert replace_value(crlf, "p", sha)[0] == crlf.replace(ZERO, sha)
    flow = f'extends: b\nmodel: {{repo: x/y, revision: "{ZERO}"}}\n'
    assert replace_value(flow, "p", sha)[0] == flow.replace(ZERO, sha)
    # An own model block without a revision: the line goes after repo:, at its indentation.
    text = "extends: b\nmodel:\n    repo: x/y  # c\n    served_model_name: m\nserver: {}\n"
    new, at = insert_value(text, "p", sha)
    assert new == text.replace("# c\n", f'# c\n    revision: "{sha}"\n') and at == 4
    # No model block: a new one before the first section and the comments above it.
    text = "extends: b\ndescription: d\n# about server\nserver:\n  tp_size: 4\n"
    new, at = insert_value(text, "p", sha)
    assert new == f'extends: b\ndescription: d\nmodel:\n  revision: "{sha}"\n# about server\nserver:\n  tp_size: 4\n'
    assert at == 4
    assert insert_value("extends: b", "p", sha)[0] == f'extends: b\nmodel:\n  revision: "{sha}"\n'


# ---------------------------------------------------------------------------------- refusals
def unchanged(profile_dir, before) -> bool:
    return snapshot(profile_dir.path) == before


def test_alias_or_flow_model_refused_unchanged(hub, profile_dir):
    profile_dir.write("aliased", f"""
        extends: _ct200-base
        description: &rev "{ZERO}"
        model:
          revision: *rev
        """)
    before = snapshot(profile_dir.path)
    with pytest.raises(PinError) as err:
        pin("aliased")
    assert err.value.exit_code == 2 and "aliased.yaml" in str(err.value) and unchanged(profile_dir, before)
    profile_dir.write("flowmodel", "extends: _ct200-base\nmodel: {served_model_name: m}\n")
    before = snapshot(profile_dir.path)
    with pytest.raises(PinError) as err:
        pin("flowmodel")
    assert err.value.exit_code == 2 and "by hand" in str(err.value) and unchanged(profile_dir, before)


def test_a_profile_that_would_be_invalid_is_refused_unchanged(hub, profile_dir, monkeypatch):
    profile_dir.write("oom", "extends: nvfp4-ctx8k\nserver:\n  mem_fraction_static: 0.85\n")
    before = snapshot(profile_dir.path)
    with pytest.raises(PinError) as err:
        pin("oom")
    assert err.value.exit_code == 2 and "oom.yaml:3: server.mem_fraction_static" in str(err.value)
    assert "fix it first" in str(err.value) and unchanged(profile_dir, before)
    assert hub.request_log() == [], "an invalid profile is refused before the hub is asked"
    # A hub answering a sha that is not a commit: the validator refuses it, nothing is written.
    monkeypatch.setattr("dsv4deploy.cli.pin.resolve_commit", lambda *a, **k: "main")
    with pytest.raises(PinError) as err:
        pin("fp8-ctx1m-baseline")
    assert err.value.exit_code == 2 and "model.revision" in str(err.value) and unchanged(profile_dir, before)
    assert "is unchanged" in str(err.value)


def test_bad_input_and_failures(hub, checkpoints, profile_dir, monkeypatch, tmp_path):
    before = snapshot(profile_dir.path)
    with pytest.raises(ProfileError):
        pin("no-such-profile")
    with pytest.raises(PinError) as err:
        pin("fp8-ctx1m-baseline", branch="no-such-branch")
    assert err.value.exit_code == 2 and "--branch" in str(err.value)
    with pytest.raises(PinError) as err:
        pin("fp8-ctx1m-baseline", into_base=True)
    assert err.value.exit_code == 2 and "sets model.revision itself" in str(err.value)
    with serve_hub(checkpoints / "empty-root") as empty:  # the repo the profile names is not there
        with pytest.raises(PinError) as err:
            pin("fp8-ctx1m-baseline", endpoint=empty.url)
    assert err.value.exit_code == 2 and f"fp8-ctx1m-baseline.yaml:8: model.repo: no repo {FP8}" in str(err.value)
    with pytest.raises(PinError) as err:
        pin("fp8-ctx1m-baseline", endpoint="http://127.0.0.1:9")  # nothing listens on the discard port
    assert err.value.exit_code == 1 and "cannot reach" in str(err.value)
    monkeypatch.setenv("DSV4_HF_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(PinError) as err:
        pin("fp8-ctx1m-baseline")
    assert err.value.exit_code == 2 and "DSV4_HF_TOKEN_FILE" in str(err.value)
    assert unchanged(profile_dir, before)


def test_token_from_the_deploys_variables(checkpoints, profile_dir, monkeypatch, tmp_path):
    monkeypatch.delenv("DSV4_HF_TOKEN_FILE", raising=False)
    monkeypatch.delenv("DSV4_HF_TOKEN", raising=False)
    with serve_hub(checkpoints, token=TOKEN) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", TOKEN)  # huggingface_hub's own variable: deliberately not used
        with pytest.raises(PinError) as err:
            pin("fp8-ctx1m-baseline")
        assert err.value.exit_code == 2 and "gated" in str(err.value) and "DSV4_HF_TOKEN_FILE" in str(err.value)
        monkeypatch.setenv("DSV4_HF_TOKEN", "hf_not_the_token")
        with pytest.raises(PinError) as err:
            pin("fp8-ctx1m-baseline")
        assert err.value.exit_code == 2 and "refused the HF token from DSV4_HF_TOKEN" in str(err.value)
        token_file = tmp_path / "token"
        token_file.write_text(TOKEN + "\n")
        monkeypatch.setenv("DSV4_HF_TOKEN_FILE", str(token_file))
        assert pin("fp8-ctx1m-baseline").new == commit(checkpoints, FP8)


# -------------------------------------------------------------------------------- the command
def run(*args, env):
    return subprocess.run([sys.executable, "-m", "dsv4deploy", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, cwd=REPO_ROOT, timeout=60)


@pytest.mark.slow
def test_command_prints_file_line_and_exits_cleanly(hub, checkpoints, profile_dir):
    env = {"HF_ENDPOINT": hub.url, "DSV4_PROFILES_DIR": str(profile_dir.path)}
    out = run("pin", "nvfp4-ctx8k", "--into-base", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith(f"_ct200-base.yaml:8: model.revision: {ZERO} -> {commit(checkpoints, NVFP4)}")
    for args, code in ((["pin", "nope"], 2), (["pin", "nvfp4-ctx8k", "--branch", "dev"], 2),
                       (["pin", "nvfp4-ctx8k", "--endpoint", "http://127.0.0.1:9"], 1)):
        bad = run(*args, env=env)
        assert bad.returncode == code and bad.stderr.strip() and "Traceback" not in bad.stderr + bad.stdout, args
