"""The ``bench_serving`` runner: SGLang's own client, from the server's venv, run on the host.

The module is ``sglang.benchmark.serving``; ``sglang.bench_serving`` is a deprecated shim for it
in every supported release (0.5.17 on) and the client itself only in older ones (0.5.14 and
before), so it is used only where the new one is absent (the runner's probe decides, runner.py).

One remote shell command per level::

    [ -s KEYFILE ] && OPENAI_API_KEY=$(cat KEYFILE) && export OPENAI_API_KEY
    d=$(mktemp -d); export HOME=$d/out/home XDG_CACHE_HOME=... HF_HOME=... HF_HUB_OFFLINE=1 ...
    timeout -k 10 LIMIT systemd-run --scope --property=IPAddressDeny=any --property=IPAddressAllow=H --
        setpriv --reuid=GATE_USER ... -- <venv>/bin/python -m MODULE --backend sglang --host H --port P
        --model <model path> --tokenizer <model path> --dataset-name random-ids --tokenize-prompt
        --random-input-len N --random-output-len M --random-range-ratio 1.0 --num-prompts N
        --max-concurrency C --warmup-requests W --output-file <fresh file> --disable-tqdm

The API key comes from the host's 0600 key file inside the remote shell (api_key_environment, the
one place that hands it over); it is never in the controller's argv nor in the command text. It
is in bench_serving's environment, where the tokenizer code can read it, so bench_serving runs
where that code reaches only the server (no_egress). The
client runs as the unprivileged gate user, whose account has no home (/nonexistent): its home and
every cache it writes (Hugging Face's, transformers' module copies of trust_remote_code files,
SGLang's) are a fresh folder that user owns, removed with the run (cache_environment); the
tokenizer comes from the model's local folder, offline. ``--tokenize-prompt`` sends token ids
(exactly input_len of them, as the built-in client does): a text prompt would be re-tokenized by
the server (a BOS token, BPE merges across the decoded ids) into another length than the one
reported.  We read the LAST line of a fresh JSONL file, not the text report (sglang.md 3.4).  bench_serving exits 0 when only some requests failed, so
failed = num_prompts - completed, judged against max_failed_requests (default 0: any missing
completion fails the level); a non-zero exit is a failed level with its stderr tail.

bench_serving cannot be stopped from inside, so its early stop is the strict bound: a level
whose measured run has not finished N*L/floor seconds after it began cannot reach its floor. The
run begins 1 s after bench_serving prints MAIN_RUN_PHRASE (its warm-up done), so a watcher in the
remote shell polls bench_serving's stdout (unbuffered: ``-u``) for that phrase and, floor time
plus BOUND_SLACK_S later, sends TERM to ``timeout``, which hands it on (watch_main_run). The outer
``timeout`` stays at N*L/floor + STARTUP_ALLOWANCE_S (importing torch, the tokenizer, the ready
check, warm-up): a release that never prints the phrase, or hangs before, is still stopped there.
Its early pass is a first round (run_level): one run of k of the level's N prompts (k as the
built-in client's early pass), under the same bounds; a clear pass by the built-in client's rule is
the level's result, marked as that client marks an early pass, and anything else runs all N
prompts, whose run alone is the result. A first round still running at the bound means the
level's first k prompts alone take longer than all N may: it cannot reach its floor either.
"""

from __future__ import annotations

import ipaddress
import json
import math
import shlex
import time
from dataclasses import dataclass, replace
from typing import Callable
from urllib.parse import urlsplit

from dsv4deploy.gate.inputs import GateHost, GateOptions, GateServer
from dsv4deploy.gate.result import BUDGET, EARLY_STOP, FAILED, OK, SKIPPED, GateResult, LevelResult, Stats
from dsv4deploy.gate.spec import GateSpec, LevelSpec

