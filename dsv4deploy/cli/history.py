"""`dsv4deploy history`: the release records of a host as a table (or JSON)."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from dsv4deploy.gate.verdict import headline_basis


def gate_summary(rec: dict) -> str:
    gate = rec.get("gate") or {}
    if gate.get("output_throughput") is None:
        return "-" if not gate else ("pass" if gate.get("passed") else "FAIL")
    verdict = "pass" if gate.get("passed") else "FAIL"
    split = gate.get("split")
    served = f" (replicas {'/'.join('?' if n is None else str(n) for n in split)} requests)" if split else ""
    scope = f" ({gate['scope']})" if gate.get("scope") else ""
    return (f"{verdict}: {gate.get('level', '?')} {gate['output_throughput']:.1f} tok/s vs floor "
            f"{gate.get('floor', '-')}{headline_basis(gate)}{served}{scope}")


def replicas_summary(rec: dict) -> str:
    """Each replica's part in a replica set's release: `0 switched 91s (gate pass), 1 untouched`."""
    parts = []
    for r in rec.get("replicas") or []:
        gate = r.get("gate")
        said = f" (gate {'pass' if gate.get('passed') else 'FAIL'})" if gate else ""
        took = f" {r['seconds']:.0f}s" if r.get("status") != "untouched" and r.get("seconds") else ""
        parts.append(f"{r['index']} {r['status']}{took}{said}")
    return ", ".join(parts) or "-"


def table(host_name: str, records: list[dict]) -> Table:
    t = Table(title=f"releases on {host_name}")
    sets = any(r.get("replicas") for r in records)
    for col in ("release", "kind", "profile", "sglang", "status", "time", "gate", *(["replicas"] if sets else []),
                "reason"):
        t.add_column(col)
    for r in records:
        kind = r.get("kind", "deploy") + (f" of {r['restores']:04d}" if r.get("restores") else "")
        style = {"deployed": "green", "failed": "red", "pending": "yellow"}.get(r["status"])
        t.add_row(f"{r['release']:04d}", kind, r["profile"], r.get("sglang_version", "?"), r["status"],
                  r.get("updated", "")[:16].replace("T", " "), gate_summary(r),
                  *([replicas_summary(r)] if sets else []), (r.get("reason") or "")[:120], style=style)
    return t


def print_history(per_host: dict[str, list[dict]], as_json: bool) -> None:
    if as_json:
        print(json.dumps(per_host, indent=2))
        return
    import sys
    console = Console(width=None if sys.stdout.isatty() else 200)
    for name, recs in per_host.items():
        console.print(table(name, recs))
