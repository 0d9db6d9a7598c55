"""The report page from small records: what an operator reads on it (status in words, the
rollback, the profile keys that changed, an unreachable host with the time of its last data,
the tune's candidates) and that every figure on it is the gate report's."""

from __future__ import annotations

import json
import re

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


# `dsv4deploy report`'s one command for the watch, as a twin answered it (release/report/watch.py):
# `dsv4deploy status`'s parts, then the journal's lines of dsv4-watch and dsv4-watch-act
STATUS_PART = ('@@dsv4-status@@\n{"release": 1, "profile": "nvfp4-ctx8k", "status": "deployed", "updated": "%s"}\n'
               '@@dsv4-record@@\n@@dsv4-status@@\n{"health": "degraded", "t": 1796516500, "targets": {"server": {'
               '"history": [{"verdict": "passed"}, {"verdict": "failed"}]}}}\n@@dsv4-status@@\n'
               '{"settings": {"interval_s": 60}}\n@@dsv4-status@@\nId=sglang.service\nActiveState=active\n\n'
               'Id=dsv4-watch.timer\nActiveState=active\n@@dsv4-status@@\n@@dsv4-status@@\n' % T0)
JOURNAL = ["1796516264.195151 rp-1 python3[3979]: watch server: passed; probe TTFT 56.5 ms TPOT 41.2 ms",
           "1796516325.281734 rp-1 python3[4000]: watch server: passed; probe TTFT 61.8 ms TPOT 41.1 ms",
           "1796516385.5 rp-1 python3[4010]: watch server: inconclusive; a deploy, rollback or tune holds the deploy lock",
           "1796516445.25 rp-1 python3[4020]: watch server: failed (down); unit not active [1/3 failed]",
           "1796516447.75 rp-1 python3[4021]: watch act: watch restart server: done (down with healthy GPUs: unit not active)"]


def answer(lines: list[str]) -> str:
    return STATUS_PART + "@@dsv4-report-journal@@\n" + "".join(line + "\n" for line in lines)


def test_the_watch_results_over_time_are_kept_from_read_to_read_and_shown_as_read(tmp_path):
    """Each read adds the journal's new intervals to reports/<host>/watch.json (a line read twice
    counts once); the card says the watch's verdict and status, the host page charts and lists
    every interval with the figures of its journal line, and the actions."""
    from dsv4deploy.cli.report import gather_local
    from dsv4deploy.release.report import watch
    assert watch.answered(answer([])) and not watch.answered(STATUS_PART)     # cut off: the kept file stays
    first = watch.merged(None, answer(JOURNAL[:2]), "twin-1", "2026-12-06T00:19:00+00:00")
    assert watch.last_t(first) == 1796516325.281734 and "--since @1796516325" in watch.command(watch.last_t(first))
    kept = watch.merged(first, answer(JOURNAL[1:]), "twin-1", "2026-12-06T00:21:00+00:00")
    assert [(r["result"], r["cause"], r["tpot_ms"]) for r in kept["results"]] == [
        ("passed", None, 41.2), ("passed", None, 41.1), ("inconclusive", None, None), ("failed", "down", None)]
    assert kept["status"]["health"] == "degraded" and kept["status"]["trend"] == {"server": "PF"}
    reports = reports_tree(tmp_path)
    (reports / "twin-1" / "watch.json").write_text(json.dumps(kept))
    write_site([gather_local(host_input(reports), reports)], reports, "inventory/sim.py")
    index, page = (reports / "index.html").read_text(), (reports / "host-twin-1.html").read_text()
    assert ("the watch says degraded; last interval failed at 2026-12-06 00:20:45 UTC (server) (trend, oldest first: "
            "server PF)") in index
    assert "server PF) (read 2026-12-06 00:21:00 UTC)" in index
    assert '<span class="status status-degraded">degraded</span>: watch: degraded' in index
    assert "4 intervals read since 2026-12-06 00:17:44 UTC (one every 60 s): 2 passed, 1 failed, 1 inconclusive" in page
    points = re.findall(r'data-at="([^"]+)" data-result="(\w+)" data-value="([^"]+)"', page)
    assert points == [("2026-12-06T00:17:44+00:00", "passed", "41.2"), ("2026-12-06T00:18:45+00:00", "passed", "41.1"),
                      ("2026-12-06T00:19:45+00:00", "inconclusive", "-"), ("2026-12-06T00:20:45+00:00", "failed", "-")]
    assert "failed (down), 1/3 in a row" in page and "unit not active" in page
    assert "acted: watch restart server: done (down with healthy GPUs: unit not active)" in page