MARK = "@@DSV4GATE"
MODULE = "sglang.benchmark.serving"      # SGLang's benchmark client
LEGACY_MODULE = "sglang.bench_serving"   # deprecated shim for MODULE; the client itself before it existed
MODULES = (MODULE, LEGACY_MODULE)        # in order of preference
STARTUP_ALLOWANCE_S = 120.0    # python -m MODULE: imports torch, tokenizer, ready check
MAIN_RUN_PHRASE = "Starting main benchmark run"   # printed by every release once its warm-up is done
MAIN_RUN_PAUSE_S = 1.0         # SGLang sleeps this long between the phrase and its measured run
BOUND_SLACK_S = 5.0            # past the floor time: the run's own clock, its metrics and JSONL
WATCH_POLL_S = 0.5             # how often the watcher reads bench_serving's stdout
SSH_SLACK_S = 30.0             # the outer execute timeout is the level limit plus this
TIMEOUT_CODES = (124, 137)     # timeout(1): TERM sent / KILL sent
STAT_FIELDS = {"ttft_ms": "ttft_ms", "tpot_ms": "tpot_ms", "itl_ms": "itl_ms", "e2e_ms": "e2e_latency_ms"}


def host_port(base_url: str) -> tuple[str, int]:
    u = urlsplit(base_url)
    return u.hostname or "127.0.0.1", u.port or 30000


def bench_argv(level: LevelSpec, *, venv_python: str, base_url: str, model_path: str,
               warmup_requests: int, output_file: str, module: str = MODULE) -> list[str]:
    if module not in MODULES:
        raise ValueError(f"not a bench_serving module: {module!r} (one of {', '.join(MODULES)})")
    host, port = host_port(base_url)
    # -I: isolated, as every python the deploy starts on the host (host/__init__.py); -u: its
    # stdout unbuffered, so the watcher sees MAIN_RUN_PHRASE when printed (-I ignores PYTHONUNBUFFERED)
    return [venv_python, "-I", "-u", "-m", module, "--backend", "sglang", "--host", host, "--port", str(port),
            "--model", model_path, "--tokenizer", model_path, "--dataset-name", "random-ids", "--tokenize-prompt",
            "--random-input-len", str(level.input_len), "--random-output-len", str(level.output_len),
            "--random-range-ratio", "1.0", "--num-prompts", str(level.num_prompts),
            "--max-concurrency", str(level.concurrency), "--warmup-requests", str(warmup_requests),
            "--output-file", output_file, "--disable-tqdm"]


def floor_time_s(level: LevelSpec) -> float | None:
    """How long the level's measured run may take and still reach its floor (None: no floor)."""
    if not level.min_output_throughput:
        return None
    return level.total_output_tokens / level.min_output_throughput


def floor_limit_s(level: LevelSpec) -> float | None:
    """Past this many seconds from bench_serving's start, start-up included, the level cannot
    reach its floor (None: no floor): the outer bound, for a run that never says it began."""
    floor_s = floor_time_s(level)
    return None if floor_s is None else floor_s + STARTUP_ALLOWANCE_S


def run_bound_s(floor_s: float) -> float:
    """Seconds after its measured run began at which the watcher stops a level of floor time FLOOR_S."""
    return floor_s + BOUND_SLACK_S


def watch_main_run(floor_s: float) -> str:
    """Shell (POSIX sh) run in the background beside `timeout` (PID $t): it polls "$d/stdout"
    for MAIN_RUN_PHRASE and, the measured run's bound later (run_bound_s, plus the pause before
    the run), sends TERM to $t, "$d/bound" saying so (removed if the kill fails: the command had
    already ended). It ends when $t ends; TERM (sent by the command's shell then) ends its sleep
    at once. Nothing of it outlives the command: the shell waits for it."""
    ticks = max(1, math.ceil((MAIN_RUN_PAUSE_S + run_bound_s(floor_s)) / WATCH_POLL_S))
    return ("{ s=; trap 'kill \"$s\" 2>/dev/null' TERM; n=-1; while kill -0 \"$t\" 2>/dev/null; do "
            f'if [ "$n" -lt 0 ]; then grep -qF {shlex.quote(MAIN_RUN_PHRASE)} "$d/stdout" && n={ticks - 1}; '
            'elif [ "$n" -eq 0 ]; then : >"$d/bound"; kill -TERM "$t" 2>/dev/null || rm -f "$d/bound"; break; '
            f'else n=$((n - 1)); fi; sleep {WATCH_POLL_S:g} & s=$!; wait "$s"; s=; done; }} '
            '</dev/null >/dev/null 2>&1 & w=$!; ')


