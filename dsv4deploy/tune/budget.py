"""The memory budget as a tune applies it on a host: the host's own calibration, read again
before every deploy, and what the search itself saw run out of memory.

Candidates are first checked by the validator alone (candidates.py: `--plan` needs no host). On a
host, the deploy of every candidate rewrites reports/<host>/calibration.json from SGLang's startup
lines (profile/calibration.py), so a candidate is checked again, with the file as it is now, just
before it would be deployed: one the calibrated budget refuses is never started, and the refusal
names the release whose start is the evidence. A candidate that did not start because the GPUs ran
out of memory also refuses, at once, every candidate of the same memory layout (model, TP,
all-reduce path, largest decode graph, prefill chunk: what the capture need depends on) at the same
or a higher mem_fraction_static, even where its start left no figures in the calibration (a replica
set's servers are not read yet).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from dsv4deploy.profile import calibration as host_calibration
from dsv4deploy.profile.validate import validate
from dsv4deploy.tune.candidates import Candidate
from dsv4deploy.tune.objective import Measurement

ReadCalibration = Callable[[], "dict | None"]


def memory_layout(cand: Candidate) -> tuple | None:
    """The layout CAND's capture need depends on (None: it has no budget, it was refused)."""
    if cand.report is None or cand.report.budget is None:
        return None
    return tuple(sorted(host_calibration.layout(cand.profile.data, cand.report.budget).items()))


def fraction(cand: Candidate) -> float:
    return float(cand.profile.data["server"]["mem_fraction_static"])


def calibrated_reasons(cand: Candidate, doc: dict | None) -> list[str]:
    """Why the budget with the host's calibration DOC refuses CAND (empty: it may be deployed)."""
    if not doc:
        return []
    report = validate(cand.profile, doc)
    return [f"{p.path}: {p.message}" if p.path else p.message for p in report.errors]


@dataclass
class Screen:
    """Asked before each deploy of the search (refuse), told after each measurement (observe)."""

    read: ReadCalibration = lambda: None
    ooms: list[tuple[tuple, float, str]] = field(default_factory=list)   # (layout, fraction, candidate id)

    def refuse(self, cand: Candidate) -> list[str]:
        """Why CAND must not be deployed now (empty: it may)."""
        layout = memory_layout(cand)
        for oom_layout, at, cid in self.ooms:
            if layout is not None and layout == oom_layout and fraction(cand) >= at and cid != cand.id:
                return [f"server.mem_fraction_static: {cid} ran out of GPU memory at start at {at:g} on this host, "
                        f"with the same memory layout: {fraction(cand):g} leaves no more room"]
        return calibrated_reasons(cand, self.read())

    def observe(self, cand: Candidate, m: Measurement) -> None:
        if m.out_of_memory and (layout := memory_layout(cand)) is not None:
            self.ooms.append((layout, fraction(cand), cand.id))


def calibrate_candidates(candidates: list[Candidate], doc: dict | None) -> list[str]:
    """Refuse, before the search, the candidates the host's calibration DOC refuses: their
    problems become the calibrated validator's (listed as refused in the report, never measured).
    Returns the ids refused this way."""
    if not doc:
        return []
    refused = []
    for cand in candidates:
        if cand.refused:
            continue
        report = validate(cand.profile, doc)
        if report.errors:
            cand.problems, cand.report = list(report.problems), report
            refused.append(cand.id)
    return refused
