"""Release records, like Helm revisions: /var/lib/dsv4deploy/releases/NNNN/ on the host.

Each holds the resolved profile, the rendered files, the launch manifest and `status.json`.
Status goes pending -> deployed | failed; a newer deployed release makes the older one
superseded. `pending` is written before the switch, so a run that was cut off is found and
settled by the next one: as `unverified` (it never passed its gate, so it is never `deployed`;
the next deploy restarts and gates, a rollback restores the last release that passed). The transitions are pure functions over status documents; the host
I/O is in tasks/release.py.
"""

from __future__ import annotations

import datetime as dt

PENDING, DEPLOYED, FAILED, SUPERSEDED = "pending", "deployed", "failed", "superseded"
UNVERIFIED = "unverified"   # a cut-off run's release: maybe running, never gated


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()


def release_dir(releases_dir: str, number: int) -> str:
    return f"{releases_dir}/{number:04d}"


def next_number(records: list[dict]) -> int:
    return max((r["release"] for r in records), default=0) + 1


def new_record(records: list[dict], *, profile: str, content_hash: str, manifest_sha256: str,
               sglang_version: str, kind: str = "deploy", restores: int | None = None) -> dict:
    stamp = now()
    return {"release": next_number(records), "kind": kind, "restores": restores, "profile": profile,
            "content_hash": content_hash, "manifest_sha256": manifest_sha256,
            "sglang_version": sglang_version, "status": PENDING, "reason": None,
            "created": stamp, "updated": stamp, "gate": None}


def with_status(record: dict, status: str, reason: str | None = None, **extra) -> dict:
    return {**record, **extra, "status": status, "reason": reason, "updated": now()}


def mark_deployed(records: list[dict], number: int) -> list[dict]:
    """The records that change when `number` goes live: it, and every earlier deployed one."""
    changed = []
    for r in records:
        if r["release"] == number:
            changed.append(with_status(r, DEPLOYED, deployed_at=now()))
        elif r["status"] == DEPLOYED:
            changed.append(with_status(r, SUPERSEDED, f"superseded by release {number:04d}"))
    return changed


def settle_interrupted(records: list[dict], live_manifest_sha256: str | None, healthy: bool) -> list[dict]:
    """Decide every `pending` record left by a run that did not finish: none passed its gate, so
    none becomes `deployed`. The one whose files are installed is `unverified` (it may be serving:
    the next deploy restarts and gates it, or `make rollback` restores the last good release);
    the rest never reached the host and are `failed`."""
    pending = [r for r in records if r["status"] == PENDING]
    changed = []
    for r in pending:
        if r is pending[-1] and r["manifest_sha256"] == live_manifest_sha256:
            state = "answering /health" if healthy else "not healthy"
            changed.append(with_status(r, UNVERIFIED, f"interrupted after the switch, before its gate passed "
                                                      f"(server {state}); the next deploy restarts and gates it"))
        else:
            changed.append(with_status(r, FAILED, "interrupted: the run that started it did not finish"))
    return changed


def current(records: list[dict]) -> dict | None:
    live = [r for r in records if r["status"] == DEPLOYED]
    return live[-1] if live else None


KEEP = 10


def to_prune(records: list[dict], keep: int = KEEP) -> list[int]:
    """Release numbers whose files go: all but the newest `keep` (the live one always stays)."""
    live = current(records)
    newest = {r["release"] for r in sorted(records, key=lambda r: r["release"])[-keep:]}
    return [r["release"] for r in records
            if r["release"] not in newest and (live is None or r["release"] != live["release"])]


def unused(present: list[str], used: set[str]) -> list[str]:
    """Venvs or checkpoints on the host that no kept release uses."""
    return sorted(p for p in present if p not in used)