def drop_privileges(user: str | None) -> list[str]:
    """argv prefix that runs a command as `user` (no groups, no new privileges); [] for None."""
    if not user:
        return []
    return ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--no-new-privs", "--"]


def no_egress(base_url: str) -> list[str]:
    """argv prefix that runs a command in a systemd scope whose IP traffic may reach only the
    server's address (IPAddressDeny=any, IPAddressAllow=that address; `localhost` for a name).

    bench_serving takes the inference key only from its environment (OPENAI_API_KEY, API_KEY) or
    `--header` (argv), and it imports the model repository's tokenizer code in that same process:
    no route keeps the key from that code, so the code is kept from the network instead. A scope
    (not a service) keeps the caller's environment, stdio and files, and puts nothing of the
    environment into the unit's properties (which `systemctl show` shows anyone)."""
    host, _ = host_port(base_url)
    try:
        allow = str(ipaddress.ip_address(host))
    except ValueError:
        allow = "localhost"
    return ["systemd-run", "--quiet", "--scope", "--collect", "--property=IPAddressDeny=any",
            f"--property=IPAddressAllow={allow}", "--"]


def api_key_environment(api_key_file: str | None) -> str:
    """Shell that hands the server's API key to bench_serving (OPENAI_API_KEY, read from the
    host's 0600 KEYFILE by root's shell: never in argv nor in the command text); the one place
    the key is passed, '' without a key file."""
    if not api_key_file:
        return ""
    q = shlex.quote(api_key_file)
    return f"if [ -s {q} ]; then OPENAI_API_KEY=$(cat {q}); export OPENAI_API_KEY; fi; "


# Where bench_serving writes, all under HOME: the gate user's own folder of the run ("$d/out/home").
# TMPDIR too: CUTLASS's DSL (flashinfer, imported with SGLang) keeps $TMPDIR/$USER/cutlass_python_cache.
CACHE_DIRS = {"XDG_CACHE_HOME": ".cache", "HF_HOME": ".cache/huggingface",
              "TRANSFORMERS_CACHE": ".cache/huggingface/hub", "SGLANG_CACHE_DIR": ".cache/sglang", "TMPDIR": ""}


def cache_environment(home: str, user: str | None = None) -> str:
    """Shell that points HOME, TMPDIR and every cache bench_serving writes at HOME (a shell word:
    the gate user's folder of this run), names USER (root's, under sudo, otherwise) and keeps the
    Hugging Face libraries offline."""
    dirs = " ".join(f'{k}="{home}/{v}"' if v else f'{k}="{home}"' for k, v in CACHE_DIRS.items())
    names = f" USER={shlex.quote(user)} LOGNAME={shlex.quote(user)}" if user else ""
    return f'export HOME="{home}" {dirs}{names} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1; '


@dataclass(frozen=True)
class Bound:
    """When a run is stopped: `timeout` at LIMIT_S from its start; with FLOOR_S (the floor time of
    the level whose bound applies), once its measured run has gone on past that (watch_main_run)."""

    limit_s: float
    floor_s: float | None = None


