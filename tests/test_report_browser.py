"""The report page in a real browser (headless Chromium, tests/browser.py), made from the records,
gate reports and watch results of a real twin run from a fresh clone (tests/fixtures/report/;
bench/results/report-2026-12-06.md): `make deploy PROFILE=nvfp4-ctx8k`, the watch's intervals
(with a stopped server it restarted), `make deploy PROFILE=fp8-ctx1m-baseline` (failed its gate,
rolled back), a tune through a replica set (each replica gated alone) with refused candidates,
then `make report`. The page loads with no console error and no request that leaves file://,
shows both releases, the rollback, the gate charts (the replicas' apart) and the watch's
intervals with the figures of the records, and its links resolve. A screenshot is kept in the
test's folder."""

from __future__ import annotations

import json
import shutil
from html import escape
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

import browser
from dsv4deploy.cli.report import cached_host, gather_local, write_site
from report_checks import mismatches, shown, watch_mismatches

FIXTURE = Path(__file__).parent / "fixtures" / "report"
HOST = "rp-1"

pytestmark = pytest.mark.skipif(browser.chromium() is None,
                                reason="needs Debian's chromium (make test installs it: make browser-debs)")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    reports = tmp_path_factory.mktemp("site") / "reports"
    shutil.copytree(FIXTURE / "reports", reports)
    host = gather_local(cached_host(HOST, reports, None), reports)
    write_site([host], reports, "inventory/fleet-sim.py")
    return reports


@pytest.fixture(scope="module")
def host_visit(site):
    return browser.visit(site / f"host-{HOST}.html")


def gate_docs(reports: Path) -> dict[str, dict]:
    """Every gate.json of the host by release, a replica's as "NNNN/replica-N"."""
    out = {}
    for f in (reports / HOST).glob("[0-9]*/gate.json"):
        name = f.parent.name
        part = name[name.rindex("-replica-") + 1:] if "-replica-" in name else None
        out[name[:4] + (f"/{part}" if part else "")] = json.loads(f.read_text())
    return out


def fixture_json(name: str) -> dict:
    return json.loads((FIXTURE / "reports" / HOST / name).read_text())


def assert_loaded_alone(visit: browser.Visit) -> None:
    assert visit.errors == [], visit.console
    assert [u for u in visit.requests if not u.startswith("file://")] == []


def assert_links_resolve(visit: browser.Visit) -> None:
    for link in visit.links:
        url = urlsplit(link)
        assert url.scheme == "file", link
        target = Path(unquote(url.path))
        assert target.is_file(), f"{link}: no such file"
        if url.fragment:
            assert f'id="{url.fragment}"' in target.read_text(), f"{link}: no such anchor"


def test_the_host_page_shows_both_releases_the_rollback_and_the_recorded_gate_figures(site, host_visit, tmp_path):
    visit = host_visit
    (tmp_path / "host.png").write_bytes(visit.screenshot)
    assert_loaded_alone(visit)
    assert_links_resolve(visit)
    seen = shown(visit.html)
    records = fixture_json("records.json")["records"]
    assert seen.releases == {f"{r['release']:04d}": r["status"] for r in records}
    assert [(r["profile"], r["status"], r["kind"]) for r in records[:3]] == [
        ("nvfp4-ctx8k", "superseded", "deploy"), ("fp8-ctx1m-baseline", "failed", "deploy"),
        ("nvfp4-ctx8k", "superseded", "rollback")]
    assert "failed, rolled back (release 0003 restores 0001)" in visit.html
    assert "rollback to 0001: passed, later replaced" in visit.html
    docs = gate_docs(site)
    assert {"0001", "0002"} <= set(docs) and any("/replica-" in k for k in docs), "the tune rolled a replica set"
    assert mismatches(visit.html, docs) == []
    charts = {c for c, _, _ in seen.points}
    assert {"chart-throughput", "chart-p99-ttft-ms", "chart-p99-tpot-ms"} <= charts
    assert {r for _, _, r in seen.points if "/" not in r} >= {"0001", "0002"}
    assert any("/replica-" in r for _, _, r in seen.points), "each replica's gate is charted"
    assert "passed early (" in visit.html
    assert visit.screenshot[:8] == b"\x89PNG\r\n\x1a\n" and len(visit.screenshot) > 20_000


def test_the_host_page_shows_every_watch_interval_read_from_the_host(host_visit):
    kept = fixture_json("watch.json")
    assert watch_mismatches(host_visit.html, kept) == []
    results = [r["result"] for r in kept["results"]]
    assert {"passed", "failed"} <= set(results), "the fixture holds the stopped server's failed intervals"
    assert (f"{len(results)} intervals read since" in host_visit.html
            and f"{results.count('failed')} failed" in host_visit.html)
    assert "acted: watch restart server" in host_visit.html


def test_the_index_says_what_serves_and_every_tune_candidate_as_recorded(site):
    visit = browser.visit(site / "index.html")
    assert_loaded_alone(visit)
    assert_links_resolve(visit)
    records = fixture_json("records.json")["records"]
    live = max((r for r in records if r["status"] == "deployed"), key=lambda r: r["release"])
    assert f"serving release {live['release']:04d} ({live['profile']})" in visit.html
    assert f'href="host-{HOST}.html"' in visit.html
    (tune,) = [json.loads(p.read_text()) for p in site.glob("tune-*/tune.json")]
    assert "kept the base" in visit.html if tune["chosen"] is None else f"winner <strong>{tune['chosen']}" in visit.html
    for c in tune["candidates"]:
        m = c["trials"][-1]["measurement"] if c["trials"] else None
        figure = f"{m['output_throughput']:.1f}" if m and not m.get("error") else "-"
        assert f'<td class="num" data-metric="throughput">{figure}</td>' in _row(visit.html, c["id"]), c["id"]
        if c["refused"]:
            assert all(escape(reason, quote=False) in visit.html for reason in c["reasons"])


def _row(html: str, candidate: str) -> str:
    start = html.index(f'<tr data-candidate="{candidate}">')
    return html[start:html.index("</tr>", start)]


def test_a_page_that_fetches_from_the_network_or_shows_a_wrong_figure_fails_the_checks(site, host_visit, tmp_path):
    """The checks above can fail: a page that loads an image from the network is seen doing so,
    and a figure that is not the gate report's or the watch's is named."""
    page = (site / f"host-{HOST}.html").read_text()
    bad = tmp_path / "bad.html"
    bad.write_text(page.replace('<main id="main">', '<main id="main"><img src="http://192.0.2.1/x.png" alt="">'))
    with pytest.raises(AssertionError):
        assert_loaded_alone(browser.visit(bad))
    docs = gate_docs(site)
    rows = docs["0001"]["verdict"]["levels"][-1]["rows"]
    next(r for r in rows if r["metric"] == "output throughput")["observed"] += 1.0
    assert any("0001" in m for m in mismatches(host_visit.html, docs))
    kept = fixture_json("watch.json")
    measured = next(r for r in kept["results"] if r.get("tpot_ms") is not None)
    measured["tpot_ms"] += 1.0
    assert watch_mismatches(host_visit.html, kept)
