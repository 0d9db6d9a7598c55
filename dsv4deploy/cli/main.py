"""`dsv4deploy`: validate and render profiles, read release history.

Exit codes: 0 fine, 1 an operation failed, 2 bad input (with a message naming file, line and
key, never a traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from dsv4deploy.cli.settings import Settings
from dsv4deploy.profile.errors import EXIT_BAD_INPUT, EXIT_FAILED, Problem, ProfileError
from dsv4deploy.profile.load import list_profiles, load_profile
from dsv4deploy.profile.validate import Report, validate


def _err(text: str) -> None:
    print(text, file=sys.stderr)


def checked_profile(name: str, settings: Settings) -> Report:
    """Load and validate; raise ProfileError (all errors) when it must not be deployed."""
    report = validate(load_profile(name, settings.profiles))
    if report.errors:
        raise ProfileError(report.problems)
    return report


def budget_table(report: Report) -> Table:
    b = report.budget
    each = " (each replica's GPUs)" if report.profile.data.get("replicas") else ""
    table = Table(title=f"GPU memory budget per GPU: {report.profile.name}{each}", show_lines=False)
    table.add_column("item")
    table.add_column("value", justify="right")
    table.add_column("note")
    rows = [
        ("capacity", f"{b.capacity_gib:.1f} GiB", "nvidia-smi memory.total"),
        ("static (weights + KV)", f"{b.static_gib:.1f} GiB", f"mem_fraction_static {b.fraction}"),
        ("weights", f"{b.weights_gib:.1f} GiB", "checkpoint / TP + replicated"),
        ("KV pool", f"{b.kv_pool_gib:.1f} GiB", f"{b.kv_bytes_per_token:,.0f} B/token"),
        ("KV tokens", f"{b.kv_tokens:,}", f"{b.full_context_requests:.1f} requests of {b.context_length:,}"),
        ("headroom", f"{b.headroom_gib:.1f} GiB", f"capacity - static - CUDA context {b.cuda_context_gib:.1f}"),
        ("  CUDA graphs", f"{b.graph_gib:.1f} GiB", f"{b.allreduce_path} all-reduce in graphs"),
        ("  activations", f"{b.activations_gib:.1f} GiB", "prefill chunk"),
        ("  NCCL buffers", f"{b.nccl_gib:.1f} GiB", "per peer"),
        ("  margin", f"{b.margin_gib:.1f} GiB", ""),
        ("reserve needed", f"{b.reserve_gib:.1f} GiB", b.reserve_source),
        ("verdict", "fits" if b.fits else "OOM at graph capture",
         f"max safe fraction {b.max_safe_text}"),
    ]
    for row in rows:
        table.add_row(*row)
    return table


def replica_table(report: Report) -> Table | None:
    """The replica layout of a profile with `replicas:` (None without): instance, GPUs, port."""
    from dsv4deploy.profile.replicas import plan

    p = plan(report.profile.data)
    if p is None:
        return None
    service = report.profile.data["service"]["name"]
    table = Table(title=f"Replicas behind smg {p.gateway.version} on {p.gateway.host}:{p.gateway.port} "
                        f"({p.gateway.policy}; metrics 127.0.0.1:{p.gateway.metrics_port})")
    for col in ("instance", "GPUs (CUDA_VISIBLE_DEVICES)", "listens on"):
        table.add_column(col)
    for r in p.replicas:
        table.add_row(f"{service}@{r.index}", r.cuda_visible_devices, r.url)
    return table


def _replicas_json(report: Report):
    from dataclasses import asdict

    from dsv4deploy.profile.replicas import plan

    p = plan(report.profile.data)
    return None if p is None else asdict(p)


def host_calibration(host: str | None, settings: Settings) -> dict | None:
    """The calibration SGLang's startup logs made for HOST (reports/<host>/calibration.json;
    None without --host or before its first start); CalibrationError for a bad name or file."""
    from dsv4deploy.profile import calibration

    if host is None:
        return None
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}", host) or ".." in host:
        raise calibration.CalibrationError(f"--host {ascii(host)}: expected an inventory host name "
                                           "(letters, digits, '.', '_', '-')")
    return calibration.read(calibration.path_for(settings.reports, host))


def cmd_validate(args) -> int:
    from dsv4deploy.profile.calibration import CalibrationError

    try:
        measured = host_calibration(args.host, args.settings)
    except CalibrationError as exc:
        _err(str(exc))
        return EXIT_BAD_INPUT
    try:
        report = validate(load_profile(args.profile, args.settings.profiles), measured)
    except ProfileError as exc:
        if args.json:
            print(json.dumps({"profile": args.profile, "ok": False,
                              "problems": [p.as_dict() for p in exc.problems]}, indent=2))
        else:
            _err(str(exc))
        return EXIT_BAD_INPUT
    if args.json:
        print(json.dumps({"profile": report.profile.name, "ok": report.ok,
                          "content_hash": report.profile.content_hash,
                          "budget": report.budget.as_dict() if report.budget else None,
                          **({"replicas": r} if (r := _replicas_json(report)) else {}),
                          "problems": [p.as_dict() for p in report.problems]}, indent=2))
    else:
        console = Console()
        if report.budget:
            console.print(budget_table(report))
        if report.ok and (table := replica_table(report)) is not None:
            console.print(table)
        for p in report.problems:
            console.print(str(p), style="red" if p.severity == "error" else "yellow", markup=False, highlight=False,
                          soft_wrap=True)  # one problem, one line: file:line: key: message
        console.print(f"{report.profile.name}: {'valid' if report.ok else 'INVALID'} "
                      f"({len(report.errors)} errors, {len(report.warnings)} warnings)", markup=False)
    return 0 if report.ok else EXIT_BAD_INPUT


def cmd_render(args) -> int:
    from dsv4deploy.render.unit import SGLANG_MODULE, render

    report = checked_profile(args.profile, args.settings)
    rendered = render(report.profile, module=args.module or SGLANG_MODULE)
    files = {host_path.lstrip("/"): text for host_path, text in rendered.files.items()}
    files["argv.json"] = json.dumps(rendered.argv, indent=2) + "\n"
    if rendered.replicas:  # argv.json is replica 0's; every instance's and the gateway's here
        argvs = {f"{r.instance}.service": r.argv for r in rendered.replicas}
        argvs[f"{rendered.gateway.service}.service"] = rendered.gateway.argv
        files["argv-replicas.json"] = json.dumps(argvs, indent=2) + "\n"
    out = Path(args.out)
    for name in write_tree(out, files):
        print(out / name)
    return 0


_NOT_HERE = ("/proc", "/sys", "/dev", "/run")


def _out_problem(message: str) -> ProfileError:
    return ProfileError([Problem(message, path="--out", file="<command line>")])


def write_tree(out: Path, files: dict[str, str]) -> list[str]:
    """Write `files` (relative path -> text) below `out`, all or nothing: checked first, written
    into a staging folder beside them, then moved into place. Raises ProfileError (exit 2)."""
    if "\0" in str(out) or not str(out).isprintable():
        raise _out_problem(f"{ascii(str(out))}: not a usable folder name")
    try:
        real = Path(os.path.realpath(out))
    except (OSError, ValueError) as exc:
        raise _out_problem(f"{out}: {exc}") from None
    if str(real) == "/" or any(str(real) == p or str(real).startswith(p + "/") for p in _NOT_HERE):
        raise _out_problem(f"{out} resolves to {real}: render writes a host tree there (etc/...), "
                           "which is not for /, /proc, /sys, /dev or /run; give a folder of its own")
    anchor = real
    while not anchor.exists():
        anchor = anchor.parent
    if not anchor.is_dir():
        raise _out_problem(f"{out}: {anchor} exists and is not a folder")
    for name in files:
        node = real
        for part in Path(name).parts:
            node = node / part
            is_file = node == real / name
            if node.is_symlink() or (node.exists() and not (node.is_file() if is_file else node.is_dir())):
                raise _out_problem(f"{out}: {node} is in the way (a symlink, or not a {'file' if is_file else 'folder'})"
                                   ": nothing written")
    try:
        staging = Path(tempfile.mkdtemp(prefix=".dsv4deploy-render-", dir=anchor))
        umask = os.umask(0o022)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # mkdtemp's 0700 would become the folder's mode
    except OSError as exc:
        raise _out_problem(f"{out}: cannot write in {anchor}: {exc.strerror}") from None
    try:
        for name, text in files.items():
            (staging / name).parent.mkdir(parents=True, exist_ok=True)
            (staging / name).write_text(text)
        if not real.exists():
            real.parent.mkdir(parents=True, exist_ok=True)
            os.rename(staging, real)
            staging = None
        else:
            for name in files:
                (real / name).parent.mkdir(parents=True, exist_ok=True)
                os.replace(staging / name, real / name)
    except OSError as exc:
        raise _out_problem(f"{out}: cannot write: {exc.strerror or exc}") from None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    return list(files)


def cmd_list(args) -> int:
    for name in list_profiles(args.settings.profiles):
        print(name)
    return 0


def cmd_history(args) -> int:
    from dsv4deploy.cli.history import print_history
    from dsv4deploy.host.connect import RemoteError, connected, on
    from dsv4deploy.host.release_store import ReleaseStore

    try:
        with connected(args.inventory) as hosts:
            per_host = {}
            for h in hosts:
                with on(h):
                    per_host[h.name] = ReleaseStore(h).records()
    except RemoteError as exc:
        _err(str(exc))
        return EXIT_FAILED
    print_history(per_host, args.json)
    return 0


def cmd_status(args) -> int:
    from dsv4deploy.cli.status import host_statuses, print_status
    from dsv4deploy.host.connect import RemoteError

    try:
        hosts = host_statuses(args.inventory)
    except RemoteError as exc:
        _err(str(exc))
        return 2
    return print_status(hosts, args.json)


def cmd_bench(args) -> int:
    """The smoke gate alone, against the server a host runs now (no restart, no record)."""
    from dsv4deploy.host.connect import RemoteError, connected, on
    from dsv4deploy.release.rollout import Target
    from dsv4deploy.host.gate import run_release_gate

    target = Target.of(checked_profile(args.profile, args.settings).profile.data)
    try:
        with connected(args.inventory) as hosts:
            failed = 0
            for h in hosts:
                with on(h):
                    outcome = run_release_gate(h, target, None, None, args.profile)
                failed += not outcome.passed
    except RemoteError as exc:
        _err(str(exc))
        return EXIT_FAILED
    return EXIT_FAILED if failed else 0


def cmd_pin(args) -> int:
    """Resolve the model repo's commit on the hub and write it into the profile in place."""
    from dsv4deploy.cli.pin import PinError, pin

    try:
        result = pin(args.profile, branch=args.branch, into_base=args.into_base, endpoint=args.endpoint,
                     env=args.settings.environ, directory=args.settings.profiles, dry_run=args.dry_run)
    except PinError as exc:
        _err(str(exc))
        return exc.exit_code
    print(result)
    for note in result.notes:
        _err(f"note: {note}")
    return 0