def build_command(level: LevelSpec, server: GateServer, *, warmup_requests: int, bound: Bound,
                  run_as: str | None = None, module: str = MODULE, confined: bool = False) -> str:
    """The remote shell command (POSIX sh) for one level against SERVER; prints marked sections
    on stdout. It is stopped at BOUND; stopped by the floor's bound after its measured run began,
    the command says so ("bound=run") with rc 124; a run that ended by itself (rc 0) is kept.

    bench_serving runs the model repository's tokenizer code (trust_remote_code), so with RUN_AS
    it may write only in a folder of its own ($d/out, its home and caches in $d/out/home) inside
    root's private $d: stdout and stderr are files root's shell opens in $d, where RUN_AS can
    neither create nor replace a name, and the JSONL is read back as RUN_AS, so a link planted
    there reads nothing RUN_AS could not. CONFINED: it runs under no_egress, so the key in its
    environment cannot leave the host."""
    q = shlex.quote
    limit_s, floor_s = bound.limit_s, bound.floor_s
    as_user = drop_privileges(run_as)
    argv = (no_egress(server.base_url) if confined else []) + as_user + bench_argv(level, venv_python=server.venv_python, base_url=server.base_url,
                                model_path=server.model_path, warmup_requests=warmup_requests,
                                output_file="@OUT@", module=module)
    cmd = " ".join('"$d/out/bench.jsonl"' if a == "@OUT@" else q(a) for a in argv)
    owner = f'chmod 711 "$d" && chown {q(run_as)} "$d/out" "$d/out/home" && ' if run_as else ""
    read_jsonl = " ".join(q(a) for a in as_user) + (" " if as_user else "")
    return (api_key_environment(server.api_key_file) +
            f'd=$(mktemp -d "${{TMPDIR:-/tmp}}/dsv4deploy-gate.XXXXXX") && mkdir "$d/out" "$d/out/home" && {owner}'
            f': >"$d/stdout" && : >"$d/stderr" || {{ echo "{MARK} rc=97"; rm -rf "$d"; exit 0; }}; '
            + cache_environment("$d/out/home", run_as) +
            f'timeout -k 10 {max(1, int(limit_s))} {cmd} >"$d/stdout" 2>"$d/stderr" </dev/null' +
            ('; rc=$?; ' if floor_s is None else
             ' & t=$!; ' + watch_main_run(floor_s) + 'wait "$t"; rc=$?; kill "$w" 2>/dev/null; wait "$w"; '
             f'if [ -e "$d/bound" ] && [ "$rc" -ne 0 ]; then rc=124; echo "{MARK} bound=run"; fi; ') +
            f'echo "{MARK} rc=$rc"; echo "{MARK} jsonl"; {read_jsonl}tail -n 1 "$d/out/bench.jsonl" 2>/dev/null; echo; '
            f'echo "{MARK} stderr"; tail -c 4000 "$d/stderr"; echo; '
            f'echo "{MARK} stdout"; tail -c 2000 "$d/stdout"; echo; rm -rf "$d"')


def split_output(stdout: str) -> dict:
    """The marked sections of build_command's output: rc (int|None), run_bound (the watcher
    stopped it), jsonl, stderr, stdout."""
    out = {"rc": None, "run_bound": False, "jsonl": "", "stderr": "", "stdout": ""}
    section = None
    buf: dict[str, list[str]] = {"jsonl": [], "stderr": [], "stdout": []}
    for line in stdout.splitlines():
        if line.startswith(MARK + " "):
            tag = line[len(MARK) + 1:].strip()
            if tag.startswith("rc="):
                try:
                    out["rc"] = int(tag[3:])
                except ValueError:
                    pass
                section = None
            elif tag == "bound=run":
                out["run_bound"] = True
                section = None
            elif tag in buf:
                section = tag
            continue
        if section:
            buf[section].append(line)
    for k, v in buf.items():
        out[k] = "\n".join(v).strip()
    return out


def _tail(text: str, n: int = 800) -> str:
    text = (text or "").strip()
    return text[-n:]


def _last_line(text: str) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


