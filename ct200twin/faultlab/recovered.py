"""docs/faults.md's "recovered", as checks: serving or saying what to do (never a traceback of
our own), a consistent release history, nothing lost, a re-run that converges, nothing of ours
left running. `judge` applies them all to one fault's runs and fills in its row."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from ct200twin.faultlab.reading import health, live_manifest_sha, release_files, releases, wait_no_processes
from ct200twin.faultlab.rows import Row, did
from ct200twin.faultlab.tool import REPO, Run


def passed(rec: dict, by_number: dict[int, dict]) -> bool:
    """Did this release pass its gate (a rollback: did the release it restores)?"""
    if rec.get("kind") == "rollback":
        origin = by_number.get(rec.get("restores") or 0)
        return origin is not None and origin is not rec and passed(origin, by_number)
    return bool((rec.get("gate") or {}).get("passed"))


def history_problems(recs: list[dict], serving_sha: str | None = None) -> list[str]:
    """What is wrong with a release history: a release left pending, one recorded deployed (or
    superseded) without a passed gate, two deployed at once, or a healthy server that is not the
    deployed release."""
    by_number = {r["release"]: r for r in recs}
    problems = [f"release {r['release']:04d} left pending" for r in recs if r["status"] == "pending"]
    problems += [f"release {r['release']:04d} is {r['status']} without a passed gate" for r in recs
                 if r["status"] in ("deployed", "superseded") and not passed(r, by_number)]
    live = [r for r in recs if r["status"] == "deployed"]
    if len(live) > 1:
        problems.append("more than one release deployed: " + ", ".join(f"{r['release']:04d}" for r in live))
    if serving_sha and live and live[-1]["manifest_sha256"] != serving_sha:
        problems.append(f"the server answering is not release {live[-1]['release']:04d}'s")
    return problems


def lost_files(before: dict[int, str], after: dict[int, str], recs: list[dict], keep: int = 10,
               spared: set[int] = frozenset()) -> list[str]:
    """Releases whose kept files changed or vanished (pruning beyond the newest `keep` is not loss)."""
    newest = {r["release"] for r in recs[-keep:]}
    return [f"release {n:04d}'s files " + ("changed" if n in after else "are gone")
            for n, h in sorted(before.items()) if n in newest and n not in spared and after.get(n) != h]


@dataclass
class Serving:
    http: str
    release: dict | None       # the deployed record, when the server answering is it
    problems: list[str]

    @property
    def good(self) -> bool:
        return self.http == "200" and self.release is not None

    def describe(self) -> str:
        if self.good:
            r = self.release
            what = f"{r['release']:04d} {r['profile']}"
            return what + (f" (restores {r['restores']:04d})" if r.get("restores") else "")
        return "nothing" if self.http != "200" else "a server no record vouches for"


def serving(twin) -> Serving:
    recs = releases(twin)
    sha = live_manifest_sha(twin)
    code = health(twin)
    live = [r for r in recs if r["status"] == "deployed"]
    rec = live[-1] if live and live[-1]["manifest_sha256"] == sha else None
    by_number = {r["release"]: r for r in recs}
    if rec is not None and not passed(rec, by_number):
        rec = None
    return Serving(http=code, release=rec, problems=history_problems(recs, sha if code == "200" else None))


def tool_traceback(output: str) -> bool:
    """A traceback of the tool itself (the server's own, in the journal lines a failure shows, is
    what the operator needs to see)."""
    return bool(re.search(r'File "(%s|[^"]*/site-packages/pyinfra/)' % re.escape(str(REPO)), output))


# A failed run must say what to do next (deploy again, roll back, stop something, ...) or that it
# already rolled back.
_SAYS_WHAT_TO_DO = re.compile(r"(deploy|run) again|make (deploy|rollback)|stop it|rolled back|free |"
                              r"reboot|break_lock|[Dd]eploy a")


def judge(twin, row: Row, first: Run, state: tuple[Serving, list[str]], *, t0: float,
          before: dict[int, str], rerun: Run | None, expect: list[str] = (),
          spared: set[int] = frozenset()) -> Row:
    """Fill in a row from the faulty run (`first`, and `state` = Lab.after(first)) and the re-run
    that must converge."""
    first_serving, left_first = state
    text = first.output
    row.did = row.did or did(text)
    row.outputs["first"] = text
    why = row.why_not
    if tool_traceback(text):
        why.append("a traceback instead of a message")
    for needle in expect:
        if needle not in text:
            why.append(f"the output does not say {needle!r}")
    if first.rc != 0 and first.struck is None and not _SAYS_WHAT_TO_DO.search(text):
        why.append("failed without saying what to do")
    if first.rc == 0 and not first_serving.good:
        why.append("exit 0 but no release that passed its gate is serving")
    if left_first:
        why.append("left running after the faulty run: " + " | ".join(left_first)[:200])
    if rerun is not None:
        row.outputs["rerun"] = rerun.output
        if rerun.rc != 0:
            why.append(f"the re-run failed (exit {rerun.rc}): {did(rerun.output)}")
        if tool_traceback(rerun.output):
            why.append("the re-run printed a traceback")
    final = serving(twin)
    recs = releases(twin)
    row.serving = final.describe()
    if not final.good:
        why.append("no release that passed its gate is serving at the end")
    row.history = "consistent" if not final.problems else "; ".join(final.problems)
    why += final.problems
    lost = lost_files(before, release_files(twin), recs, spared=spared)
    row.lost = "nothing" if not lost else "; ".join(lost)
    why += lost
    left, _ = wait_no_processes(twin, within_s=5.0)
    if left:
        why.append("left running at the end: " + " | ".join(left)[:200])
    if first_serving.good:
        row.recover_s = first.wall_s
    elif final.good:
        row.recover_s = time.monotonic() - t0
    row.recovered = not why and not row.not_struck      # a strike that did not land proves nothing
    return row
