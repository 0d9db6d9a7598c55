"""Reading the twin over SSH (and the local checkpoint it is compared with): what the checks of
"recovered" and the faults look at, kept apart from how they judge it."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

RELEASES_DIR = "/var/lib/dsv4deploy/releases"
MANIFEST = "/etc/dsv4deploy/sglang/manifest.json"
LOCK = "/var/lib/dsv4deploy/deploy.lock"
GATE_USER = "dsv4deploy-gate"


def releases(twin) -> list[dict]:
    out = twin.run(f"cat {RELEASES_DIR}/*/status.json 2>/dev/null | python3 -c "
                   "\"import sys,json; d=sys.stdin.read().replace('}\\n{', '}\\x00{'); "
                   "print(json.dumps([json.loads(x) for x in d.split('\\x00') if x.strip()]))\"", check=False)
    return sorted(json.loads(out.stdout or "[]"), key=lambda r: r["release"])


def health(twin) -> str:
    return twin.run("curl -s -o /dev/null -w '%{http_code}' --max-time 20 http://127.0.0.1:30000/health",
                    check=False).stdout


def served_context(twin):
    info = json.loads(twin.run("sed 's/^/Authorization: Bearer /' /etc/dsv4deploy/secrets/sglang-api-key | "
                               "curl -s -H @- http://127.0.0.1:30000/server_info").stdout)
    return info["context_length"]


def live_venv(twin) -> str:
    return json.loads(twin.run(f"cat {MANIFEST}").stdout)["venv"]


def main_pid(twin) -> int:
    return int(twin.run("systemctl show -p MainPID --value sglang.service").stdout.strip() or 0)


def live_manifest_sha(twin) -> str | None:
    out = twin.run(f"sha256sum {MANIFEST} 2>/dev/null", check=False).stdout.split()
    return out[0] if out else None


# Processes our runs started on the host: everything in an SSH session's cgroup (or sshd's own,
# without logind) except sshd itself and this check's own session, plus anything of the gate's
# user or in a transient dsv4deploy unit. The server (sglang.service) is not "ours" in this sense:
# systemd owns it and the release history says what it is.
_OURS = r"""
me=$(cat /proc/self/cgroup | cut -d: -f3-)
for d in /proc/[0-9]*; do
  p=${d#/proc/}; [ "$p" = "$$" ] && continue
  cg=$(cut -d: -f3- "$d/cgroup" 2>/dev/null) || continue
  u=$(stat -c %U "$d" 2>/dev/null) || continue
  a=$(tr '\0' ' ' < "$d/cmdline" 2>/dev/null)
  [ -n "$a" ] || continue
  case "$cg" in
    "$me") continue;;
    */sglang.service|*/sglang@*) [ "$u" = "GATE" ] || continue;;
    */session-*|*/ssh.service|*/dsv4deploy*) ;;
    *) [ "$u" = "GATE" ] || continue;;
  esac
  case "$a" in "sshd: "*|"/usr/sbin/sshd -D"*|"sshd: /usr/sbin/sshd"*) continue;; esac
  echo "$p $u $cg $a"
done
""".replace("GATE", GATE_USER)


def our_processes(twin) -> list[str]:
    """'PID user cgroup argv' of every process of ours still on the host."""
    out = twin.run(["sh", "-c", _OURS], check=False).stdout
    return [line for line in out.splitlines() if line.strip()]


def wait_no_processes(twin, within_s: float = 10.0) -> tuple[list[str], float]:
    """Our processes still there after `within_s` (empty: none), and when the last one went."""
    t0 = time.monotonic()
    while True:
        left = our_processes(twin)
        if not left or time.monotonic() - t0 >= within_s:
            return left, time.monotonic() - t0
        time.sleep(0.3)


def release_files(twin) -> dict[int, str]:
    """sha256 over each release folder's kept files (files/ and profile.json)."""
    out = twin.run(f"cd {RELEASES_DIR} 2>/dev/null && for d in [0-9]*; do "
                   "[ -f $d/profile.json ] || continue; "
                   "h=$(find $d/files $d/profile.json -type f -print0 | sort -z | xargs -0 sha256sum | sha256sum); "
                   "echo \"$d ${h%% *}\"; done", check=False).stdout
    return {int(n): h for n, h in (line.split() for line in out.splitlines() if line.strip())}


def checkpoint_sha(twin, model_dir: str) -> dict[str, str]:
    out = twin.run(f"cd {model_dir} && sha256sum *.safetensors", check=False).stdout
    return {name: h for h, name in (line.split() for line in out.splitlines() if line.strip())}


def local_checkpoint_sha(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.safetensors"))}