def parse_jsonl(text: str, level: LevelSpec) -> LevelResult:
    """The LAST JSON line of bench_serving's --output-file (appended, one object per run)."""
    lines = [ln for ln in (text or "").splitlines() if ln.strip()]
    if not lines:
        raise ValueError("no JSONL result")
    d = json.loads(lines[-1])
    if not isinstance(d, dict) or "completed" not in d:
        raise ValueError("the JSONL line is not a bench_serving result (no 'completed')")
    completed = int(d.get("completed") or 0)
    failed = max(0, level.num_prompts - completed)

    def stats(prefix_suffix: str) -> Stats:
        return Stats.from_dict({k: d.get(f"{k}_{prefix_suffix}") for k in ("mean", "median", "std", "p90", "p95", "p99")})

    res = LevelResult(
        concurrency=level.concurrency, num_prompts=level.num_prompts, input_len=level.input_len,
        output_len=level.output_len, status=OK, completed=completed, failed=failed,
        duration_s=float(d.get("duration") or 0.0),
        total_input_tokens=int(d.get("total_input_tokens") or 0),
        total_output_tokens=int(d.get("total_output_tokens") or 0),
        request_throughput=float(d.get("request_throughput") or 0.0),
        input_throughput=float(d.get("input_throughput") or 0.0),
        output_throughput=float(d.get("output_throughput") or 0.0),
        total_throughput=float(d.get("total_throughput") or 0.0),
        ttft_ms=stats("ttft_ms"), tpot_ms=stats("tpot_ms"), itl_ms=stats("itl_ms"), e2e_ms=stats("e2e_latency_ms"),
        peak_output_throughput=d.get("max_output_tokens_per_s"),
        max_in_flight=d.get("max_concurrent_requests"),
        extra={k: d.get(k) for k in ("backend", "dataset_name", "max_concurrency", "random_input_len",
                                     "random_output_len", "random_range_ratio", "concurrency", "tag",
                                     "total_output_tokens_retokenized")
               if k in d},
    )
    info = d.get("server_info")
    if isinstance(info, dict) and info.get("version"):
        res.extra["server_version"] = info["version"]
    if failed:
        res.reason = (f"bench_serving completed {completed}/{level.num_prompts} requests "
                      "(it exits 0 on partial failure)")
    mism = [k for k, want in (("max_concurrency", level.concurrency), ("random_input_len", level.input_len),
                              ("random_output_len", level.output_len)) if k in d and d[k] is not None and d[k] != want]
    if mism:
        res.extra["mismatch"] = {k: d[k] for k in mism}
    return res


# early_stop["since"] of a level stopped by a bound: what its at_s counts from
SINCE = {"run": "measured run", "floor": "start"}


@dataclass(frozen=True)
class BenchRun:
    """What one level's bench_serving run left: its exit status (None: the remote command did not
    run to its end), the JSONL it wrote, its stderr, and how long it took (WALL_S)."""

    rc: int | None
    jsonl: str
    stderr: str
    wall_s: float | None = None


def level_from_run(level: LevelSpec, run: BenchRun, *, warmup_requests: int, limit_kind: str = "budget",
                   limit_s: float | None = None, budget_s: float | None = None) -> LevelResult:
    """One level's result from its bench_serving RUN, stopped at LIMIT_S (LIMIT_KIND "run": that
    long after its measured run began, it could not reach its floor; "floor": that long after
    bench_serving started, start-up included, neither; "budget": the gate's budget, BUDGET_S)."""
    rc, jsonl, stderr, wall_s = run.rc, run.jsonl, run.stderr, run.wall_s
    parsed: LevelResult | None = None
    parse_error = None
    if jsonl.strip():
        try:
            parsed = parse_jsonl(jsonl, level)
        except (ValueError, TypeError) as e:
            parse_error = str(e)
    res = parsed or LevelResult(concurrency=level.concurrency, num_prompts=level.num_prompts,
                                input_len=level.input_len, output_len=level.output_len, status=OK,
                                failed=level.num_prompts, duration_s=wall_s or 0.0)
    res.warmup_requests = warmup_requests
    res.extra.update({"exit_code": rc, "stderr_tail": _tail(stderr)})
    if rc in TIMEOUT_CODES:
        if limit_kind in ("run", "floor"):
            res.status = EARLY_STOP
            still = (f"bench_serving's measured run was still running after {limit_s:.0f} s" if limit_kind == "run"
                     else f"bench_serving still running after {limit_s:.0f} s (incl. {STARTUP_ALLOWANCE_S:.0f} s start-up)")
            res.reason = (f"cannot reach the floor: {level.total_output_tokens} tokens at "
                          f"{level.min_output_throughput:g} tok/s take {floor_time_s(level):.0f} s; {still}")
            res.early_stop = {"rule": "bound", "at_s": round(limit_s or 0.0, 3), "since": SINCE[limit_kind]}
        else:
            res.status = BUDGET
            res.reason = f"gate budget {budget_s:g} s exhausted during {level.label}" if budget_s else \
                f"{level.label} ran past its time limit ({limit_s:.0f} s)"
        res.duration_s = res.duration_s or (limit_s or 0.0)
        if parsed is None:
            res.failed = 0  # unknown: it was stopped, not answered with errors
        res.running_output_throughput = None if parsed is None else res.output_throughput
    elif rc is None:
        res.status = FAILED
        res.reason = "bench_serving gave no exit status (the remote command did not run to its end)"
    elif rc != 0:
        res.status = FAILED
        last = _last_line(stderr) or "no stderr"
        res.reason = f"bench_serving exited {rc}: {last[:300]}"
    elif parsed is None:
        res.status = FAILED
        res.reason = f"bench_serving exited 0 but wrote no usable JSONL ({parse_error or 'empty output file'})"
    return res


