"""What the page says, made from the records alone: each host's releases (with the gate report
each one wrote on the control node and the profile keys that changed from the release before),
the figures of every gate level, and the tune runs. Pure: the inputs are the documents as read
(release records, gate.json, tune.json); nothing here is measured or guessed."""

from __future__ import annotations

import datetime as dt
import json
import re
from dataclasses import dataclass, field

from dsv4deploy.release import records as releases

# A gate report and the record it belongs to: written after the record was created (a twin made
# afresh numbers its releases from 0001 again; the older folder of that number is not this one's).
REPORT_SLACK_S = 120
# a replica of a set gated alone: its report folder is the release's with `-replica-N` (host/gate.py)
REPLICA_PART = re.compile(r"-(replica-\d+)\Z")


@dataclass(frozen=True)
class GateFile:
    """One gate.json on the control node: its folder relative to reports/, and its document."""

    folder: str
    doc: dict


@dataclass(frozen=True)
class HostInput:
    """What is known of one host: its records as last read (READ_AT), the profiles kept with its
    releases, the gate reports on the control node by folder name, and why it could not be read
    now (ERROR; the records are then those of the last read, or none)."""

    name: str
    records: list[dict]
    profiles: dict[int, dict]
    gates: dict[str, GateFile]
    read_at: str | None
    error: str | None = None
    watch: dict | None = None
    inventory: str | None = None     # the inventory it was (last) read through
    read_now: bool = True            # False: a host of another inventory, shown as last read


@dataclass(frozen=True)
class LevelFigures:
    """One gate level as the gate judged it (gate.json's verdict rows)."""

    label: str
    concurrency: int
    passed: bool | None
    throughput: float | None
    floor: float | None
    p99_ttft_ms: float | None
    p99_tpot_ms: float | None
    ttft_ceiling: float | None = None
    tpot_ceiling: float | None = None
    reason: str = ""                # why it failed or was not run, as the verdict says
    early: str = ""                 # "passed early (k of n)": it stopped once clearly above its floor

    @property
    def result(self) -> str:
        """The level's result in words, as the figures table and the chart points say it."""
        if self.passed is None:
            return "not run"
        return (self.early or "pass") if self.passed else "FAIL"


@dataclass(frozen=True)
class GateView:
    folder: str
    passed: bool
    summary: str
    written_at: str
    levels: list[LevelFigures]
    part: str | None = None         # "replica-0": that replica gated alone; None: the server or the set

    @property
    def what(self) -> str:
        return f"{self.part} alone" if self.part else "gate"


@dataclass(frozen=True)
class ReleaseView:
    number: int
    kind: str
    profile: str
    status: str
    words: str                      # the status in words (readable without colour)
    created: str
    updated: str
    reason: str
    sglang: str
    gate: GateView | None
    changed: list[tuple[str, str, str]] | None   # (key, before, after) against the release before it;
                                                 # None: one of the two profiles is not kept
    compared_with: int | None
    replica_gates: list[GateView] = field(default_factory=list)   # each replica's own, by part

    @property
    def gates(self) -> list[GateView]:
        """Every gate report of this release: the server's (or the set's) first, then each replica's."""
        return ([self.gate] if self.gate else []) + self.replica_gates

    @property
    def label(self) -> str:
        return f"{self.number:04d}"


@dataclass(frozen=True)
class HostView:
    name: str
    reachable: bool
    error: str | None
    read_at: str | None
    releases: list[ReleaseView]
    serving: ReleaseView | None
    last_gate: ReleaseView | None
    watch: dict | None = None
    inventory: str | None = None
    read_now: bool = True

    @property
    def state_words(self) -> str:
        if not self.read_now:
            when = self.read_at[:19].replace("T", " ") if self.read_at else "?"
            was = (f"serving release {self.serving.label} ({self.serving.profile})" if self.serving
                   else "no release serving")
            return f"{was} when last read, {when} UTC (not read by this run)"
        if not self.reachable:
            seen = (f"; last data read {self.read_at[:19].replace('T', ' ')} UTC" if self.read_at
                    else "; no data was ever read")
            return f"unreachable{seen}"
        if self.serving is None:
            return "no release serving"
        return f"serving release {self.serving.label} ({self.serving.profile})"


