#!/usr/bin/env python3
"""Measure the SGLang twin client-side and print it next to the campaign's numbers.

    python bench/twin_calibration.py            # full campaign prompt counts (~18 min, rows in parallel)
    python bench/twin_calibration.py --quick    # one wave per row (n = C, ~9 min)
    python bench/twin_calibration.py --url http://127.0.0.1:30000 --concurrency 1,16

Methodology = the campaign's: random 256 in / 256 out (bench_serving random-ids, range ratio 1.0),
streaming /generate, ``--max-concurrency C``, output tok/s = completion tokens / wall duration.
Without ``--url`` it starts one twin server per row (so rows can run in parallel) with the
campaign's reference argv (TP4, 0.70, decode graphs bs 32, marlin; ``--context-length 8192``
for the last row; its ``--num-continuous-decode-steps 4`` is left out: SGLang never reads it),
and a fake nvidia-smi when none is on PATH.
The "model" column is ct200twin.server.perf.simulate_bench (virtual time, same scheduler code).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ct200twin.server import perf  # noqa: E402
from ct200twin.server.main import free_port, nvfp4_ctx8k_argv  # noqa: E402

ROWS = [  # (label, context or None, C, campaign n, campaign tok/s, shown as)
    ("default context (~1M)", None, 1, 8, 14.0, "~14"),
    ("default context (~1M)", None, 8, 32, 28.0, "~28"),
    ("default context (~1M)", None, 16, 48, 30.0, "~30"),
    ("default context (~1M)", None, 64, 128, 29.7, "29.7"),
    ("--context-length 8192", 8192, 64, 128, 531.7, "531.7"),
]


def reference_argv(port: int, model_dir: str, context: int | None) -> list[str]:
    """The argv the nvfp4-ctx8k profile renders (context None: SGLang's default ~1M)."""
    return nvfp4_ctx8k_argv(model_dir, port, context_length=context)


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    import urllib.request

    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"twin server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"twin server at {url} not ready after {timeout}s")


class Twins:
    """Starts twin servers in a scratch dir (fake checkpoint dir, knob file, nvidia-smi shim)."""

    def __init__(self, fake_smi: bool):
        self.tmp = Path(tempfile.mkdtemp(prefix="twin-bench-"))
        self.model = self.tmp / "DeepSeek-V4-Flash-NVFP4"
        self.model.mkdir()
        (self.model / "config.json").write_text(json.dumps({
            "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
            "max_position_embeddings": 1048576,
            "quantization_config": {"quant_method": "fp8", "quant_algo": "MIXED_PRECISION",
                                    "moe_quant_algo": "NVFP4", "group_size": 16}}))
        (self.tmp / "faults.json").write_text(json.dumps({"load_seconds": 0.5, "warmup_seconds": 0.2}))
        self.env = dict(os.environ, DSV4_TWIN_FAULTS=str(self.tmp / "faults.json"))
        if fake_smi or not shutil.which("nvidia-smi"):
            bindir = self.tmp / "bin"
            bindir.mkdir()
            smi = bindir / "nvidia-smi"
            smi.write_text("#!/bin/sh\nfor i in 0 1 2 3 4 5 6 7; do echo 97887; done\n")
            smi.chmod(0o755)
            self.env["PATH"] = f"{bindir}:{self.env.get('PATH', '')}"
        self.procs: list[subprocess.Popen] = []

    def start(self, context: int | None) -> str:
        port = free_port()
        log = open(self.tmp / f"server-{port}.log", "w")
        proc = subprocess.Popen([sys.executable, "-m", "ct200twin.server.main",
                                 *reference_argv(port, str(self.model), context)],
                                env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, proc)
        return url

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)


