"""Both gate runners against one twin server: the built-in client and SGLang's bench_serving, each
run on the twin as a deploy runs it (over SSH, as the gate account; bench_serving from the
server's venv, with the checkpoint's tokenizer), every level of the profile's gate to its end, and
how far apart they came out; and one runner's gate with its early pass against the same gate run
in full. Shared by bench/gate_runners.py (the figures, every level of the profile's gate) and
tests/test_gate_runners_twin.py (the agreement within 1% on shorter levels).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

from ct200twin.faultlab.reading import releases

from dsv4deploy.gate import run_gate
from dsv4deploy.gate.runner import GateOutcome
from dsv4deploy.gate.inputs import GateHost, GateOptions, GateServer
from dsv4deploy.gate.result import GateResult, LevelResult
from dsv4deploy.gate.spec import GateSpec
from dsv4deploy.profile.load import load_profile
from dsv4deploy.render.layout import GATE_USER, RELEASES, Layout

RUNNERS = ("builtin", "bench_serving")


def twin_gate_host(twin) -> GateHost:
    """The gate's commands on TWIN (a SimHost) over its SSH, the client run as the gate account."""

    def execute(command: str, timeout_s: float) -> tuple[int, str, str]:
        proc = twin.run(command, check=False, timeout=timeout_s)
        return proc.returncode, proc.stdout, proc.stderr

    def upload(local_path: str, remote_path: str) -> bool:
        twin.write_file(remote_path, Path(local_path).read_text())
        return True

    return GateHost(execute, upload=upload, run_as=GATE_USER)


def server_of(data: dict) -> GateServer:
    """The server a deploy of the profile DATA serves (its venv, checkpoint, key)."""
    layout = Layout.of(data)
    return GateServer(f"http://127.0.0.1:{data['server']['port']}", layout.model_dir, layout.python,
                      layout.api_key_file if data["server"].get("api_key") else None)


def deployed_server(profile: str, profiles_dir: Path) -> tuple[GateSpec, GateServer]:
    """The gate spec of PROFILE and the server a deploy of it serves."""
    data = load_profile(profile, profiles_dir).data
    return GateSpec.from_profile(data), server_of(data)


def served_server(twin) -> GateServer | None:
    """The server TWIN's last deployed release serves, from the profile it keeps; None: none is."""
    deployed = [r for r in releases(twin) if r["status"] == "deployed"]
    if not deployed:
        return None
    kept = twin.run(f"cat {RELEASES}/{deployed[-1]['release']:04d}/profile.json", check=False).stdout
    return server_of(json.loads(kept)["data"]) if kept.strip() else None


def run_both(twin, spec: GateSpec, server: GateServer, log=None) -> dict[str, GateResult]:
    """{runner: its result} of each runner's full gate, one after the other, on the same server."""
    host = twin_gate_host(twin)
    out = {}
    for runner in RUNNERS:    # every level to its end, in the profile's order: the same requests for both
        options = GateOptions(runner=runner, order="asis", fail_fast=False, early_stop=False, early_pass=False)
        out[runner] = run_gate(spec, host, server, options, log=log).result
    return out


@dataclass(frozen=True)
class Agreement:
    """One level measured by both runners."""

    builtin: LevelResult
    bench_serving: LevelResult

    @property
    def label(self) -> str:
        return self.builtin.label

    @property
    def throughput_gap(self) -> float:
        """bench_serving's output tok/s relative to the built-in client's (0.01 = 1% higher)."""
        return self.bench_serving.output_throughput / self.builtin.output_throughput - 1

    def tokens(self) -> dict[str, tuple[int, int]]:
        """Per count, (built-in, bench_serving): completed requests, input and output tokens."""
        return {k: (getattr(self.builtin, k), getattr(self.bench_serving, k))
                for k in ("completed", "total_input_tokens", "total_output_tokens")}

    def row(self) -> str:
        b, s = self.builtin, self.bench_serving
        retok = s.extra.get("total_output_tokens_retokenized")
        return (f"| {self.label} | {b.completed}/{s.completed} | {b.total_input_tokens}/{s.total_input_tokens} | "
                f"{b.total_output_tokens}/{s.total_output_tokens} ({retok} retokenized) | "
                f"{b.output_throughput:.2f} | {s.output_throughput:.2f} | {100 * self.throughput_gap:+.2f}% | "
                f"{b.duration_s:.2f} / {s.duration_s:.2f} |")


HEADER = ("| level | completed (built-in/bench_serving) | input tokens | output tokens | built-in tok/s | "
          "bench_serving tok/s | gap | timed part, s |\n|---|---|---|---|---|---|---|---|")


def agreements(results: dict[str, GateResult]) -> list[Agreement]:
    """The levels both runners measured, paired by concurrency."""
    theirs = {lv.concurrency: lv for lv in results["bench_serving"].levels}
    return [Agreement(lv, theirs[lv.concurrency]) for lv in results["builtin"].levels if lv.concurrency in theirs]


def early_and_full(twin, spec: GateSpec, server: GateServer, runner: str, log=None) -> dict[str, tuple[float, GateOutcome]]:
    """RUNNER's gate as a deploy runs it, in full (early_pass off) and with its early pass, one after
    the other on the same server: {"full" | "early": (wall s as the control node timed it, outcome)}."""
    host = twin_gate_host(twin)
    out = {}
    for name, early in (("full", False), ("early", True)):
        t0 = time.monotonic()
        outcome = run_gate(spec, host, server, GateOptions(runner=runner, early_pass=early), log=log)
        out[name] = (time.monotonic() - t0, outcome)
    return out


EARLY_HEADER = ("| runner | level | full: tok/s over | early pass: tok/s over | gap | level s, full / early |\n"
                "|---|---|---|---|---|---|")


def early_rows(runner: str, runs: dict[str, tuple[float, GateOutcome]]) -> list[str]:
    """One Markdown row per level of early_and_full's RUNS: each figure with what it rests on."""
    full, early = runs["full"][1].result, runs["early"][1].result
    rows = []
    for lv in sorted(full.levels, key=lambda x: x.concurrency):
        other = early.level(lv.concurrency)
        if other is None or other.status == "skipped" or lv.status == "skipped":
            rows.append(f"| {runner} | {lv.label} | {lv.status} | {other.status if other else 'absent'} | | |")
            continue
        gap = other.output_throughput / lv.output_throughput - 1 if lv.output_throughput else 0.0
        rows.append(f"| {runner} | {lv.label} | {lv.output_throughput:.1f} over {lv.basis()} | "
                    f"{other.output_throughput:.1f} over {other.basis()} | {100 * gap:+.1f}% | "
                    f"{lv.extra.get('wall_s', lv.duration_s):.1f} / {other.extra.get('wall_s', other.duration_s):.1f} |")
    return rows