def skipped(level: LevelSpec, reason: str, warmup: int = 0) -> LevelResult:
    return LevelResult(concurrency=level.concurrency, num_prompts=level.num_prompts, input_len=level.input_len,
                       output_len=level.output_len, status=SKIPPED, reason=reason, warmup_requests=warmup)


def level_passes(level: LevelSpec, res: LevelResult, max_failed: int) -> bool:
    """Fail-fast test (the verdict is the authority)."""
    if res.status != OK or res.failed > max_failed:
        return False
    if level.min_output_throughput is not None and res.output_throughput < level.min_output_throughput:
        return False
    for lim, p99 in ((level.max_p99_ttft_ms, res.ttft_ms.p99), (level.max_p99_tpot_ms, res.tpot_ms.p99)):
        if lim is not None and p99 is not None and p99 > lim:
            return False
    return True


def first_round(level: LevelSpec, spec: GateSpec, options: GateOptions) -> LevelSpec | None:
    """The early pass's first round of LEVEL: the same level with k prompts, k =
    spec.early_pass_min_requests or the level's concurrency, at least 2 (the built-in client's
    rule); None when the level has none (no floor, no margin, early pass off, or k >= its prompts)."""
    if not options.early_pass or spec.early_pass_margin is None or not level.min_output_throughput:
        return None
    k = spec.early_pass_min_requests or max(2, level.concurrency)
    return replace(level, num_prompts=k) if k < level.num_prompts else None


def not_clear_pass(level: LevelSpec, first: LevelResult, sent: int, margin: float, max_failed: int) -> str | None:
    """Why a first round of SENT prompts is not a clear pass of LEVEL (None: it is): the built-in
    client's rule (client.py _passed_early): every prompt completed, no failure beyond the maximum,
    output throughput >= (1 + MARGIN) x floor, p99 TTFT / TPOT <= ceiling / (1 + MARGIN)."""
    if first.status != OK:
        return f"it ended {first.status}" + (f" ({first.reason})" if first.reason else "")
    if first.completed < sent or first.failed > max_failed:
        return f"{first.completed}/{sent} requests completed"
    need = (1 + margin) * level.min_output_throughput
    if first.output_throughput < need:
        return (f"{first.output_throughput:.1f} tok/s < {1 + margin:.2f} x floor "
                f"{level.min_output_throughput:g} tok/s")
    for name, ceiling, p99 in (("TTFT", level.max_p99_ttft_ms, first.ttft_ms.p99),
                               ("TPOT", level.max_p99_tpot_ms, first.tpot_ms.p99)):
        if ceiling is not None and (p99 is None or p99 > ceiling / (1 + margin)):
            seen = "not measured" if p99 is None else f"{p99:.1f} ms"
            return f"p99 {name} {seen} > ceiling {ceiling:g} ms / {1 + margin:.2f}"
    return None


def passed_early(level: LevelSpec, first: LevelResult, margin: float, wall_s: float) -> LevelResult:
    """LEVEL's result from its first round FIRST, a clear pass: that run's figures, marked as the
    built-in client marks an early pass (status ok, completed k of the level's n prompts,
    early_stop rule "pass", a reason that starts with "passed early")."""
    k, n = first.completed, level.num_prompts
    res = replace(first, num_prompts=n, failed=0, extra=dict(first.extra, wall_s=round(wall_s, 3)))
    res.early_stop = {"rule": "pass", "at_s": round(first.duration_s, 3), "requests_done": k, "first_round": k}
    res.reason = (f"passed early: {first.output_throughput:.1f} tok/s over {k}/{n} completed requests >= "
                  f"{1 + margin:.2f} x floor {level.min_output_throughput:g} tok/s (a first round of {k} prompts)")
    return res


