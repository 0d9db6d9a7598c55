"""What one gate run is given besides its spec, in three parts: where its commands run (GateHost),
the server it measures (GateServer), and how its levels run (GateOptions). runner.py and
bench_serving.py take these; the deploy builds them from the release's layout (host/gate.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

Execute = Callable[[str, float], "tuple[int, str, str]"]     # (command, timeout_s) -> (rc, stdout, stderr)
Upload = Callable[[str, str], object]                          # (local path, remote path) -> False on failure

DEFAULT_CLIENT_DIR = "/opt/dsv4deploy/gate"      # root-owned 0700: nobody else can plant the client


@dataclass(frozen=True)
class GateHost:
    """The host the gate runs on: EXECUTE runs one shell command there, UPLOAD puts the built-in
    client into CLIENT_DIR, HOST_PYTHON (stdlib only) runs it, as RUN_AS (the unprivileged gate
    user; None: as the connecting user, in tests)."""

    execute: Execute
    upload: Upload | None = None
    run_as: str | None = None
    host_python: str = "python3"
    client_dir: str = DEFAULT_CLIENT_DIR
    confined: bool = False      # bench_serving may reach only the server (bench_serving.no_egress): needs systemd


@dataclass(frozen=True)
class GateServer:
    """The server measured: where it answers, the model folder it serves (bench_serving's
    tokenizer), its venv's python (bench_serving, and the probe for it), and its API key file
    (read on the host, never sent as an argument)."""

    base_url: str
    model_path: str
    venv_python: str
    api_key_file: str | None = None


@dataclass(frozen=True)
class GateOptions:
    """How the levels run. RUNNER: None = the spec's; "auto" | "builtin" | "bench_serving". ORDER:
    "desc" (highest concurrency first: fails fast) or "asis" (the profile's). FAIL_FAST: stop at
    the first failing level (the rest "not run"). EARLY_STOP: stop a level that cannot reach its
    floor. EARLY_PASS: let a level clearly above its floor stop early (spec.early_pass_margin);
    False runs every level to its end (`--full`)."""

    runner: str | None = None
    order: str = "desc"
    fail_fast: bool = True
    early_stop: bool = True
    early_pass: bool = True