def test_a_host_never_read_says_so_and_an_unreachable_one_shows_its_last_watch_read(tmp_path):
    from dsv4deploy.cli.report import gather_local
    from dsv4deploy.release.report import watch
    reports = reports_tree(tmp_path)
    write_site([gather_local(host_input(reports), reports)], reports, "inventory/sim.py")
    assert "never read from this host" in (reports / "index.html").read_text()
    (reports / "twin-1" / "watch.json").write_text(json.dumps(
        watch.merged(None, answer(JOURNAL[:2]), "twin-1", "2026-12-06T00:19:00+00:00")))
    (reports / "twin-1" / RECORDS_FILE).write_text(json.dumps({"read_at": "2026-12-06T00:19:00+00:00",
                                                               "records": RECORDS, "profiles": {}}))
    gone = gather_local(cached_host("twin-1", reports, "cannot reach twin-1 over SSH: timed out"), reports)
    write_site([gone], reports, "inventory/sim.py")
    page = (reports / "host-twin-1.html").read_text()
    assert "As read from the host 2026-12-06 00:19:00 UTC (the last read: the host cannot be reached now)" in page
    assert page.count('data-result="passed"') == 2


def replica_gate(passed: bool, tput: float, completed: int | None = None) -> dict:
    """A replica's own gate.json at C=16; COMPLETED: it passed early after that many of 48."""
    doc = gate_doc(passed, {"C=16": (tput, 100, 400.0, 50.0)})
    doc["result"] = {"levels": [{"concurrency": 16, "completed": completed or 48, "num_prompts": 48,
                                 "early_stop": {"rule": "pass", "at_s": 9.5} if completed else None}]}
    return doc


def test_each_replicas_own_gate_is_charted_apart_and_an_early_pass_says_k_of_n(tmp_path):
    """A replica set's release whose replicas were each gated alone (reports/<host>/NNNN-<profile>-
    replica-N): every replica's figures, its own charts, and 'passed early (k of n)'."""
    reports = tmp_path / "reports"
    docs = {"0001": gate_doc(True, {"C=16": (300.0, 200, 500.0, 45.0)}),
            "0002/replica-0": replica_gate(True, 160.5, completed=16), "0002/replica-1": replica_gate(True, 158.25),
            "0003/replica-0": replica_gate(False, 90.0)}
    recs = [rec(1, "one", "superseded"), rec(2, "rset", "superseded"), rec(3, "rset", "failed")]
    for key, doc in docs.items():
        release, _, part = key.partition("/")
        folder = reports / "h" / (f"{release}-{recs[int(release) - 1]['profile']}" + (f"-{part}" if part else ""))
        folder.mkdir(parents=True)
        (folder / "gate.json").write_text(json.dumps(doc))
        (folder / "gate.md").write_text("# gate\n")
    write_site([HostInput("h", recs, {}, local_gates(reports, "h"), T0)], reports, "inventory/sim.py")
    html = (reports / "host-h.html").read_text()
    assert mismatches(html, docs) == []
    figures = shown(html)
    assert figures.points[("chart-throughput", "C=16", "0002/replica-1")] == "158.2"
    assert figures.points[("chart-throughput", "C=16", "0003/replica-0")] == "90.0"
    assert ("chart-throughput", "C=16", "0002") not in figures.points     # the replicas are not the server
    assert figures.cells[("0002/replica-0", "C=16", "result")] == "passed early (16 of 48)"
    assert 'href="h/0002-rset-replica-1/gate.md"' in html and "Gate of replica-1 alone passed" in html
    assert mismatches(html.replace("passed early (16 of 48)", "pass"), docs), "the words of an early pass are checked"
    index = (reports / "index.html").read_text()
    assert "FAILED</span> (replica-0 alone)" in index


def test_the_index_shows_the_hosts_of_other_inventories_as_last_read(tmp_path):
    from dsv4deploy.cli.report import other_hosts
    reports = reports_tree(tmp_path)
    (reports / "twin-1" / RECORDS_FILE).write_text(json.dumps(
        {"inventory": "inventory/sim.py", "read_at": "2026-12-05T10:30:00+00:00", "records": RECORDS, "profiles": {}}))
    now = HostInput("rp-1", [rec(1, "nvfp4-ctx8k", "deployed")], {}, {}, T0, inventory="inventory/fleet-sim.py")
    others = other_hosts(reports, {"rp-1"})
    assert [h.name for h in others] == ["twin-1"]
    write_site([now] + others, reports, "inventory/fleet-sim.py")
    index = (reports / "index.html").read_text()
    assert index.index("Hosts of inventory/fleet-sim.py") < index.index("Hosts of inventory/sim.py, as last read")
    assert "serving release 0003 (nvfp4-ctx8k) when last read, 2026-12-05 10:30:00 UTC (not read by this run)" in index
    assert 'href="host-twin-1.html"' in index and (reports / "host-twin-1.html").is_file()
