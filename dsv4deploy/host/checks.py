"""Is the release's server up, is it ours, does it answer? Used after a deploy's restart and
after a rollback's restore (with the restored release's Target).
"""

from __future__ import annotations

import json
import shlex

from dsv4deploy.profile.boundary import escaped
from dsv4deploy.sglang.health import HealthError, Observation, identity_problems, wait_healthy
from dsv4deploy.host.io import sh
from dsv4deploy.release.rollout import Target


def observe_command(t: Target, path: str = "/health", window_s: float = 0.0, then: str = "") -> str:
    """The HTTP status and the unit's state together. With a window, the host itself polls: the
    HTTP status every 0.05 s (the rate bench/deploy_overhead.py measures a server's own start at),
    the unit's state every 0.2 s, and answers as soon as the server is healthy or the unit failed
    (or the window ends): one round trip per window, a healthy server seen within 0.05 s, a crash
    within 0.2 s. The state it answers with is read at the end. THEN runs in the same command
    once the answer is 200, its output after a THEN_MARK line (confirm: the identity check,
    without a round trip of its own)."""
    curl = f"c=$(curl -s -o /dev/null -w '%{{http_code}}' --max-time 20 {t.base_url}{path})"
    state = f"s=$(systemctl show -p ActiveState -p SubState -p MainPID -p NRestarts {t.unit})"
    after = f"; [ \"$c\" = 200 ] && {{ echo {THEN_MARK}; {then}; }}; true" if then else ""
    if window_s <= 0:
        return f"{curl}; {state}; echo \"$c\"; echo \"$s\"{after}"
    ms = int(window_s * 1000)
    return (f"end=$(( $(date +%s%3N) + {ms} )); i=0; f=0; while :; do {curl}; [ \"$c\" = 200 ] && break; "
            f"if [ $((i % 4)) -eq 0 ]; then {state}; case \"$s\" in "
            "*ActiveState=failed*|*ActiveState=inactive*|*SubState=auto-restart*) f=1; break;; esac; fi; "
            f"i=$((i + 1)); [ \"$(date +%s%3N)\" -ge \"$end\" ] && break; sleep 0.05; done; "
            f"[ $f = 1 ] || {state}; "      # a crash answers with the state that showed it, not a later one
            "echo \"$c\"; echo \"$s\"" + after)


THEN_MARK = "__dsv4deploy_then"


def parse_observation(out: str) -> Observation:
    lines = out.splitlines()
    info = dict(line.split("=", 1) for line in lines[1:] if "=" in line)
    code = lines[0].strip() if lines else "000"
    return Observation(http=int(code) if code.isdigit() else 0,
                       active_state=info.get("ActiveState", ""), sub_state=info.get("SubState", ""),
                       main_pid=int(info.get("MainPID", 0) or 0), n_restarts=int(info.get("NRestarts", 0) or 0))


def observer(h, t: Target, path: str = "/health", window_s: float = 0.0, then: str = "",
             seen: dict | None = None):
    """One poll = one SSH command (observe_command); THEN's output, when it ran, goes to
    SEEN["then"]."""

    def observe() -> Observation:
        _, out = sh(h, observe_command(t, path, window_s, then), timeout=window_s + 30 if window_s else None)
        head, mark, after = out.partition(THEN_MARK + "\n")
        if mark and seen is not None:
            seen["then"] = after
        return parse_observation(head)
    return observe


JOURNAL_LINE_MAX = 400


def journal_tail(h, t: Target, lines: int = 30) -> str:
    """The unit's last LINES journal lines, each cut at JOURNAL_LINE_MAX characters: SGLang logs
    its whole ServerArgs on one line (16.5 KB on the twin), which would bury the reason printed
    above the tail. The server runs model code and writes its journal: what a line holds that
    is not printable (an escape sequence, a carriage return) is shown escaped."""
    _, out = sh(h, f"journalctl -u {t.unit} -n {lines} --no-pager -o cat 2>&1 || true")
    return "\n".join(escaped(_cut(line), keep="\t") for line in out.removesuffix("\n").split("\n"))


def journal_memory(h, t: Target, lines: int = 20000) -> str:
    """The unit's journal lines that carry SGLang's memory figures at start (release/startup_log.py
    GREP_PATTERN; the 16 KB ServerArgs line never comes back), from its last LINES lines."""
    from dsv4deploy.release.startup_log import GREP_PATTERN

    _, out = sh(h, f"journalctl -u {t.unit} -n {lines} --no-pager -o cat 2>/dev/null "
                   f"| grep -E {shlex.quote(GREP_PATTERN)} | tail -n 400 || true")
    return out