def cmd_tune(args) -> int:
    """Plan (no host) or run a tune; the work is in dsv4deploy/tune/."""
    from dsv4deploy.tune.backend import NoBackend, open_backend
    from dsv4deploy.tune.command import TuneFolders, plan_json, plan_text, prepare, run_tune
    from dsv4deploy.tune.state import Busy

    settings = args.settings
    prep = prepare(args.profile, args.set, directory=settings.profiles, concurrency=args.concurrency,
                   budget_s=args.budget_s, plan=args.plan)
    if args.plan:
        print(json.dumps(plan_json(prep), indent=2) if args.json else plan_text(prep))
        return 0
    try:
        backend = open_backend(args.inventory, prep.base, prep.method, settings)
    except NoBackend as exc:
        _err(str(exc))
        return EXIT_FAILED
    try:
        folders = TuneFolders(state=Path(args.state_dir) if args.state_dir else settings.cache / "tune",
                              reports=Path(args.reports_dir) if args.reports_dir else settings.reports)
        outcome = run_tune(prep, backend, folders, fresh=args.fresh)
    except Busy as exc:
        _err(str(exc))
        return EXIT_FAILED
    except KeyboardInterrupt:
        _err(f"interrupted: the measurements so far are kept; `dsv4deploy tune {args.profile}` again continues")
        return EXIT_FAILED
    finally:
        backend.close()
    print(outcome.result.verdict)
    for path in outcome.report_files + ([outcome.tuned_profile] if outcome.tuned_profile else []):
        print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsv4deploy", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", help="check a profile and print its GPU-memory budget")
    p.add_argument("profile")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.add_argument("--host", help="judge memory with this inventory host's calibration (reports/HOST/calibration.json, "
                                  "made from SGLang's startup logs there)")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("render", help="write the unit, NCCL env, manifest and argv of a profile")
    p.add_argument("profile")
    p.add_argument("--out", required=True, help="folder to write into (host paths below it)")
    p.add_argument("--module", help="server module (default sglang.launch_server; a stand-in's for a test host)")
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("history", help="release history of the hosts of an inventory")
    p.add_argument("--inventory", default="inventory/sim.py")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_history)

    p = sub.add_parser("status", help="each host: release, units, the watch's results and trend, GPUs, drift "
                                      "(exit 0 healthy, 1 degraded, 2 down)")
    p.add_argument("--inventory", default="inventory/sim.py")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("bench", help="run a profile's smoke gate against the live server of each host")
    p.add_argument("profile")
    p.add_argument("--inventory", default="inventory/sim.py")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("pin", help="write the model repo's current commit into a profile (in place, comments kept)",
                       description="Resolve BRANCH of the profile's model repo on the hub (HF_ENDPOINT, default "
                                   "https://huggingface.co; token from DSV4_HF_TOKEN_FILE or DSV4_HF_TOKEN) and "
                                   "write the commit as model.revision. A revision the profile inherits is added "
                                   "to the named profile's own file, unless --into-base.")
    p.add_argument("profile")
    p.add_argument("--branch", default="main", help="branch, tag or commit to resolve (default main)")
    p.add_argument("--into-base", action="store_true",
                   help="replace the revision in the base profile it is inherited from (all its users move)")
    p.add_argument("--endpoint", help="hub URL (default $HF_ENDPOINT or https://huggingface.co)")
    p.add_argument("--dry-run", action="store_true", help="resolve and check, print, write nothing")
    p.set_defaults(func=cmd_pin)

    p = sub.add_parser("tune", help="search a profile's tune space for the best configuration that passes",
                       description="Every candidate (the profile plus one combination of the tune.space / --set "
                                   "values) goes through the validator and the memory budget first; refused ones "
                                   "are listed with the reason and never measured. --plan stops there and touches "
                                   "no host. See docs/tune.md.")
    p.add_argument("profile")
    p.add_argument("--set", action="append", metavar="KNOB=V1,V2,...",
                   help="values to try for one knob (repeatable; replaces the profile's tune.space entry), "
                        "e.g. --set server.context_length=8192,32768")
    p.add_argument("--plan", action="store_true", help="print the candidates (to try / refused and why), measure nothing")
    p.add_argument("--json", action="store_true", help="with --plan: machine-readable")
    p.add_argument("--budget-s", type=int, help="wall-clock budget in seconds (default: tune.budget_s, else 1800)")
    p.add_argument("--concurrency", type=int, help="target concurrency (default: tune.concurrency, else the "
                                                    "highest gate level)")
    p.add_argument("--inventory", default="inventory/sim.py")
    p.add_argument("--fresh", action="store_true", help="set the saved state aside and measure everything again")
    p.add_argument("--state-dir", help="where the resumable state lives (default .cache/tune)")
    p.add_argument("--reports-dir", help="where the report folder goes (default reports)")
    p.set_defaults(func=cmd_tune)

    p = sub.add_parser("list", help="list deployable profiles")
    p.set_defaults(func=cmd_list)

    from dsv4deploy.cli.fleet import register as register_fleet
    register_fleet(sub)
    from dsv4deploy.cli.report import register as register_report
    register_report(sub)
    return parser


def run(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> int:
    """Parse and dispatch; bad input is a message and exit 2, never a traceback. The run's
    settings (folders, environment) are made here, once, and reach each verb as args.settings."""
    args = parser.parse_args(argv)
    args.settings = Settings.from_environment(os.environ)
    try:
        return args.func(args)
    except ProfileError as exc:
        _err(str(exc))
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `dsv4deploy history --json | head`
        return 0
    except KeyboardInterrupt:
        _err("interrupted")
        return EXIT_FAILED


def main(argv: list[str] | None = None) -> int:
    return run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
