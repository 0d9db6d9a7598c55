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


def test_carried_reports_stay_inside_one_command_line_and_the_rest_are_kept_at_once(tmp_path, monkeypatch):
    """Reports carried by the release record's command: as many as fit one argv word; any more
    are kept now, on their own, so the carrying command never grows past what Linux takes."""
    h = UploadingHost()
    paths = _reports(tmp_path)
    one = len(gate.reports_command(str(tmp_path / "a"), paths))
    monkeypatch.setattr(gate, "INLINE_REPORTS_MAX", one)
    command = gate.carry_reports(h, [(str(tmp_path / "host" / "a"), paths), (str(tmp_path / "host" / "b"), paths)])
    assert command.count("base64 -d") == 1 and str(tmp_path / "host" / "a") in command
    assert len(h.commands) == 1 and str(tmp_path / "host" / "b") in h.commands[0]   # the second: kept now
    for p in paths:
        assert (tmp_path / "host" / "b" / p.name).read_bytes() == p.read_bytes()


def test_the_previous_report_is_read_from_that_release_and_part(tmp_path):
    from types import SimpleNamespace
    h = FakeHost()
    layout = SimpleNamespace(releases_dir=str(tmp_path / "releases"))
    target, replica_1 = SimpleNamespace(layout=layout, index=None), SimpleNamespace(layout=layout, index=1)
    for gate_dir, doc in (("gate", '{"passed": true}'), ("gate-replica-1", '{"passed": false}')):
        (tmp_path / "releases" / "0007" / gate_dir).mkdir(parents=True)
        (tmp_path / "releases" / "0007" / gate_dir / "gate.json").write_text(doc)
    assert gate.previous_report(h, target, 7) == {"passed": True}
    assert gate.previous_report(h, replica_1, 7) == {"passed": False}      # a replica's own
    assert gate.previous_report(h, target, 8) is None                     # it kept none
    h.commands.clear()
    assert gate.previous_report(h, target, None) is None and h.commands == []   # nothing to compare with


@pytest.mark.slow
def test_the_figure_made_while_the_server_starts_is_used_once(monkeypatch):
    import matplotlib.pyplot as plt

    monkeypatch.setattr(gate, "_warming", [])
    monkeypatch.setattr(gate, "_spare", [])
    assert gate.spare_figure() is None                  # nothing warmed: the report makes its own
    gate.warm_plotting()
    gate.warm_plotting()                                # once per run
    assert len(gate._warming) == 1
    gate._warming[0].join(60)
    fig, axes = gate.spare_figure()
    assert len(axes) == 3 and gate.spare_figure() is None
    plt.close(fig)
