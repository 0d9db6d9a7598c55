"""The report page from small records: what an operator reads on it (status in words, the
rollback, the profile keys that changed, an unreachable host with the time of its last data,
the tune's candidates) and that every figure on it is the gate report's."""

from __future__ import annotations

import json

from dsv4deploy.cli.report import RECORDS_FILE, cached_host, local_gates, tune_runs, write_site
from dsv4deploy.release.report.model import HostInput, host_view, profile_changes
from dsv4deploy.release.report.page import render_site
from report_checks import mismatches, shown

T0 = "2026-12-05T10:00:00+00:00"


def gate_doc(passed: bool, levels: dict[str, tuple[float, float, float, float]], written="2026-12-05T10:05:00Z"):
    """A gate.json as gate/report.py writes it, cut to what the page reads: per level (tok/s,
    floor, p99 TTFT, p99 TPOT)."""
    return {"schema": "dsv4deploy.gate.report/1", "passed": passed, "written_at": written,
            "summary": f"gate {'passed' if passed else 'failed'}",
            "verdict": {"levels": [
                {"label": label, "concurrency": int(label[2:]), "passed": tput >= floor, "rows": [
                    {"metric": "output throughput", "observed": tput, "threshold": floor},
                    {"metric": "p99 TTFT", "observed": ttft, "threshold": None},
                    {"metric": "p99 TPOT", "observed": tpot, "threshold": None}]}
                for label, (tput, floor, ttft, tpot) in levels.items()]}}


def rec(n, profile, status, kind="deploy", restores=None, reason=None):
    return {"release": n, "kind": kind, "restores": restores, "profile": profile, "status": status,
            "reason": reason, "created": T0, "updated": T0, "sglang_version": "0.5.23", "gate": None}


GATES = {"0001": gate_doc(True, {"C=1": (23.54, 10, 76.45, 41.39), "C=64": (531.66, 300, 1982.63, 160.54)}),
         "0002": gate_doc(False, {"C=1": (22.0, 10, 80.0, 42.0), "C=64": (201.25, 300, 2500.0, 190.0)})}
RECORDS = [rec(1, "nvfp4-ctx8k", "superseded"),
           rec(2, "fp8-ctx1m-baseline", "failed", reason="gate failed: C=64 201.2 tok/s < floor 300"),
           rec(3, "nvfp4-ctx8k", "deployed", kind="rollback", restores=1, reason="release 0002 failed <b>gate</b>")]
PROFILES = {1: {"model": {"quantization": "nvfp4"}, "server": {"context_length": 8192}},
            2: {"model": {"quantization": "fp8"}, "server": {"context_length": 1048576}},
            3: {"model": {"quantization": "nvfp4"}, "server": {"context_length": 8192}}}


def reports_tree(tmp_path, host="twin-1"):
    reports = tmp_path / "reports"
    for label, doc in GATES.items():
        profile = RECORDS[int(label) - 1]["profile"]
        folder = reports / host / f"{label}-{profile}"
        folder.mkdir(parents=True)
        (folder / "gate.json").write_text(json.dumps(doc))
        (folder / "gate.md").write_text("# gate\n")
    return reports


def host_input(reports, host="twin-1", **kw):
    return HostInput(name=host, records=RECORDS, profiles=PROFILES, gates=local_gates(reports, host),
                     read_at="2026-12-05T10:30:00+00:00", **kw)


def test_the_host_page_shows_each_release_in_words_with_the_rollback(tmp_path):
    reports = reports_tree(tmp_path)
    write_site([host_input(reports)], reports, "inventory/sim.py")
    html = (reports / "host-twin-1.html").read_text()
    assert shown(html).releases == {"0001": "superseded", "0002": "failed", "0003": "deployed"}
    assert "failed, rolled back (release 0003 restores 0001)" in html
    assert "rollback to 0001: deployed, serving" in html
    assert "release 0002 failed &lt;b&gt;gate&lt;/b&gt;" in html, "a record's text is escaped, not markup"
    assert 'href="twin-1/0002-fp8-ctx1m-baseline/gate.md"' in html
    index = (reports / "index.html").read_text()
    assert "serving release 0003 (nvfp4-ctx8k)" in index and 'href="host-twin-1.html"' in index


def test_every_figure_on_the_page_is_the_gate_reports_and_a_changed_one_is_caught(tmp_path):
    reports = reports_tree(tmp_path)
    write_site([host_input(reports)], reports, "inventory/sim.py")
    html = (reports / "host-twin-1.html").read_text()
    assert mismatches(html, GATES) == []
    assert shown(html).points[("chart-throughput", "C=64", "0002")] == "201.2"
    assert shown(html).points[("chart-throughput", "C=64 floor", "0001")] == "300.0"
    assert mismatches(html.replace(">531.7<", ">531.8<"), GATES), "a table figure that differs is caught"
    assert mismatches(html.replace('data-value="201.2"', 'data-value="210.2"'), GATES), "so is a chart point"
    assert mismatches(html, {**GATES, "0001": gate_doc(True, {"C=1": (23.54, 10, 76.45, 41.39)})})


