"""A twin server on this machine, for tests and benchmarks: ``LocalTwin`` runs
``python -m ct200twin.server.main`` as a subprocess with its own scratch dir (a checkpoint dir
with config.json only, a fake nvidia-smi, the knob file); ``nvfp4_ctx8k_argv`` is the argv the
nvfp4-ctx8k profile renders.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ct200twin.server import args as targs
from ct200twin.server.perf import DSV4_MAX_CONTEXT
from ct200twin.server.resolved import DSV4_ARCH


def nvfp4_ctx8k_argv(model_path: str, port: int = 30000, context_length: int | None = 8192,
                     mem_fraction_static: float = 0.7, tp: int = 4, cuda_graph_max_bs: int = 32) -> list[str]:
    """The argv the nvfp4-ctx8k profile renders (context_length=None: the default ~1M)."""
    argv = ["--model-path", model_path, "--served-model-name", "deepseek-v4-flash", "--tp-size", str(tp),
            "--mem-fraction-static", str(mem_fraction_static), "--cuda-graph-max-bs-decode",
            str(cuda_graph_max_bs), "--moe-runner-backend", "marlin",
            "--host", "127.0.0.1", "--port", str(port), "--enable-metrics"]
    if context_length:
        argv += ["--context-length", str(context_length)]
    return argv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalTwin:
    """A twin server subprocess on 127.0.0.1 with its own scratch dir: a fake checkpoint dir
    (config.json only), a fake ``nvidia-smi`` on PATH (``gpus`` lines of ``gpu_mem_mib``, or
    none at all with ``nvidia_smi=False``) and the knob file.  For tests and benchmarks.

        with LocalTwin(faults={"load_seconds": 0.3}) as t:
            t.wait_ready()
            requests.get(t.url + "/health")
    """

    def __init__(self, argv: list[str] | None = None, faults: dict | None = None, *,
                 gpu_mem_mib: int = 97887, gpus: int = 8, nvidia_smi: bool = True,
                 env: dict[str, str] | None = None, workdir: str | Path | None = None):
        import tempfile

        self.tmp = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="dsv4-twin-"))
        self.model_dir = self.tmp / "DeepSeek-V4-Flash-NVFP4"
        self.model_dir.mkdir(parents=True, exist_ok=True)
        (self.model_dir / "config.json").write_text(json.dumps({
            "architectures": [DSV4_ARCH], "model_type": "deepseek_v4", "max_position_embeddings": DSV4_MAX_CONTEXT,
            "quantization_config": {"quant_method": "fp8", "quant_algo": "MIXED_PRECISION",
                                    "moe_quant_algo": "NVFP4", "group_size": 16, "ignore": []}}))
        self.port = free_port()
        self.argv = argv if argv is not None else nvfp4_ctx8k_argv(str(self.model_dir), self.port)
        self.faults_file = self.tmp / "faults.json"
        self.faults_file.write_text(json.dumps(faults if faults is not None else
                                               {"load_seconds": 0.3, "warmup_seconds": 0.2}))
        bindir = self.tmp / "bin"
        bindir.mkdir(exist_ok=True)
        smi = bindir / "nvidia-smi"
        if nvidia_smi:
            smi.write_text("#!/bin/sh\n" + "".join(f"echo {gpu_mem_mib}\n" for _ in range(gpus)))
            smi.chmod(0o755)
            path = f"{bindir}:{os.environ.get('PATH', '')}"
        else:
            smi.unlink(missing_ok=True)
            path = str(bindir)  # nothing else on PATH: no nvidia-smi anywhere
        self.env = dict(os.environ, PATH=path, DSV4_TWIN_FAULTS=str(self.faults_file), PYTHONUNBUFFERED="1")
        if env:
            self.env.update(env)
        self.log_path = self.tmp / "server.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "LocalTwin":
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "ct200twin.server.main", *self.argv],
                                     env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
                                     cwd=str(Path(__file__).resolve().parent.parent.parent))
        return self

    def output(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def wait_exit(self, timeout: float = 30) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def _get(self, path: str, timeout: float = 5) -> int | None:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except (urllib.error.URLError, ConnectionError, OSError):
            return None

    def wait_status(self, path: str, want: int, timeout: float = 30) -> float:
        """Poll until GET path answers ``want``; returns the time waited."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"twin exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
            if self._get(path) == want:
                return time.monotonic() - t0
            time.sleep(0.05)
        raise TimeoutError(f"{path} did not answer {want} within {timeout}s:\n{self.output()[-3000:]}")

    def wait_ready(self, timeout: float = 30) -> float:
        """/ready where the emulated release has it (0.5.20+), else /health (its 1-token generation)."""
        version = targs.resolve_version(self.env.get(targs.VERSION_ENV))
        return self.wait_status("/ready" if targs.has_ready_endpoint(version) else "/health", 200, timeout)

    def stop(self, timeout: float = 10) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def __enter__(self) -> "LocalTwin":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        import shutil

        shutil.rmtree(self.tmp, ignore_errors=True)
