"""A host's own memory calibration: what SGLang reported at each start there (the release records'
`startup`, release/startup_log.py) turned into the capture need the budget uses for that host.

The file lives on the control node, reports/<host>/calibration.json next to the gate reports of
that host: it is derived, machine-written output that every deploy rewrites, so it belongs with the
other per-host measurements rather than in the inventory (hand-written settings) or in a profile
(host-independent, committed). It holds one piece of evidence per start, keyed by the layout that
decides the capture need (model, TP, all-reduce path, largest decode graph, prefill chunk); the
fraction does not change that need, only how much of the card is left for it.

In the budget's terms (headroom = capacity * (1 - fraction) - CUDA context), for a start at F:
- it started: need = headroom(F) - what SGLang had left after capture ("capture left 2.1 GiB");
  it sets the need for that layout, above or below the model's;
- it ran out of memory: need >= headroom(F) + (asked - free) in torch's message; it can only
  raise the need (later graphs would have wanted more still).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from dsv4deploy.profile.memory_facts import headroom_gib

FILE_NAME = "calibration.json"
LAYOUT_KEYS = ("model", "tp", "allreduce", "graph_max_bs", "chunked_prefill_size")


class CalibrationError(ValueError):
    """A calibration file that cannot be read; the message names the file."""


def layout(data: dict, budget) -> dict:
    """The layout of a validated profile (DATA, its BUDGET) that the capture need depends on."""
    return {"model": data["model"]["repo"], "tp": data["server"]["tp_size"], "allreduce": budget.allreduce_path,
            "graph_max_bs": budget.graph_max_bs, "chunked_prefill_size": budget.chunked_prefill_size}


def startup_entry(data: dict, budget, figures: dict, started: bool) -> dict:
    """The record's `startup` field: the layout, the fraction and capacity it was budgeted at, and
    what SGLang logged (FIGURES); STARTED: whether the server came up."""
    return {"layout": layout(data, budget), "fraction": budget.fraction, "capacity_gib": round(budget.capacity_gib, 4),
            "started": started, "figures": figures}


def evidence(record: dict) -> dict | None:
    """The calibration evidence of one release record (None: its start told nothing about memory)."""
    st = record.get("startup")
    if not isinstance(st, dict) or not isinstance(st.get("figures"), dict):
        return None
    fig, frac, cap = st["figures"], st["fraction"], st["capacity_gib"]
    head = headroom_gib(cap, frac)
    name = f"release {record['release']:04d}"
    base = {"release": record["release"], "profile": record.get("profile"), "layout": st["layout"], "fraction": frac}
    if "oom" in fig:
        o = fig["oom"]
        short = max(o["tried_gib"] - o["free_gib"], 0.0)
        return {**base, "kind": "oom", "need_gib": round(head + short, 4),
                "text": f"{name} ran out of GPU memory at start at {frac} (asked {o['tried_gib']:.2f} GiB, "
                        f"{o['free_gib']:.2f} GiB free)"}
    left = fig.get("capture_avail_gib", fig.get("available_gpu_mem_gib"))
    if st.get("started") and left is not None:
        return {**base, "kind": "started", "need_gib": round(head - left, 4),
                "text": f"{name}'s capture left {left:.1f} GiB at {frac}"}
    return None


def derive(host: str, records: list[dict], previous: dict | None = None) -> dict:
    """The calibration document of HOST: PREVIOUS's evidence, replaced per release by RECORDS'."""
    by_release = {e["release"]: e for e in (previous or {}).get("evidence", [])}
    for rec in records:
        if (e := evidence(rec)) is not None:
            by_release[e["release"]] = e
    return {"host": host, "evidence": [by_release[k] for k in sorted(by_release)]}


def measured_need(doc: dict | None, key: dict, model_need_gib: float) -> tuple[float, str] | None:
    """(need in GiB, the sentence naming its evidence) for the layout KEY on the host of DOC; None
    where nothing applies or the host's evidence does not move the model's MODEL_NEED_GIB."""
    if not doc:
        return None
    same = [e for e in doc.get("evidence", []) if e.get("layout") == key]
    started = [e for e in same if e["kind"] == "started"]
    ooms = [e for e in same if e["kind"] == "oom"]
    best = max(started, key=lambda e: e["need_gib"]) if started else None
    need, source = (best["need_gib"], best["text"]) if best else (model_need_gib, None)
    worst = max(ooms, key=lambda e: e["need_gib"]) if ooms else None
    if worst and worst["need_gib"] > need:
        need, source = worst["need_gib"], worst["text"]
    return (need, f"{doc.get('host')}: {source}") if source else None


def path_for(reports: Path, host: str) -> Path:
    return Path(reports) / host / FILE_NAME


def read(path: Path) -> dict | None:
    """The calibration at PATH (None: there is none yet)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CalibrationError(f"{path}: cannot read the host's calibration: {exc.strerror}") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise CalibrationError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("evidence", []), list) or not all(
            isinstance(e, dict) and {"layout", "kind", "need_gib", "text", "release"} <= set(e)
            for e in doc.get("evidence", [])):
        raise CalibrationError(f"{path}: evidence: expected a list of objects with layout, kind, need_gib, "
                               "text and release")
    return doc


def write(path: Path, doc: dict) -> None:
    """Replace PATH with DOC whole (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
