"""`python -m dsv4deploy.preflight gpus|nccl`: check a GPU host against a profile.

    gpus --profile P [--json] [--expect-compute-cap X] [--min-driver-branch N] [--input FILE]
    nccl --profile P [--compare-presets] [--timeout S] [--sizes ...] [--nranks N] [--json]
         [--groups 0,1,2,3:4,5,6,7] [--no-alone] [--env-file PATH] [--python PATH]
         [--dtype bfloat16|float32] [--nccl-debug] [--hang-rank R] [--hang-group G] [--dry-run]

A profile with `replicas:` is probed as its replicas run: every replica's GPU set at once, then
each alone (`--groups` names other sets; `--nranks N` probes one group of N instead).

Exit codes: 0 the host passes, 1 it does not (or the probe failed), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from dsv4deploy.profile.errors import EXIT_BAD_INPUT, EXIT_FAILED, ProfileError
from dsv4deploy.sglang.flags import unit_environment
from dsv4deploy.preflight import gpus as G
from dsv4deploy.preflight import nccl_probe as P
from dsv4deploy.preflight import nccl_report as R

PROBE_SCRIPT = Path(P.__file__).resolve()


def _err(text: str) -> None:
    print(text, file=sys.stderr)


def _load(name: str, profiles: Path):
    from dsv4deploy.profile.load import load_profile

    return load_profile(name, profiles)


# --- pieces the deploy calls -------------------------------------------------------------------

def profile_nccl_env(data: dict, preset: str | None = None) -> dict[str, str]:
    """What the profile's NCCL env file holds (or would, with `preset` instead of its own)."""
    from dsv4deploy.profile.network import single_host
    from dsv4deploy.render.nccl import nccl_environment

    return nccl_environment(preset or data["nccl"]["preset"], data["nccl"].get("overrides"),
                            one_host=single_host(data))


def profile_groups(data: dict) -> list[list[int]] | None:
    """The GPU sets of the profile's replicas (probed at once, as they run), or None."""
    from dsv4deploy.profile.replicas import plan

    replicas = plan(data)
    return [list(r.gpus) for r in replicas.replicas] if replicas else None


def groups_text(groups: list[list[int]]) -> str:
    """[[0, 1, 2, 3], [4, 5, 6, 7]] -> '0,1,2,3:4,5,6,7' (the probe's --groups)."""
    return ":".join(",".join(map(str, g)) for g in groups)


