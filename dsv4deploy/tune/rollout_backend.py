"""The tune search measured by the rollout itself: every candidate is deployed as a release.

A candidate becomes a profile file (it `extends` the base, holds its overrides, and a gate of
exactly the level to measure), deployed with the same `pyinfra deploy/serve.py` an operator runs:
a release record per candidate (`make history` shows the run), a restart only when the rendered
files differ, health, identity, the gate's client and its early stop. A candidate whose gate
fails is rolled back by the rollout like any release, so the host never keeps serving a worse one.
The measurement is read from the gate's own report (reports/<host>/<release>-<profile>/gate.json).

A candidate is scored where users reach it, at the objective's concurrency: the server's port, or
a replica set's gateway. A set that started together was gated through its gateway by the deploy;
a set the rollout rolled was gated one replica at a time (each alone on its port, the weakest is
the release's figure), so it is measured again through the gateway (`dsv4deploy bench`: the
tuner holds the host, no one else is on it) and the replicas' own gates are kept beside the score.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Callable

import yaml

from dsv4deploy.cli.settings import PROFILES_VAR, Settings
from dsv4deploy.profile.load import Profile
from dsv4deploy.tune.candidates import Candidate
from dsv4deploy.tune.knobs import KNOBS
from dsv4deploy.tune.objective import Level, Measurement, Method

REPORT_LINE = re.compile(r"gate report: (\S+)")
DEPLOYED = re.compile(r"release (\d{4}) deployed")
REPLICA_REPORT = re.compile(r"-replica-(\d+)\Z")          # a replica's own gate (host/gate.py gate_part)
OUT_OF_MEMORY = re.compile(r"out of (GPU )?memory", re.IGNORECASE)

# (inventory, profile name, profiles dir, extra pyinfra args) -> (exit status, combined output)
Runner = Callable[[str, str, Path, list[str]], tuple[int, str]]


def run_pyinfra(settings: Settings, inventory: str, profile: str, profiles: Path, extra: list[str]) -> tuple[int, str]:
    """`pyinfra -y INVENTORY deploy/serve.py --data profile=NAME` in the checkout, with the
    candidates' folder as its profiles (the inventory builds its settings from the environment)."""
    pyinfra = str(Path(sys.executable).with_name("pyinfra"))
    argv = [pyinfra, "-y", inventory, "deploy/serve.py", "--data", f"profile={profile}", *extra]
    out = subprocess.run(argv, cwd=settings.checkout, capture_output=True, text=True,
                         env={**settings.environ, PROFILES_VAR: str(profiles)})
    return out.returncode, out.stdout + out.stderr


def run_bench(settings: Settings, inventory: str, profile: str, profiles: Path, extra: list[str]) -> tuple[int, str]:
    """`dsv4deploy bench NAME --inventory INVENTORY`: the profile's gate against what serves now,
    at its endpoint (a set's gateway), with the candidates' folder as its profiles."""
    argv = [sys.executable, "-m", "dsv4deploy", "bench", profile, "--inventory", inventory, *extra]
    out = subprocess.run(argv, cwd=settings.checkout, capture_output=True, text=True,
                         env={**settings.environ, PROFILES_VAR: str(profiles)})
    return out.returncode, out.stdout + out.stderr


def candidate_name(base: str, candidate: Candidate, level: Level) -> str:
    return f"{base}-tune-{candidate.id}-l{level.index}"


def candidate_document(base: Profile, candidate: Candidate, level: Level) -> dict:
    """The profile a candidate is deployed as: the base, the overrides, one gate level."""
    doc: dict = {"extends": base.name,
                 "description": f"tune candidate {candidate.id} of {base.name} (level {level.index})"}
    for name, value in candidate.overrides.items():
        KNOBS[name].apply(doc, value)
    gate_level = {"concurrency": level.concurrency, "num_prompts": level.num_prompts,
                  "input_len": level.input_len, "output_len": level.output_len}
    if level.floor is not None:
        gate_level["min_output_throughput"] = level.floor
    doc["gate"] = {"levels": [gate_level]}
    return doc


def measurement_from_report(report: dict, concurrency: int, release: int | None) -> Measurement:
    """The gate's report (gate.json) -> the level's Measurement; through a gateway, with the
    requests each replica served."""
    levels = [lv for lv in report["result"]["levels"] if lv["concurrency"] == concurrency]
    if not levels:
        return Measurement(output_throughput=0.0, error=f"the gate ran no level at C={concurrency}",
                           release=release)
    lv = levels[0]
    early = lv.get("early_stop") or {}
    split = [p.get("requests") for p in report["result"].get("replicas") or []]
    return Measurement(output_throughput=float(lv.get("output_throughput") or 0.0),
                       p99_ttft_ms=(lv.get("ttft_ms") or {}).get("p99"),
                       p99_tpot_ms=(lv.get("tpot_ms") or {}).get("p99"),
                       completed=int(lv.get("completed") or 0), failed=int(lv.get("failed") or 0),
                       passed_early=lv.get("status") == "ok" and early.get("rule") == "pass",
                       num_prompts=int(lv.get("num_prompts") or 0),
                       cannot_reach=lv.get("status") == "early_stop" and early.get("rule") != "pass",
                       gate_passed=bool(report.get("passed")), release=release,
                       scope=f"through the gateway ({len(split)} replicas)" if split else "the server",
                       requests_per_replica=split)