def stopped_in_first_round(level: LevelSpec, first: LevelResult) -> LevelResult:
    """LEVEL's result when its first round ran past a limit: past the floor's (the whole level's
    time), the level cannot reach its floor, since its first k prompts alone took longer; past
    the budget's, the budget ran out. The level's n prompts, none of the round's figures judged."""
    res = replace(first, num_prompts=level.num_prompts)
    if res.status == EARLY_STOP:
        tokens = level.total_output_tokens
        at_s = first.early_stop["at_s"]
        since = (f"{at_s:.0f} s after its measured run began" if first.early_stop.get("since") == SINCE["run"]
                 else f"after {at_s:.0f} s (incl. {STARTUP_ALLOWANCE_S:.0f} s start-up)")
        res.reason = (f"cannot reach the floor: {tokens} tokens at {level.min_output_throughput:g} tok/s take "
                      f"{tokens / level.min_output_throughput:.0f} s; a first round of {first.num_prompts} of its "
                      f"{level.num_prompts} prompts was still running {since}")
    return res


@dataclass(frozen=True)
class _Run:
    """What every level's runs share: where, against what, the gate's spec, the module, the
    budget and its start, the log."""

    spec: GateSpec
    host: GateHost
    server: GateServer
    module: str
    budget_s: float
    t0: float
    log: Callable[[str], None] | None


def _remaining(ctx: _Run) -> float:
    return ctx.budget_s - (time.monotonic() - ctx.t0)


def _one(ctx: _Run, lv: LevelSpec, limit_level: LevelSpec) -> LevelResult:
    """One bench_serving run of LV (its prompts), stopped at LIMIT_LEVEL's floor time after its
    measured run began, its floor limit or the budget, whichever comes first."""
    remaining = _remaining(ctx)
    floor_s, fl = floor_time_s(limit_level), floor_limit_s(limit_level)
    kind, limit = ("floor", fl) if (fl is not None and fl < remaining) else ("budget", remaining)
    cmd = build_command(lv, ctx.server, warmup_requests=ctx.spec.warmup_requests, bound=Bound(limit, floor_s),
                        run_as=ctx.host.run_as, module=ctx.module, confined=ctx.host.confined)
    if ctx.log:
        of = f" of {limit_level.num_prompts}" if lv.num_prompts != limit_level.num_prompts else ""
        run = f"{run_bound_s(floor_s):.0f} s into its measured run or " if floor_s is not None else ""
        ctx.log(f"bench_serving ({ctx.module}) {lv.label}: {lv.num_prompts}{of} prompts {lv.input_len}/"
                f"{lv.output_len}, limit {run}{limit:.0f} s in all ({kind})")
    ts = time.monotonic()
    try:
        rc_outer, out, err = ctx.host.execute(cmd, limit + SSH_SLACK_S)
    except Exception as e:  # the SSH call itself timed out or broke
        res = skipped(lv, "")
        res.status = BUDGET if kind == "budget" else FAILED
        res.reason = f"remote command failed: {type(e).__name__}: {e}"
        res.duration_s = time.monotonic() - ts
        res.extra["remote_error"] = True
        return res
    sec = split_output(out or "")
    rc = sec["rc"]
    stderr = sec["stderr"] or (err or "")
    if rc is None and rc_outer not in (0, None):
        stderr = (err or "") + "\n" + (out or "")
    if sec["run_bound"] and floor_s is not None:
        kind, limit = "run", run_bound_s(floor_s)
    res = level_from_run(lv, BenchRun(rc, sec["jsonl"], stderr, time.monotonic() - ts),
                         warmup_requests=ctx.spec.warmup_requests, limit_kind=kind, limit_s=limit,
                         budget_s=float(ctx.spec.budget_s))     # the profile's, as the message names it
    res.extra["wall_s"] = round(time.monotonic() - ts, 3)
    return res