def test_profile_diff_names_the_keys_that_changed_from_the_release_before():
    view = host_view(HostInput("h", RECORDS, PROFILES, {}, T0))
    assert view.releases[1].changed == [("model.quantization", '"nvfp4"', '"fp8"'),
                                        ("server.context_length", "8192", "1048576")]
    assert view.releases[0].changed is None      # nothing before the first
    assert profile_changes({"a": 1}, None) is None
    assert profile_changes({"a": {"b": 1}}, {"a": {"c": 1}}) == [("a.b", "1", "-"), ("a.c", "-", "1")]


def test_a_gate_report_older_than_its_record_is_not_linked(tmp_path):
    """A twin made afresh numbers from 0001 again: the old 0001's report is not the new one's."""
    reports = reports_tree(tmp_path)
    late = [{**r, "created": "2026-12-06T10:00:00+00:00"} for r in RECORDS]
    view = host_view(HostInput("twin-1", late, PROFILES, local_gates(reports, "twin-1"), T0))
    assert [r.gate for r in view.releases] == [None, None, None]


def test_an_unreachable_host_is_shown_from_its_last_read(tmp_path):
    reports = reports_tree(tmp_path)
    (reports / "twin-1" / RECORDS_FILE).write_text(json.dumps(
        {"read_at": "2026-12-05T10:30:00+00:00", "records": RECORDS, "profiles": {"1": PROFILES[1]}}))
    gone = cached_host("twin-1", reports, "cannot reach twin-1 over SSH: timed out")
    never = cached_host("twin-2", reports, "cannot reach twin-2 over SSH: refused")
    write_site([gone, never], reports, "inventory/fleet-sim.py")
    index = (reports / "index.html").read_text()
    assert "unreachable; last data read 2026-12-05 10:30:00" in index
    assert "unreachable; no data was ever read" in index and "refused" in index
    assert 'data-release="0003"' in (reports / "host-twin-1.html").read_text()


def test_tune_runs_list_every_candidate_refused_or_measured_and_the_winner(tmp_path):
    reports = tmp_path / "reports"
    (reports / "tune-nvfp4-ctx8k-20261205T100000Z").mkdir(parents=True)
    (reports / "tune-nvfp4-ctx8k-20261205T100000Z" / "tune.json").write_text(json.dumps({
        "profile": "nvfp4-ctx8k", "written_at": "2026-12-05T10:00:00Z", "verdict": "chosen c1: 540.2 tok/s",
        "chosen": "c1", "method": {"concurrency": 64}, "candidates": [
            {"id": "c0", "overrides": {}, "status": "passed", "why": "met every constraint (the reference)",
             "trials": [{"measurement": {"output_throughput": 531.66, "p99_ttft_ms": 1900.0, "p99_tpot_ms": 150.0,
                                         "release": 4}}]},
            {"id": "c1", "overrides": {"server.max_running_requests": 96}, "status": "chosen", "why": "best",
             "trials": [{"measurement": {"output_throughput": 540.24, "p99_ttft_ms": 2000.0, "p99_tpot_ms": 155.0,
                                         "release": 5}}]},
            {"id": "c2", "overrides": {"server.context_length": 1048576}, "status": "refused", "refused": True,
             "reasons": ["server.mem_fraction_static: OOM at graph capture"], "why": "", "trials": []}]}))
    html = render_site([], tune_runs(reports), T0, "inventory/sim.py")["index.html"]
    assert "winner <strong>c1</strong>" in html and "c1 (winner)" in html
    assert "server.mem_fraction_static: OOM at graph capture" in html
    assert '<td class="num" data-metric="throughput">540.2</td>' in html
    assert '<td class="num" data-metric="throughput">-</td>' in html       # the refused one: never measured


def test_the_page_fetches_nothing(tmp_path):
    reports = reports_tree(tmp_path)
    pages = render_site([host_view(host_input(reports))], [], T0, "inventory/sim.py")
    for text in pages.values():
        assert "<script" not in text and " src=" not in text and "@import" not in text and "url(" not in text
        assert "default-src 'none'" in text
        assert [w for w in text.split('"') if w.startswith(("http:", "https:", "//"))] == ["http://www.w3.org/2000/svg"] * \
            text.count("<svg ")


def test_the_watch_results_show_when_the_watch_left_them(tmp_path):
    """The hook (release/report/watch.py): reports/<host>/watch.json, as `dsv4deploy status --json`
    gives one host, shows on the card and the host page; without it the card says so."""
    reports = reports_tree(tmp_path)
    write_site([host_input(reports)], reports, "inventory/sim.py")
    assert "no watch results on this control node" in (reports / "index.html").read_text()
    (reports / "twin-1" / "watch.json").write_text(json.dumps({
        "health": "degraded", "trend": {"sglang": "PPF"}, "drift": ["/etc/systemd/system/sglang.service"],
        "last": {"sglang": {"verdict": "failed", "t": 1796500000, "why": "TPOT 40% over the gate's"}}}))
    from dsv4deploy.cli.report import gather_local
    write_site([gather_local(host_input(reports), reports)], reports, "inventory/sim.py")
    index, page = (reports / "index.html").read_text(), (reports / "host-twin-1.html").read_text()
    assert "degraded; last interval failed at 2026-12-05 19:46:40" in index and "sglang PPF" in index
    assert "/etc/systemd/system/sglang.service" in index
    assert "sglang: TPOT 40% over the gate&#39;s" in page
