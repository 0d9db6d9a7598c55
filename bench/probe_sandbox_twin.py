"""The NCCL probe's sandbox, shown on a twin with a CPU-only stand-in for the probe program.

The twin has no GPU, so the deploy skips the probe there; this runs the deploy's own probe
command (tasks/nccl_probe.py probe_command, built from the rendered unit of PROFILE) on an
isolated twin, with the twin's stand-in program (ct200twin/host/probe_stand_in.py) in place of
nccl_probe.py, which reports what it can do: who it is, whether its HOME is empty, whether it can
write the account's persistent home, reach loopback and reach a non-loopback address. The same program then runs without the
sandbox (setpriv, as the probe did before) for contrast. Prints one line per check.

    python -m ct200twin up --fleet state --hosts 1
    .venv/bin/python bench/probe_sandbox_twin.py --fleet state
    python -m ct200twin down --fleet state
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from checkout import load_profile  # noqa: E402
from ct200twin.host.probe_stand_in import PATH as SCRIPT, PROGRAM  # noqa: E402
from ct200twin.host.twin_host import running_hosts  # noqa: E402
from dsv4deploy.render.layout import Layout  # noqa: E402
from dsv4deploy.render.unit import render  # noqa: E402
from dsv4deploy.tasks.nccl_probe import probe_command  # noqa: E402

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleet", required=True, help="an isolated twin fleet of your own (never the default twin)")
    ap.add_argument("--profile", default="nvfp4-ctx8k")
    args = ap.parse_args()
    hosts = running_hosts(args.fleet)
    if not hosts:
        print(f"no running twin in fleet {args.fleet}: python -m ct200twin up --fleet {args.fleet} --hosts 1",
              file=sys.stderr)
        return 2
    twin = hosts[0]
    data = load_profile(args.profile).data
    user, account_home = data["service"]["user"], Layout.of(data).state_dir
    twin.run(f"id {user} >/dev/null 2>&1 || useradd --system --home-dir {account_home} --shell /usr/sbin/nologin "
             f"--user-group {user}; mkdir -p {account_home} && chown {user}:{user} {account_home} && "
             f"chmod 750 {account_home}")
    twin.write_file(SCRIPT, PROGRAM, mode=0o644)
    sha = hashlib.sha256(PROGRAM.encode()).hexdigest()
    peer = twin.address          # the twin's own non-loopback address: its sshd listens there
    argv = ["/usr/bin/python3", "-I", SCRIPT, peer]
    unit = render(load_profile(args.profile)).unit
    before = twin.run("ls -d /tmp/systemd-private-* 2>/dev/null | wc -l").stdout.strip()
    sandboxed = probe_command(argv, script=SCRIPT, sha256=sha, unit=unit)
    check = sandboxed.split("systemd-run ", 1)[0]
    runs = {
        "sandboxed (the deploy's command)": sandboxed,
        "sandboxed again (its HOME starts empty again)": sandboxed,
        "unsandboxed (setpriv and the account's home, as before)":
            check + shlex.join(["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--no-new-privs",
                                "--", "env", f"HOME={account_home}", *argv]),
        "wrong sha256": probe_command(argv, script=SCRIPT, sha256="0" * 64, unit=unit),
    }
    print(f"twin {twin.name}, profile {args.profile}, non-loopback peer {peer} (the twin's own address)")
    for label, cmd in runs.items():
        out = twin.run(cmd, check=False, timeout=120)
        print(f"--- {label}: rc={out.returncode}")
        try:
            doc = json.loads(out.stdout)
            env = doc.pop("env")
            doc["env"] = f"{len(env)} --env words, all under HOME: {all(v.startswith(doc['home']) for v in env.values())}"
            for key, value in doc.items():
                print(f"  {key}: {value}")
        except ValueError:
            print((out.stdout + out.stderr).rstrip())
    after = twin.run("ls -d /tmp/systemd-private-* 2>/dev/null | wc -l").stdout.strip()
    print(f"--- systemd-private /tmp folders before {before}, after {after} (the probe's is removed when it ends)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