def run_level(ctx: _Run, lv: LevelSpec, options: GateOptions) -> LevelResult:
    """LV's result: with an early pass, a first round of k prompts (one bench_serving run, bounded
    by the whole level's floor limit); a clear pass is the level's result, anything else runs all
    n prompts and that run alone is the verdict (two runs' percentiles are never merged)."""
    first = first_round(lv, ctx.spec, options)
    if first is None:
        return _one(ctx, lv, lv)
    margin = float(ctx.spec.early_pass_margin)
    tried = _one(ctx, first, lv)
    wall = tried.extra.get("wall_s") or tried.duration_s
    if tried.status in (EARLY_STOP, BUDGET) or tried.extra.get("remote_error"):
        return stopped_in_first_round(lv, tried)
    why = not_clear_pass(lv, tried, first.num_prompts, margin, ctx.spec.max_failed_requests)
    if why is None:
        return passed_early(lv, tried, margin, wall)
    if ctx.log:
        ctx.log(f"bench_serving {lv.label}: the first round of {first.num_prompts} is not a clear pass ({why}): "
                f"all {lv.num_prompts} prompts")
    res = _one(ctx, lv, lv)
    res.extra["first_round"] = {"num_prompts": first.num_prompts, "completed": tried.completed,
                                "output_throughput": tried.output_throughput, "wall_s": wall, "why_not": why}
    res.extra["wall_s"] = round((res.extra.get("wall_s") or res.duration_s) + wall, 3)
    return res


def run(spec: GateSpec, host: GateHost, server: GateServer, options: GateOptions = GateOptions(), *,
        budget_s: float | None = None, module: str = MODULE,
        log: Callable[[str], None] | None = None) -> GateResult:
    """Run the levels, one bench_serving run each (two for a level whose first round of an early
    pass is not a clear pass: run_level), on HOST against SERVER; budget_s defaults to spec.budget_s."""
    budget = float(spec.budget_s if budget_s is None else budget_s)
    ctx = _Run(spec, host, server, module, budget, time.monotonic(), log)
    started = time.time()
    levels: list[LevelResult] = []
    skip_reason = None
    budget_hit = False
    for lv in spec.run_order(options.order):
        if skip_reason:
            levels.append(skipped(lv, skip_reason, spec.warmup_requests))
            continue
        if _remaining(ctx) <= 1:
            budget_hit = True
            skip_reason = f"not run: gate budget {budget:g} s exhausted"
            levels.append(skipped(lv, skip_reason, spec.warmup_requests))
            continue
        res = run_level(ctx, lv, options)
        levels.append(res)
        if log:
            log(f"bench_serving {lv.label}: {res.status}, {res.completed}/{lv.num_prompts} completed, "
                f"{res.output_throughput:.1f} tok/s" + (f" ({res.reason})" if res.reason else ""))
        if res.extra.pop("remote_error", False):
            budget_hit = budget_hit or res.status == BUDGET
            skip_reason = f"not run: gate stopped after {lv.label} failed"
        elif res.status == BUDGET:
            budget_hit = True
            skip_reason = f"not run: gate budget {budget:g} s exhausted"
        elif options.fail_fast and not level_passes(lv, res, spec.max_failed_requests):
            skip_reason = f"not run: gate stopped after {lv.label} failed (fail fast)"
    return GateResult(runner="bench_serving", levels=levels, base_url=server.base_url, started_at=started,
                      wall_s=time.monotonic() - ctx.t0, budget_s=budget, budget_exhausted=budget_hit,
                      client={"venv_python": server.venv_python, "module": module, "model_path": server.model_path,
                              "fail_fast": options.fail_fast, "order": options.order,
                              "startup_allowance_s": STARTUP_ALLOWANCE_S, "run_bound_slack_s": BOUND_SLACK_S,
                              "early_pass": {"margin": spec.early_pass_margin if options.early_pass else None,
                                             "min_requests": spec.early_pass_min_requests}})