def probe_argv(data: dict, *, script: str, python: str | None = None, env_file: str | None = None,
               timeout_s: float = P.DEFAULT_TIMEOUT_S, nranks: int | None = None,
               sizes: list[int] | None = None, groups: list[list[int]] | None = None) -> list[str]:
    """argv to run the probe on a host over SSH with the release's SGLang python:
    `script` is where nccl_probe.py was uploaded, `env_file` the rendered NCCL env file
    (default: the profile's NCCL settings passed with --nccl). Prints the JSON document.
    The launcher (stdlib only) runs isolated (-I); its ranks start from what systemd gives the
    unit's server (--as-service), plus the unit's environment, not the SSH login's.
    A profile with replicas is probed as `--groups` of its GPU sets (all at once, then each
    alone), unless `nranks` or other `groups` are given."""
    from dsv4deploy.render.layout import Layout

    server = data["server"]
    python = python or Layout.of(data).python
    argv = [python, "-I", script, "launch", "--as-service", "--json", "--timeout", f"{timeout_s:g}"]
    groups = groups or (None if nranks else profile_groups(data))
    if groups:
        argv += ["--groups", groups_text(groups)]
    else:
        argv += ["--nranks", str(nranks or int(server["tp_size"]) // int(server.get("nnodes") or 1))]
    if env_file:
        argv += ["--env-file", env_file]
    else:
        argv += [a for k, v in profile_nccl_env(data).items() for a in ("--nccl", f"{k}={v}")]
    argv += [a for k, v in unit_environment(data).items() for a in ("--env", f"{k}={v}")]
    if sizes:
        argv += ["--sizes", *map(str, sizes)]
    return argv


# --- gpus --------------------------------------------------------------------------------------

def _run_nvidia_smi(binary: str, args: list[str]) -> str:
    exe = shutil.which(binary) or (binary if os.path.exists(binary) else None)
    if not exe:
        raise G.NvidiaSmiError(f"{binary} not found on PATH: no NVIDIA driver on this host?")
    try:
        proc = subprocess.run([exe, *args], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise G.NvidiaSmiError(f"{binary} did not answer within 30 s (driver hung?)") from None
    text = proc.stdout + proc.stderr
    if proc.returncode != 0:
        G.parse_query(text)   # raises with the known meaning, if any
        raise G.NvidiaSmiError(f"{binary} exited with {proc.returncode}: {text.strip()[:300]}")
    return proc.stdout


def cmd_gpus(args) -> int:
    expect = None
    if args.profile:
        try:
            profile = _load(args.profile, args.settings.profiles)
            expect = G.profile_expectations(profile.data, compute_cap=args.expect_compute_cap,
                                            min_driver_branch=args.min_driver_branch)
        except ProfileError as exc:
            _err(str(exc))
            return EXIT_BAD_INPUT
        if args.tp_size:
            expect["tp_size"] = args.tp_size
    try:
        if args.input:
            text = sys.stdin.read() if args.input == "-" else Path(args.input).read_text()
            source = args.input
        else:
            query = G.query_args()
            text = _run_nvidia_smi(args.nvidia_smi, query[1:])
            source = " ".join(query)
        gpus = G.parse_query(text)
    except OSError as exc:
        _err(f"preflight gpus: {exc}")
        return EXIT_BAD_INPUT
    except G.NvidiaSmiError as exc:
        problems = [str(exc)]
        if args.json:
            print(json.dumps({"profile": args.profile, "ok": False, "gpus": [],
                              "expectations": expect, "problems": problems}, indent=2))
        else:
            _err(f"REFUSED: {exc}")
        return EXIT_FAILED
    problems = G.check_gpus(gpus, **expect) if expect else []
    ok = not problems
    if args.json:
        print(json.dumps({"profile": args.profile, "ok": ok, "source": source,
                          "gpus": [g.as_dict() for g in gpus], "expectations": expect,
                          "problems": problems}, indent=2))
    else:
        print(G.format_table(gpus), end="")
        if expect:
            print(f"expected: {expect['tp_size']} GPUs of compute capability {expect['compute_cap']}, "
                  f">= {expect['min_free_mib']:,} MiB free each, driver branch >= "
                  f"{expect['min_driver_branch']}")
        for p in problems:
            print(f"REFUSED: {p}")
        print(f"{args.profile or 'inventory'}: {'OK' if ok else 'REFUSED'} ({len(gpus)} GPUs)")
    return 0 if ok else EXIT_FAILED


# --- nccl --------------------------------------------------------------------------------------

def visible_gpus(nvidia_smi: str, cvd: str | None) -> int | None:
    """GPUs the ranks will see (CVD: the CUDA_VISIBLE_DEVICES they inherit, applied), None if
    nvidia-smi is missing."""
    try:
        count = len(G.parse_query(_run_nvidia_smi(nvidia_smi, G.query_args()[1:])))
    except G.NvidiaSmiError:
        return None
    if cvd is not None:
        count = min(count, len([x for x in cvd.split(",") if x.strip()]))
    return count


def cmd_nccl(args) -> int:
    from dsv4deploy.render.layout import Layout
    from dsv4deploy.render.nccl import PRESETS

    data = None
    try:
        if args.profile:
            data = _load(args.profile, args.settings.profiles).data
        elif not (args.env_file and (args.nranks or args.groups)):
            raise ValueError("give --profile (or --env-file with --nranks or --groups)")
        if args.compare_presets and args.env_file:
            raise ValueError("--compare-presets uses the presets, not --env-file: give one of them")
        sizes = P.parse_sizes(args.sizes) if args.sizes else list(P.DEFAULT_SIZES)
        groups = P.parse_groups(args.groups) if args.groups is not None else None
        if groups is None and data is not None and not args.nranks:
            groups = profile_groups(data)
        nranks = args.nranks
        if nranks is None and groups is None:
            nranks = int(data["server"]["tp_size"]) // int(data["server"].get("nnodes") or 1)
        P.check_layout(nranks, groups, args.hang_group, args.hang_rank)
        if args.timeout <= 0:
            raise ValueError("--nranks and --timeout must be positive")
        env_file = None
        if args.env_file:
            env_file = P.read_env_file(Path(args.env_file).read_text())
    except ProfileError as exc:
        _err(str(exc))
        return EXIT_BAD_INPUT
    except (OSError, ValueError) as exc:
        _err(f"preflight nccl: {exc}")
        return EXIT_BAD_INPUT

    python = args.python
    if not python and data is not None and Path(Layout.of(data).python).exists():
        python = Layout.of(data).python
    if not python:
        python = sys.executable
        if data is not None:
            _err(f"note: {Layout.of(data).python} does not exist here; ranks run with {python}")
    if not args.dry_run:
        msg = _missing_gpus(args, nranks, groups)
        if msg:
            if args.json:
                print(json.dumps({"profile": args.profile, "ok": False, "error": msg}, indent=2))
            else:
                _err(f"FAILED: {msg}")
            return EXIT_FAILED

    P.exit_on_term()
    unit_env = unit_environment(data) if data else {}
    settings = P.ProbeSettings(base_env=dict(args.settings.environ), unit_env=unit_env, python=python,
                               sizes=tuple(sizes), dtype=args.dtype, timeout_s=args.timeout, dry_run=args.dry_run,
                               nccl_debug=args.nccl_debug, keep_inherited=P.KEEP_INHERITED + tuple(args.keep_env))

    def probe(nccl_env: dict, label: str) -> dict:
        if groups is None:
            return P.launch(nranks, nccl_env, settings, label, hang_rank=args.hang_rank)
        return P.launch_groups(groups, nccl_env, settings, label, hang_group=args.hang_group,
                               hang_rank=args.hang_rank, alone=not args.no_alone)

    show = P.format_result if groups is None else R.format_groups
    if args.compare_presets:
        runs = []
        for preset in PRESETS:
            if not args.json:
                _err(f"probing preset {preset} ...")
            runs.append(probe(profile_nccl_env(data, preset), preset))
        own = data["nccl"]["preset"]
        ok = next(r["ok"] for r in runs if r["label"] == own)
        summary = R.format_compare(runs) if groups is None else "\n".join(map(show, runs))
        doc = {"profile": args.profile, "preset": own, "ok": ok, **({"groups": groups} if groups else {}),
               "runs": runs, "summary": summary}
        if args.json:
            print(json.dumps(doc, indent=2))
        else:
            print(doc["summary"], end="")
            print(f"profile preset {own}: {'OK' if ok else 'FAILED'}")
        return 0 if ok else EXIT_FAILED

    if env_file is not None:
        label, nccl_env = Path(args.env_file).name, env_file
    else:
        label, nccl_env = data["nccl"]["preset"], profile_nccl_env(data)
    res = probe(nccl_env, label)
    res["profile"] = args.profile
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print(show(res), end="")
    return 0 if res["ok"] else EXIT_FAILED


def _missing_gpus(args, nranks: int | None, groups: list[list[int]] | None) -> str | None:
    """Why the ranks cannot get their GPUs here, or None (also when nvidia-smi is missing)."""
    if groups is None:
        visible = visible_gpus(args.nvidia_smi, args.settings.environ.get("CUDA_VISIBLE_DEVICES"))
        if visible is not None and visible < nranks:
            return (f"{nranks} ranks need {nranks} GPUs; {visible} visible"
                    + (" (use --nranks to probe fewer)" if not args.nranks else ""))
        return None
    # GPU sets are nvidia-smi numbers: each group's CUDA_VISIBLE_DEVICES replaces an inherited one
    try:
        count = len(G.parse_query(_run_nvidia_smi(args.nvidia_smi, G.query_args()[1:])))
    except G.NvidiaSmiError:
        return None
    missing = sorted(x for g in groups for x in g if x >= count)
    if missing:
        return (f"GPU {', '.join(map(str, missing))} of --groups {groups_text(groups)} "
                f"{'does' if len(missing) == 1 else 'do'} not exist here: nvidia-smi shows GPUs 0-{count - 1}")
    return None


# --- parser ------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dsv4deploy.preflight",
                                     description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("gpus", help="GPU inventory from nvidia-smi, checked against a profile")
    p.add_argument("--profile", help="profile name (without it: inventory only)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--expect-compute-cap", help="expected compute capability (default: the "
                   "profile's catalog GPU, e.g. 12.0; an H200 is 9.0)")
    p.add_argument("--min-driver-branch", type=int, help="default: max(GPU minimum, profile driver.branch)")
    p.add_argument("--tp-size", type=int, help="GPUs needed (default: the profile's tp_size/nnodes)")
    p.add_argument("--input", help="read nvidia-smi query output from FILE ('-': stdin) instead")
    p.add_argument("--nvidia-smi", default="nvidia-smi", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_gpus)

    p = sub.add_parser("nccl", help="NCCL all-reduce probe with the profile's NCCL environment")
    p.add_argument("--profile", help="profile name")
    p.add_argument("--compare-presets", action="store_true", help="run every preset, side by side")
    p.add_argument("--timeout", type=float, default=P.DEFAULT_TIMEOUT_S,
                   help=f"hard limit per run in seconds (default {P.DEFAULT_TIMEOUT_S:g})")
    p.add_argument("--sizes", nargs="+", help="e.g. 8K 1M 64M (default 8K..64M)")
    p.add_argument("--nranks", type=int, help="ranks of one group (default: the profile's tp_size)")
    p.add_argument("--groups", help="GPU sets probed at once, as replicas run, e.g. 0,1,2,3:4,5,6,7 or "
                   "0-3:4-7 (nvidia-smi numbers; one rank per GPU; default: the profile's replicas)")
    p.add_argument("--no-alone", action="store_true",
                   help="with groups: skip each group's run alone (the comparison)")
    p.add_argument("--env-file", help="a rendered NCCL env file, read as systemd reads it")
    p.add_argument("--python", help="python for the ranks (default: the profile's SGLang venv "
                   "if present here, else this python)")
    p.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--nccl-debug", action="store_true",
                   help="add NCCL_DEBUG=INFO and report which transports NCCL chose")
    p.add_argument("--hang-rank", type=int, help="debug: this rank never joins (shows the timeout path)")
    p.add_argument("--hang-group", type=int, help="debug: with groups, the group of --hang-rank (default 0)")
    p.add_argument("--dry-run", action="store_true", help="ranks report their environment; no torch, no GPU")
    p.add_argument("--keep-env", action="append", default=[], metavar="NAME",
                   help="keep this inherited NCCL_* variable (NCCL_NVLS_ENABLE always is; the "
                        "others are dropped, as a systemd unit does not inherit them)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--nvidia-smi", default="nvidia-smi", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_nccl)
    return parser


def main(argv: list[str] | None = None) -> int:
    from dsv4deploy.cli.main import run
    return run(build_parser(), argv)