@dataclass(frozen=True)
class TuneView:
    folder: str
    profile: str
    written_at: str
    verdict: str
    chosen: str | None
    concurrency: int | None
    candidates: list[dict] = field(default_factory=list)


def level_figures(doc: dict) -> list[LevelFigures]:
    """Each level of a gate.json as its verdict judged it: observed values and thresholds."""
    out = []
    for lv in (doc.get("verdict") or {}).get("levels") or []:
        rows = {r.get("metric"): r for r in lv.get("rows") or []}

        def observed(metric):
            v = (rows.get(metric) or {}).get("observed")
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        def threshold(metric):
            v = (rows.get(metric) or {}).get("threshold")
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

        out.append(LevelFigures(label=str(lv.get("label", f"C={lv.get('concurrency')}")),
                                concurrency=int(lv.get("concurrency") or 0), passed=lv.get("passed"),
                                throughput=observed("output throughput"), floor=threshold("output throughput"),
                                p99_ttft_ms=observed("p99 TTFT"), p99_tpot_ms=observed("p99 TPOT"),
                                ttft_ceiling=threshold("p99 TTFT"), tpot_ceiling=threshold("p99 TPOT"),
                                reason=str(lv.get("reason") or ""), early=early_words(doc, lv, rows)))
    return sorted(out, key=lambda f: f.concurrency)


def early_words(doc: dict, level: dict, rows: dict) -> str:
    """"passed early (k of n)" for a level that passed and stopped once clearly above its floor
    (its result's early_stop rule is "pass", or the verdict's note says so); "" otherwise."""
    if level.get("passed") is not True:
        return ""
    results = [r for r in (doc.get("result") or {}).get("levels") or []
               if isinstance(r, dict) and r.get("concurrency") == level.get("concurrency")]
    res = results[0] if len(results) == 1 else {}
    completed = rows.get("completed") or {}
    if (res.get("early_stop") or {}).get("rule") != "pass" and \
            not str(completed.get("note") or "").startswith("passed early"):
        return ""
    k, n = res.get("completed"), res.get("num_prompts")
    if not (isinstance(k, int) and isinstance(n, int)):
        k, _, n = str(completed.get("observed") or "").partition("/")
    return f"passed early ({k} of {n})" if str(k).strip() and str(n).strip() else "passed early"


def _seconds(stamp: str | None) -> float | None:
    if not stamp:
        return None
    try:
        t = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)).timestamp()


def gate_of(rec: dict, gates: dict[str, GateFile], part: str | None = None) -> GateView | None:
    """The gate report this record's run wrote (`NNNN-<profile>`, or `NNNN-<profile>-<part>` for a
    replica gated alone; written after the record was created), or None: no gate ran, or its
    report is not on this control node."""
    found = gates.get(f"{rec['release']:04d}-{rec['profile']}" + (f"-{part}" if part else ""))
    if found is None:
        return None
    written, created = _seconds(found.doc.get("written_at")), _seconds(rec.get("created"))
    if written is not None and created is not None and written < created - REPORT_SLACK_S:
        return None
    return GateView(folder=found.folder, passed=bool(found.doc.get("passed")),
                    summary=str(found.doc.get("summary") or ""), written_at=str(found.doc.get("written_at") or ""),
                    levels=level_figures(found.doc), part=part)


def replica_parts(rec: dict, gates: dict[str, GateFile]) -> list[str]:
    """The parts (`replica-N`) whose own gate report this record's run left, by replica number."""
    head = f"{rec['release']:04d}-{rec['profile']}-"
    parts = [m.group(1) for name in gates if name.startswith(head) and (m := REPLICA_PART.search(name))
             and len(name) == len(head) + len(m.group(1))]
    return sorted(parts, key=lambda p: int(p.rsplit("-", 1)[1]))


