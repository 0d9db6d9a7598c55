"""dsv4deploy.sglang.patching: the commands the venv step sends to apply a patch, run here with `sh -c`
(as pyinfra runs them) on small trees: all or nothing, idempotent, quoted."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from dsv4deploy.sglang import patching

A = "line 1\nline 2\nline 3\nline 4\nline 5\n"
B = "alpha\nbeta\ngamma\ndelta\nepsilon\n"

PATCH = """\
diff --git a/python/pkg/a.py b/python/pkg/a.py
--- a/python/pkg/a.py
+++ b/python/pkg/a.py
@@ -1,5 +1,5 @@
 line 1
 line 2
-line 3
+line three
 line 4
 line 5
diff --git a/python/pkg/b.py b/python/pkg/b.py
--- a/python/pkg/b.py
+++ b/python/pkg/b.py
@@ -1,5 +1,5 @@
 alpha
 beta
-gamma
+GAMMA
 delta
 epsilon
"""


def _sh(cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def site(tmp_path):
    root = tmp_path / "site packages"          # a space: every path is quoted
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text(A)
    (root / "pkg" / "b.py").write_text(B)
    return root


def _patch(tmp_path, text=PATCH) -> tuple[Path, str]:
    path = tmp_path / "my patch.patch"
    path.write_text(text)
    return path, hashlib.sha256(text.encode()).hexdigest()


def _state(site, patch) -> bool:
    """The check the venv step's fact (PatchesApplied) runs for each patch."""
    return patching.parse_state(_sh(patching.state_command(str(site), str(patch), 2)).stdout.splitlines())


def test_apply_once_then_applied(site, tmp_path):
    patch, sha = _patch(tmp_path)
    assert not _state(site, patch)
    run = _sh(patching.apply_command(str(site), str(patch), 2, sha256=sha))
    assert run.returncode == 0, run.stderr
    assert (site / "pkg" / "a.py").read_text() == A.replace("line 3", "line three")
    assert (site / "pkg" / "b.py").read_text() == B.replace("gamma", "GAMMA")
    assert _state(site, patch)
    after = _tree(site)
    again = _sh(patching.apply_command(str(site), str(patch), 2, sha256=sha))
    assert again.returncode == 1 and "does not apply" in again.stderr
    assert _tree(site) == after and sorted(os.listdir(site / "pkg")) == ["a.py", "b.py"]


def test_a_failing_second_file_changes_nothing(site, tmp_path):
    patch, sha = _patch(tmp_path, PATCH.replace("-gamma", "-GAMMA?"))
    before = _tree(site)
    run = _sh(patching.apply_command(str(site), str(patch), 2, sha256=sha))
    assert run.returncode == 1
    assert "pkg/b.py" in run.stderr and "FAILED" in run.stderr and "nothing was changed" in run.stderr
    assert _tree(site) == before                 # a.py untouched although its hunk applies
    assert not _state(site, patch)


def test_wrong_sha256_changes_nothing(site, tmp_path):
    patch, _ = _patch(tmp_path)
    before = _tree(site)
    run = _sh(patching.apply_command(str(site), str(patch), 2, sha256="f" * 64, label="p1"))
    assert run.returncode == 1 and run.stderr.startswith("p1: sha256 is not " + "f" * 64)
    assert _tree(site) == before


def test_missing_patch_file_is_missing_not_applied(site, tmp_path):
    assert not _state(site, tmp_path / "absent.patch")


def test_no_fuzz_and_no_leftovers_in_every_step():
    for cmd in (patching.forward_dry_run("p", 2), patching.reverse_dry_run("p", 2), patching.apply("p", 2)):
        assert " -F0 " in cmd and cmd.startswith("patch -p2 ")
    assert "--no-backup-if-mismatch -r -" in patching.apply("p", 2)
    assert "--dry-run" not in patching.apply("p", 2)


class _Host:
    def __init__(self):
        self.noops = []

    def noop(self, message):
        self.noops.append(message)


def test_the_operation_yields_the_apply_command_then_nothing(site, tmp_path, monkeypatch):
    """patch_applied (pyinfra operation body, host stand-in): the command, then a no-op once the
    host's state (the fact's check, run here) says it is in."""
    from dsv4deploy.host import ops
    patch, sha = _patch(tmp_path)
    host = _Host()
    monkeypatch.setattr(ops, "host", host)
    kw = dict(directory=str(site), patch_file=str(patch), strip=2, sha256=sha)
    first = [c.get_raw_value() for c in ops.patch_applied._inner(applied=_state(site, patch), **kw)]
    assert first == [patching.apply_command(str(site), str(patch), 2, sha256=sha)]
    assert _sh(first[0]).returncode == 0
    assert list(ops.patch_applied._inner(applied=_state(site, patch), **kw)) == [] and host.noops
