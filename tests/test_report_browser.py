"""The report page in a real browser (headless Chromium, tests/browser.py), made from the records
and gate reports of a real twin run (tests/fixtures/report/: `make deploy PROFILE=nvfp4-ctx8k`,
then fp8-ctx1m-baseline, which failed its gate and rolled back, on an isolated twin, and a tune
of three candidates there, one refused; see docs/report.md): it loads with no console error and no request that leaves file://, shows both
releases, the rollback and the gate charts with the figures of the gate reports, and its links
resolve. A screenshot is kept in the test's folder."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

import browser
from dsv4deploy.cli.report import cached_host, local_gates, write_site
from report_checks import mismatches, shown

FIXTURE = Path(__file__).parent / "fixtures" / "report"
HOST = "report-1"

pytestmark = pytest.mark.skipif(browser.chromium() is None,
                                reason="needs Debian's chromium (make test installs it: make browser-debs)")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    reports = tmp_path_factory.mktemp("site") / "reports"
    shutil.copytree(FIXTURE / "reports", reports)
    host = dataclasses.replace(cached_host(HOST, reports, "unused"), error=None, gates=local_gates(reports, HOST))
    write_site([host], reports, "inventory/fleet-sim.py")
    return reports


def gate_docs(reports: Path) -> dict[str, dict]:
    return {f.parent.name[:4]: json.loads(f.read_text()) for f in (reports / HOST).glob("[0-9]*/gate.json")}


def assert_loaded_alone(visit: browser.Visit) -> None:
    assert visit.errors == [], visit.console
    assert [u for u in visit.requests if not u.startswith("file://")] == []


def assert_links_resolve(visit: browser.Visit, page: Path) -> None:
    for link in visit.links:
        url = urlsplit(link)
        assert url.scheme == "file", link
        target = Path(unquote(url.path))
        assert target.is_file(), f"{link}: no such file"
        if url.fragment:
            assert f'id="{url.fragment}"' in target.read_text(), f"{link}: no such anchor"


def test_the_host_page_shows_both_releases_the_rollback_and_the_recorded_gate_figures(site, tmp_path):
    page = site / f"host-{HOST}.html"
    visit = browser.visit(page)
    (tmp_path / "host.png").write_bytes(visit.screenshot)
    assert_loaded_alone(visit)
    assert_links_resolve(visit, page)
    seen = shown(visit.html)
    assert seen.releases == {"0001": "superseded", "0002": "failed", "0003": "deployed"}
    assert "failed, rolled back (release 0003 restores 0001)" in visit.html
    assert "rollback to 0001: deployed, serving" in visit.html
    assert {c for c, _, _ in seen.points} == {"chart-throughput", "chart-p99-ttft-ms", "chart-p99-tpot-ms"}
    assert {r for _, _, r in seen.points} == {"0001", "0002"}
    assert mismatches(visit.html, gate_docs(site)) == []
    assert visit.screenshot[:8] == b"\x89PNG\r\n\x1a\n" and len(visit.screenshot) > 20_000


def test_the_index_says_what_serves_and_every_tune_candidate_as_recorded(site):
    visit = browser.visit(site / "index.html")
    assert_loaded_alone(visit)
    assert_links_resolve(visit, site / "index.html")
    assert "serving release 0003 (nvfp4-ctx8k)" in visit.html
    assert f'href="host-{HOST}.html"' in visit.html
    (tune,) = [json.loads(p.read_text()) for p in site.glob("tune-*/tune.json")]
    assert "kept the base" in visit.html if tune["chosen"] is None else f"winner <strong>{tune['chosen']}" in visit.html
    for c in tune["candidates"]:
        m = c["trials"][-1]["measurement"] if c["trials"] else None
        figure = f"{m['output_throughput']:.1f}" if m else "-"
        assert f'<td class="num" data-metric="throughput">{figure}</td>' in _row(visit.html, c["id"]), c["id"]
        if c["refused"]:
            assert all(reason in visit.html for reason in c["reasons"])


def _row(html: str, candidate: str) -> str:
    start = html.index(f'<tr data-candidate="{candidate}">')
    return html[start:html.index("</tr>", start)]


def test_a_page_that_fetches_from_the_network_or_shows_a_wrong_figure_fails_the_checks(site, tmp_path):
    """The checks above can fail: a page that loads an image from the network is seen doing so,
    and a figure that is not the gate report's is named."""
    page = (site / f"host-{HOST}.html").read_text()
    bad = tmp_path / "bad.html"
    bad.write_text(page.replace('<main id="main">', '<main id="main"><img src="http://192.0.2.1/x.png" alt="">'))
    visit = browser.visit(bad)
    with pytest.raises(AssertionError):
        assert_loaded_alone(visit)
    docs = gate_docs(site)
    row = docs["0001"]["verdict"]["levels"][-1]["rows"]
    tput = next(r for r in row if r["metric"] == "output throughput")
    tput["observed"] += 1.0
    assert any("0001" in m for m in mismatches(browser.visit(site / f"host-{HOST}.html").html, docs))