def flat(data, prefix: str = "") -> dict[str, str]:
    """A profile's data as dotted keys -> the value as JSON text (lists whole)."""
    if isinstance(data, dict):
        out: dict[str, str] = {}
        for k, v in data.items():
            out.update(flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: json.dumps(data, sort_keys=True)}


def profile_changes(before: dict | None, after: dict | None) -> list[tuple[str, str, str]] | None:
    """The keys whose value differs between two releases' profiles ("-": not set); None when
    either profile is unknown (pruned from the host before it was first read)."""
    if before is None or after is None:
        return None
    a, b = flat(before), flat(after)
    return [(k, a.get(k, "-"), b.get(k, "-")) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def status_words(rec: dict, next_rec: dict | None, live: dict | None) -> str:
    """The status as the operator reads it, not only as a colour."""
    status, kind = rec.get("status", "?"), rec.get("kind", "deploy")
    said = {releases.DEPLOYED: "deployed, serving" if rec is live else "deployed",
            releases.SUPERSEDED: "passed, later replaced", releases.FAILED: "failed",
            releases.PENDING: "pending (its run has not finished)",
            releases.UNVERIFIED: "unverified (cut off before its gate)"}.get(status, status)
    if kind == "rollback" and rec.get("restores"):
        said = f"rollback to {rec['restores']:04d}: {said}"
    if status == releases.FAILED and next_rec and next_rec.get("kind") == "rollback":
        said += f", rolled back (release {next_rec['release']:04d} restores {next_rec.get('restores') or 0:04d})"
    return said


def host_view(h: HostInput) -> HostView:
    recs = sorted(h.records, key=lambda r: r["release"])
    live = releases.current(recs)
    views = []
    for i, rec in enumerate(recs):
        before = recs[i - 1] if i else None
        views.append(ReleaseView(
            number=rec["release"], kind=rec.get("kind", "deploy"), profile=rec.get("profile", "?"),
            status=rec.get("status", "?"), words=status_words(rec, recs[i + 1] if i + 1 < len(recs) else None, live),
            created=rec.get("created", ""), updated=rec.get("updated", ""), reason=rec.get("reason") or "",
            sglang=rec.get("sglang_version", "?"), gate=gate_of(rec, h.gates),
            changed=profile_changes(h.profiles.get(before["release"]) if before else None,
                                    h.profiles.get(rec["release"])),
            compared_with=before["release"] if before else None,
            replica_gates=[g for p in replica_parts(rec, h.gates) if (g := gate_of(rec, h.gates, p))]))
    serving = next((v for v in views if live is not None and v.number == live["release"]), None)
    gated = [v for v in views if v.gates]
    return HostView(name=h.name, reachable=h.error is None, error=h.error, read_at=h.read_at, releases=views,
                    serving=serving, last_gate=gated[-1] if gated else None, watch=h.watch,
                    inventory=h.inventory, read_now=h.read_now)


def tune_view(folder: str, doc: dict) -> TuneView:
    """A tune.json as the page lists it: every candidate with its status and reason, and its
    last measurement (None for a refused or unmeasured one)."""
    cands = []
    for c in doc.get("candidates") or []:
        trials = c.get("trials") or []
        m = (trials[-1].get("measurement") if trials else None) or None
        overrides = c.get("overrides") or {}
        cands.append({"id": c.get("id", "?"), "overrides": ", ".join(f"{k}={v}" for k, v in overrides.items()) or "(base)",
                      "status": c.get("status", "?"), "why": c.get("why") or "; ".join(c.get("reasons") or []),
                      "throughput": m.get("output_throughput") if m and not m.get("error") else None,
                      "p99_ttft_ms": m.get("p99_ttft_ms") if m else None,
                      "p99_tpot_ms": m.get("p99_tpot_ms") if m else None,
                      "release": m.get("release") if m else None, "error": m.get("error") if m else None})
    return TuneView(folder=folder, profile=str(doc.get("profile", "?")), written_at=str(doc.get("written_at", "")),
                    verdict=str(doc.get("verdict", "")), chosen=doc.get("chosen"),
                    concurrency=(doc.get("method") or {}).get("concurrency"), candidates=cands)