async def run_rows(rows, urls, quick: bool, input_len: int, output_len: int, api_key: str | None,
                   parallel: bool):
    async def one(row, url):
        label, ctx, c, n, *_ = row
        n = c if quick else n
        t0 = time.time()
        m = await perf.measure_bench(url, c, n, input_len, output_len, api_key=api_key)
        pred = perf.simulate_bench(perf.reference_config(ctx), c, n, input_len, output_len)
        print(f"  done: {label} C={c} n={n}: {m.output_throughput:.2f} tok/s in {time.time() - t0:.0f}s",
              file=sys.stderr, flush=True)
        return m, pred, n

    if parallel:
        return await asyncio.gather(*(one(r, u) for r, u in zip(rows, urls)))
    return [await one(r, u) for r, u in zip(rows, urls)]


def print_table(rows, results, input_len, output_len) -> None:
    print(f"\nTwin calibration, random {input_len} in / {output_len} out, client-side output tok/s")
    hdr = (f"{'configuration':<24} {'C':>3} {'n':>4} {'campaign':>9} {'twin':>8} {'vs campaign':>11} "
           f"{'model':>8} {'twin vs model':>13} {'ok/fail':>8}")
    print(hdr)
    print("-" * len(hdr))
    for row, (m, pred, n) in zip(rows, results):
        label, ctx, c, _n, campaign, shown = row
        vs_c = 100 * (m.output_throughput - campaign) / campaign
        vs_m = 100 * (m.output_throughput - pred.output_throughput) / pred.output_throughput
        vs_c_txt = "-" if vs_c != vs_c else f"{vs_c:+.1f}%"  # NaN: no campaign number for this row
        print(f"{label:<24} {c:>3} {n:>4} {shown:>9} {m.output_throughput:>8.2f} {vs_c_txt:>11} "
              f"{pred.output_throughput:>8.2f} {vs_m:>+12.1f}% {m.completed:>4}/{m.failed:<3}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="n = C (one wave per row) instead of the campaign's counts")
    ap.add_argument("--url", help="measure a running server instead of starting twins")
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"))
    ap.add_argument("--concurrency", help="with --url: comma-separated C values (default 1,8,16,64)")
    ap.add_argument("--sequential", action="store_true", help="run rows one after another")
    ap.add_argument("--fake-nvidia-smi", action="store_true", help="always use the 8x97887 MiB shim")
    ap.add_argument("--input-len", type=int, default=256)
    ap.add_argument("--output-len", type=int, default=256)
    a = ap.parse_args(argv)
    if a.url:
        import urllib.request

        req = urllib.request.Request(a.url.rstrip("/") + "/server_info",
                                     headers={"Authorization": f"Bearer {a.api_key}"} if a.api_key else {})
        with urllib.request.urlopen(req, timeout=10) as r:
            info = json.load(r)
        ctx = int(info.get("context_length") or perf.DSV4_MAX_CONTEXT)
        cs = [int(x) for x in (a.concurrency or "1,8,16,64").split(",")]
        rows = []
        for c in cs:
            match = [r for r in ROWS if r[2] == c and ((r[1] is None and ctx >= 1048576) or r[1] == ctx)]
            rows.append(match[0] if match else (f"--context-length {ctx}", ctx, c, 2 * c, float("nan"), "-"))
        results = asyncio.run(run_rows(rows, [a.url] * len(rows), a.quick, a.input_len, a.output_len,
                                       a.api_key, parallel=False))
        print_table(rows, results, a.input_len, a.output_len)
        return 0
    twins = Twins(a.fake_nvidia_smi)
    try:
        urls = [twins.start(r[1]) for r in ROWS]
        t0 = time.time()
        results = asyncio.run(run_rows(ROWS, urls, a.quick, a.input_len, a.output_len, None,
                                       parallel=not a.sequential))
        print_table(ROWS, results, a.input_len, a.output_len)
        print(f"(wall time {time.time() - t0:.0f}s; {'one wave per row' if a.quick else 'campaign prompt counts'}; "
              f"{'parallel' if not a.sequential else 'sequential'} rows, one twin server each)")
    finally:
        twins.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
