"""Release records, like Helm revisions: /var/lib/dsv4deploy/releases/NNNN/ on the host.

Each holds the resolved profile, the rendered files, the launch manifest and `status.json`.
Status goes pending -> deployed | failed; a newer deployed release makes the older one
superseded. `pending` is written before the switch, so a run that was cut off is found and
settled by the next one: as `unverified` (it never passed its gate, so it is never `deployed`;
the next deploy restarts and gates, a rollback restores the last release that passed).

The transitions are pure functions over status documents (the JSON kept on the host, whose
format older hosts share); the host I/O is host/release_store.py.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace

PENDING, DEPLOYED, FAILED, SUPERSEDED = "pending", "deployed", "failed", "superseded"
UNVERIFIED = "unverified"   # a cut-off run's release: maybe running, never gated


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()


def release_dir(releases_dir: str, number: int) -> str:
    return f"{releases_dir}/{number:04d}"


def next_number(records: list[dict]) -> int:
    return max((r["release"] for r in records), default=0) + 1


def new_record(records: list[dict], *, profile: str, content_hash: str, manifest_sha256: str,
               sglang_version: str, launch_check: str | None = None) -> dict:
    """A deploy's record, numbered after RECORDS. LAUNCH_CHECK: what the host's SGLang parsed
    before the switch (tasks/venv.launch_check_key), so a later run with the same argv and venv
    need not import it again."""
    stamp = now()
    return {"release": next_number(records), "kind": "deploy", "restores": None, "profile": profile,
            "content_hash": content_hash, "manifest_sha256": manifest_sha256,
            "sglang_version": sglang_version, "status": PENDING, "reason": None,
            "created": stamp, "updated": stamp, "gate": None, "launch_check": launch_check}


def rollback_record(records: list[dict], restored: dict, cause: str) -> dict:
    """A rollback is a new history entry, pending until its restore is checked; it names the
    release whose files it restores (the original one when RESTORED was itself a rollback)."""
    rec = new_record(records, profile=restored["profile"], content_hash=restored["content_hash"],
                     manifest_sha256=restored["manifest_sha256"], sglang_version=restored["sglang_version"],
                     launch_check=restored.get("launch_check"))
    return {**rec, "kind": "rollback", "restores": restored.get("restores") or restored["release"], "reason": cause}


def with_status(record: dict, status: str, reason: str | None = None, **extra) -> dict:
    return {**record, **extra, "status": status, "reason": reason, "updated": now()}


@dataclass(frozen=True)
class Release:
    """A release this run works on: its record as the run knows it (the host holds it as last
    saved, host/release_store.py). Frozen, so a step that learns something (the gate, the
    replicas' parts) makes a new handle instead of changing a dict another step holds."""

    record: dict

    @property
    def number(self) -> int:
        return self.record["release"]

    @property
    def name(self) -> str:
        return f"release {self.number:04d}"

    @property
    def profile(self) -> str:
        return self.record["profile"]

    @property
    def restores(self) -> int | None:
        return self.record.get("restores")

    def with_gate(self, gate: dict) -> "Release":
        return replace(self, record={**self.record, "gate": gate})

    def with_startup(self, startup: dict) -> "Release":
        """What SGLang logged about GPU memory at this release's start (profile/calibration.py
        startup_entry): kept in the record as `startup`, the host's calibration is made from it."""
        return replace(self, record={**self.record, "startup": startup})

    def with_replicas(self, parts: list[dict]) -> "Release":
        return replace(self, record={**self.record, "replicas": parts})

    def with_status(self, status: str, reason: str | None = None, **extra) -> "Release":
        return replace(self, record=with_status(self.record, status, reason, **extra))


def mark_deployed(records: list[dict], number: int) -> list[dict]:
    """The records that change when `number` goes live: it, and every earlier deployed one. It
    keeps the reason it carries (a rollback's cause)."""
    changed = []
    for r in records:
        if r["release"] == number:
            changed.append(with_status(r, DEPLOYED, r.get("reason"), deployed_at=now()))
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


def passed(records: list[dict]) -> list[dict]:
    """The releases that passed their gate (or a rollback's probe), oldest first."""
    return [r for r in records if r["status"] in (DEPLOYED, SUPERSEDED)]


def before_live(records: list[dict]) -> dict | None:
    """What `make rollback` restores by default: the last release that passed before the live one
    and renders differently from it (None: there is none)."""
    live = current(records)
    earlier = [r for r in passed(records)
               if r is not live and (live is None or r["manifest_sha256"] != live["manifest_sha256"])]
    return earlier[-1] if earlier else None


def to_prune(records: list[dict], keep: int = KEEP) -> list[int]:
    """Release numbers whose files go: all but the newest `keep`; the live one and the one
    `make rollback` would restore always stay (a run of failed deploys, each with its rollback
    entry, would otherwise push that one out of the newest ten)."""
    stay = {r["release"] for r in (current(records), before_live(records)) if r is not None}
    newest = {r["release"] for r in sorted(records, key=lambda r: r["release"])[-keep:]}
    return [r["release"] for r in records if r["release"] not in newest | stay]


def unused(present: list[str], used: set[str]) -> list[str]:
    """Venvs or checkpoints on the host that no kept release uses."""
    return sorted(p for p in present if p not in used)