def _cut(line: str) -> str:
    return line if len(line) <= JOURNAL_LINE_MAX else f"{line[:JOURNAL_LINE_MAX]} ... ({len(line)} characters)"


def _authorized_curl(t: Target, path: str, data: str | None = None) -> str:
    """curl with the API key read from the host's 0600 key file (never in argv or environment)."""
    body = f" -H 'Content-Type: application/json' --data {shlex.quote(data)}" if data else ""
    return (f"sed -n 's/^./Authorization: Bearer &/p' {shlex.quote(t.layout.api_key_file)} 2>/dev/null "
            f"| curl -s --max-time 60 -H @-{body} {t.base_url}{path}")


def identity_command(t: Target) -> str:
    """Who holds the port, the unit's MainPID and /server_info, `---` between them."""
    return (f"ss -Htlnp 'sport = :{t.port}' | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u; echo ---; "
            f"systemctl show -p MainPID --value {t.unit}; echo ---; {_authorized_curl(t, '/server_info')}")


def identity_from(t: Target, out: str) -> list[str]:
    """Pure: what identity_command's output OUT says is wrong ([]: the unit's own server, serving
    the rendered model and args)."""
    pids_txt, main_txt, info_txt = (out.split("---\n") + ["", "", ""])[:3]
    try:
        info = json.loads(info_txt) if info_txt.strip() else None
    except json.JSONDecodeError:
        info = None
    main = main_txt.strip()
    return identity_problems(port_pids=[int(p) for p in pids_txt.split() if p.isdigit()],
                             main_pid=int(main) if main.isdigit() else 0, server_info=info,
                             expected=t.expected_server_info)


def identity(h, t: Target) -> list[str]:
    return identity_from(t, sh(h, identity_command(t))[1])


def confirm(h, t: Target, budget_s: float, poll_s: float = 2.0) -> None:
    """Wait for health, then prove the answering process is this release's. Raises HealthError.
    The poll that sees 200 checks the identity in the same command."""
    seen: dict[str, str] = {}
    # the host polls within each window: the control node asks again at once
    wait_healthy(observer(h, t, window_s=poll_s, then=identity_command(t), seen=seen), budget_s=budget_s, poll_s=0.0)
    problems = identity_from(t, seen["then"]) if "then" in seen else identity(h, t)
    if problems:
        raise HealthError("the server answering is not the one this release started: " + "; ".join(problems))


PROBE_MARK = "__dsv4deploy_probe"


def probe_command(t: Target, requests: int = 2, tokens: int = 8) -> str:
    """REQUESTS short generations sent at once (so a probe costs one generation's time and one
    round trip), each answer printed after its own marker line; the answers are small and hold
    no secret, kept in a private temporary folder that goes with the command."""
    payload = json.dumps({"input_ids": list(range(1, 33)),
                          "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True, "temperature": 0}})
    curl = _authorized_curl(t, "/generate", payload)
    return (f"d=$(mktemp -d) && trap 'rm -rf \"$d\"' EXIT && for i in $(seq 1 {int(requests)}); do "
            f"{{ {curl}; }} > \"$d/$i\" 2>&1 & done; wait; "
            f"for i in $(seq 1 {int(requests)}); do echo {PROBE_MARK} $i; cat \"$d/$i\"; echo; done")


def probe_problems(out: str, requests: int = 2, tokens: int = 8) -> list[str]:
    """Pure: what is wrong with each probe answer in OUT (probe_command's output); [] when every
    request returned TOKENS tokens."""
    answers: dict[int, str] = {}
    current = None
    for line in out.splitlines():
        if line.startswith(PROBE_MARK + " "):
            current = int(line.split()[1])
            answers[current] = ""
        elif current is not None:
            answers[current] += line
    problems = []
    for i in range(1, requests + 1):
        text = answers.get(i, "").strip()
        try:
            got = json.loads(text)["meta_info"]["completion_tokens"]
        except (ValueError, KeyError, TypeError):
            problems.append(f"probe request {i}/{requests} failed: {escaped(text[:200]) or 'no answer'}")
            continue
        if got != tokens:
            problems.append(f"probe request {i}/{requests} returned {escaped(str(got))} tokens, expected {tokens}")
    return problems


def probe(h, t: Target, requests: int = 2, tokens: int = 8) -> str:
    """A short generation probe (a rollback's stand-in for the full gate: it passed before; and
    the check through the gateway after a rolling update). Raises HealthError; says what passed."""
    _, out = sh(h, probe_command(t, requests, tokens))
    problems = probe_problems(out, requests, tokens)
    if problems:
        raise HealthError("; ".join(problems))
    return f"{requests}/{requests} probe requests through {t.base_url} answered {tokens} tokens each"
