"""host/gate.py: the gate's reports kept next to the release on the host, against a fake host
whose commands run here with `sh -c` (tests/test_release_store.py's FakeHost)."""

from __future__ import annotations

import shutil

import pytest

from dsv4deploy.gate.report import write_report
from dsv4deploy.host import gate
from test_gate_report import PREV
from test_release_store import FakeHost

pytestmark = pytest.mark.slow          # draws the plot (matplotlib)


def _reports(tmp_path):
    files = write_report(PREV, tmp_path / "local", title="t")
    return [files.json, files.markdown, files.png]


class UploadingHost(FakeHost):
    def put_file(self, src, dest, **kwargs):
        self.commands.append(f"put {dest}")
        with open(dest, "wb") as f:
            shutil.copyfileobj(src, f)
        return True


def test_reports_travel_inside_one_command_and_unpack_as_written(tmp_path):
    h = UploadingHost()
    paths = _reports(tmp_path)
    assert paths[2].stat().st_size < 40_000                   # a palette PNG: small enough to travel inline
    gate.keep_reports(h, str(tmp_path / "host" / "gate"), paths)
    assert len(h.commands) == 1 and not h.commands[0].startswith("put")
    for p in paths:
        assert (tmp_path / "host" / "gate" / p.name).read_bytes() == p.read_bytes()


def test_reports_too_big_for_a_command_line_are_uploaded(tmp_path, monkeypatch):
    monkeypatch.setattr(gate, "INLINE_REPORTS_MAX", 100)
    h = UploadingHost()
    paths = _reports(tmp_path)
    (tmp_path / "host").mkdir()                                 # the release's folder
    gate.keep_reports(h, str(tmp_path / "host" / "gate"), paths)
    assert h.commands[0].startswith("put ") and len(h.commands) == 2
    for p in paths:
        assert (tmp_path / "host" / "gate" / p.name).read_bytes() == p.read_bytes()
    assert sorted(x.name for x in (tmp_path / "host").iterdir()) == ["gate"]     # the archive is gone
