"""weights_check on a local folder: wrong bytes are named as `bad` and `--remove-bad` deletes only
those (a following download fetches them again); a missing file is a problem, not `bad`."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

from dsv4deploy.weights import check as weights_check


def expected_for(folder) -> dict:
    files = {}
    for p in sorted(folder.iterdir()):
        data = p.read_bytes()
        files[p.name] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "blob_id": None}
    return {"commit": "c" * 40, "files": files}


def test_bad_files_are_named_and_removed(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for name in ("a.safetensors", "b.safetensors", "c.safetensors"):
        (folder / name).write_bytes(name.encode() * 1000)
    expected = expected_for(folder)
    (tmp_path / "expected.json").write_text(json.dumps(expected))
    (folder / "a.safetensors").write_bytes(b"x" + (folder / "a.safetensors").read_bytes()[1:])   # same size
    (folder / "b.safetensors").write_bytes(b"short")
    (folder / "c.safetensors").unlink()
    result = weights_check.check(folder, expected)
    assert not result["complete"] and result["bad"] == ["a.safetensors", "b.safetensors"]
    assert any("c.safetensors: missing" in p for p in result["problems"])
    proc = subprocess.run([sys.executable, weights_check.__file__, str(folder), str(tmp_path / "expected.json"),
                           "--remove-bad"], capture_output=True, text=True)
    assert proc.returncode == 1 and json.loads(proc.stdout)["bad"] == ["a.safetensors", "b.safetensors"]
    assert sorted(p.name for p in folder.iterdir()) == []