def replica_gates(reports: dict[int, dict], concurrency: int) -> list[dict]:
    """A rolled set's gates, one replica each alone on its port: {replica, output_throughput, passed}."""
    out = []
    for index, doc in sorted(reports.items()):
        m = measurement_from_report(doc, concurrency, None)
        out.append({"replica": index, "output_throughput": m.output_throughput, "passed": bool(doc.get("passed"))})
    return out


def release_of(report: str) -> int | None:
    """The release a deploy's report folder (reports/<host>/NNNN-<profile>[-replica-N]) belongs to."""
    head = Path(report).name[:4]
    return int(head) if head.isdigit() else None


def why_failed(out: str) -> str:
    """The rollout's own words for a failure: its "failed"/"refused" line and the one after."""
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        if re.search(r"\bfailed\b|refused", line) and "Grand total" not in line:
            return " ".join(lines[i:i + 2])[:400]
    return " ".join(lines[-3:])[-300:]


def _last_line(pattern: re.Pattern, text: str) -> str | None:
    found = pattern.findall(text)
    return found[-1] if found else None


class RolloutBackend:
    """Backend whose measure/settle run the rollout (see the module docstring)."""

    def __init__(self, inventory: str, base: Profile, method: Method, settings: Settings,
                 runner: Runner | None = None, start_release: int | None = None, bench: Runner | None = None):
        self.inventory, self.base, self.method, self.settings = inventory, base, method, settings
        self.runner = runner or partial(run_pyinfra, settings)
        self.bench = bench or partial(run_bench, settings)
        self.start_release = start_release
        self._dir = Path(tempfile.mkdtemp(prefix="dsv4deploy-tune-"))
        for path in settings.profiles.glob("*.yaml"):
            shutil.copyfile(path, self._dir / path.name)
        self.log: list[str] = []

    def measure(self, candidate: Candidate, level: Level) -> Measurement:
        name = candidate_name(self.base.name, candidate, level)
        (self._dir / f"{name}.yaml").write_text(yaml.safe_dump(candidate_document(self.base, candidate, level),
                                                               sort_keys=False))
        rc, out = self.runner(self.inventory, name, self._dir, [])
        self.log.append(out)
        reports = REPORT_LINE.findall(out)
        replica_of = {r: REPLICA_REPORT.search(Path(r).name) for r in reports}
        own = [r for r in reports if not replica_of[r]]
        replicas = {int(found.group(1)): doc for r, found in replica_of.items()
                    if found and (doc := self._read(r)) is not None}
        number = release_of(reports[-1]) if reports else None
        gates = replica_gates(replicas, level.concurrency)
        if own and (doc := self._read(own[-1])) is not None:        # the server, or a set through its gateway
            m = measurement_from_report(doc, level.concurrency, number)
        elif replicas and rc == 0:       # rolled: every replica passed alone; the set is scored as users reach it
            m = self._through_endpoint(name, level, number)
        elif replicas:                   # the roll stopped at a replica's gate: that gate is the verdict
            index = max(replicas)
            m = replace(measurement_from_report(replicas[index], level.concurrency, number),
                        scope=f"replica {index} alone (the roll stopped at its gate)")
        else:
            m = Measurement(output_throughput=0.0, error=f"no gate ran (exit {rc}): {why_failed(out)}",
                            release=number, out_of_memory=bool(OUT_OF_MEMORY.search(out)))
        return replace(m, per_replica=gates)

    def _read(self, report: str) -> dict | None:
        path = self.settings.checkout / report / "gate.json"      # as host/gate.py shows it
        return json.loads(path.read_text()) if path.is_file() else None

    def _through_endpoint(self, name: str, level: Level, release: int | None) -> Measurement:
        """The candidate's gate level where users reach the set (its gateway), now that it serves."""
        rc, out = self.bench(self.inventory, name, self._dir, [])
        self.log.append(out)
        report = _last_line(REPORT_LINE, out)
        doc = self._read(report) if report else None
        if doc is None:
            return Measurement(output_throughput=0.0, release=release,
                               error=f"the set rolled, but no gate ran through its gateway (exit {rc}): {why_failed(out)}")
        return measurement_from_report(doc, level.concurrency, release)

    def settle(self, chosen: Candidate | None, tuned_profile: str | None) -> str:
        """Deploy the tuned profile (full gate), or restore the release that served at the start."""
        if chosen is not None and tuned_profile:
            rc, out = self.runner(self.inventory, tuned_profile, self.settings.profiles, [])
            self.log.append(out)
            release = _last_line(DEPLOYED, out)
            if rc == 0 and release:
                return f"release {release} ({tuned_profile}) is serving: it passed the full gate"
        if self.start_release is None:
            return "no starting release was recorded: the host serves what the last deploy left"
        argv = [str(Path(sys.executable).with_name("pyinfra")), "-y", self.inventory, "deploy/rollback.py",
                "--data", f"to={self.start_release}"]
        out = subprocess.run(argv, cwd=self.settings.checkout, capture_output=True, text=True)
        self.log.append(out.stdout + out.stderr)
        if out.returncode == 0:
            return f"release {self.start_release:04d} (the one serving at the start) is serving again"
        return f"could not restore release {self.start_release:04d}: see `make history`"

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)
