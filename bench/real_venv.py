"""The real host's SGLang venv, installed for real on a bare isolated twin, and SGLang's own start
checks on every shipped 0.5.23 profile's argv in it (issue 36, item 3). Not part of `make test`.

    .venv/bin/python -m ct200twin up --fleet realvenv --hosts 1
    .venv/bin/python bench/real_venv.py [--fleet realvenv] [--version 0.5.23]
    .venv/bin/python -m ct200twin down --fleet realvenv

On twin 1 of FLEET (its own network namespace; it reaches PyPI through its proxy), as root over
SSH, exactly what a real host's deploy runs (dsv4deploy/host/installer.py, tasks/venv.py): the
pinned uv bootstrapped with pip --require-hashes, the empty venv, the release's lock file put into
it, then `uv pip install --compile-bytecode --require-hashes -r <venv>/dsv4deploy.lock` (the
installs() of a rollout with no stand-ins). Prints that install's time and the venv's size, what
imports (sglang, torch, flashinfer, sgl_kernel), then, for every shipped profile on VERSION, the
launch check's own program (dsv4deploy/sglang/launch_parser.py check --prepare) on the argv the
project's renderer gives it (replica 0's; the API key's credential replaced by a YAML file with a
stand-in key). Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ct200twin.host.twin_host import SimHost  # noqa: E402
from dsv4deploy.host import installer  # noqa: E402
from dsv4deploy.host.state import HOST_PACKAGES  # noqa: E402
from dsv4deploy.release.rollout import rollout_for  # noqa: E402
from dsv4deploy.render.unit import SGLANG_CONFIG_CREDENTIAL  # noqa: E402
from dsv4deploy.sglang.versions import lock_file  # noqa: E402
from dsv4deploy.tasks.venv import LAUNCH_PARSER, LOCK, installs  # noqa: E402

sys.path.insert(0, str(REPO / "tests"))
from checkout import list_profiles, settings  # noqa: E402

q = shlex.quote
CONFIG = "/root/bench-real-venv-config.yaml"          # --config's file: a stand-in key, not a secret
PROGRAM = "/root/bench-launch-parser.py"
IMPORTS = ("import time, importlib\n"
           "for name in ('torch', 'sglang', 'flashinfer', 'sglang.srt.models.deepseek_v4', 'sgl_kernel'):\n"
           "    t = time.monotonic()\n"
           "    try:\n"
           "        m = importlib.import_module(name)\n"
           "        print(f'{name}: imports ({time.monotonic() - t:.1f} s) {getattr(m, \"__version__\", \"\")}')\n"
           "    except Exception as exc:\n"
           "        print(f'{name}: does not import: {type(exc).__name__}: {str(exc)[:160]}')\n"
           "import torch; print('torch.cuda.is_available():', torch.cuda.is_available(), torch.version.cuda)\n")


def timed(twin: SimHost, command: str, timeout: float = 1800) -> tuple[float, object]:
    start = time.monotonic()
    proc = twin.run(command, check=False, timeout=timeout)
    return time.monotonic() - start, proc


def rollouts(version: str) -> list:
    """A real host's rollout (no stand-ins) of every shipped profile on VERSION."""
    out = []
    for name in list_profiles():
        r = rollout_for({"profile": name, "settings": settings(), "weights_source": {"type": "hf"}})
        if r.data["sglang"]["version"] == version:
            out.append(r)
    return out


def argv_of(r) -> list[str]:
    credentials = {r.layout.credential_path(SGLANG_CONFIG_CREDENTIAL),
                   r.layout.instance_credential_path(0, SGLANG_CONFIG_CREDENTIAL)}
    return [CONFIG if a in credentials else a for a in r.rendered.argv[3:]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleet", default="realvenv", help="the isolated twin's fleet (twin 1; never the default twin)")
    ap.add_argument("--version", default="0.5.23")
    args = ap.parse_args()
    twin = SimHost(1, args.fleet)
    if not twin.running():
        sys.exit(f"{twin.name} is not running: .venv/bin/python -m ct200twin up --fleet {args.fleet} --hosts 1")
    found = rollouts(args.version)
    if not found or lock_file(args.version) is None:
        sys.exit(f"no shipped profile or no lock for SGLang {args.version}")
    r = found[0]
    venv = r.layout.venv
    (install,) = installs(r)
    print(f"twin {twin.name} ({twin.address}); SGLang {args.version}; venv {venv}")
    print(f"python: {twin.run('python3 --version').stdout.strip()}; "
          f"pip config: {twin.run('python3 -m pip config list', check=False).stdout.strip() or '(none)'}")

    # the Debian packages the deploy's first step installs (python3-venv: the venvs need it)
    spent, proc = timed(twin, "DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
                              f"apt-get install -y -qq --no-install-recommends {' '.join(HOST_PACKAGES)} >/dev/null")
    print(f"host packages ({' '.join(HOST_PACKAGES)}): rc {proc.returncode}, {spent:.1f} s")

    # the host's uv, as host/installer.py bootstraps it (pip --require-hashes)
    twin.run(f"mkdir -p {q(installer.TOOL)}")
    twin.write_file(installer.REQUIREMENTS, installer.requirements().decode())
    twin.write_file(installer.PROGRAM, installer.program().decode())
    spent, proc = timed(twin, " && ".join(installer.bootstrap_commands()))
    print(f"uv bootstrap: rc {proc.returncode}, {spent:.1f} s")
    if proc.returncode:
        print(proc.stdout[-2000:] + proc.stderr[-2000:])
        return 1

    # the venv, empty, its lock, then the one install a real host runs
    twin.run(f"rm -rf {q(venv)} {q(installer.CACHE)}")             # bare: an empty venv and an empty uv cache
    twin.run(installer.venv_command(venv))
    twin.write_file(f"{venv}/{LOCK}", lock_file(args.version).read_text())
    print(f"install: {install}")
    spent, proc = timed(twin, install)
    print(f"install: rc {proc.returncode}, {spent:.1f} s")
    if proc.returncode:
        print(proc.stdout[-3000:] + proc.stderr[-3000:])
        return 1
    sizes = twin.run(f"du -sh {q(venv)} {q(installer.CACHE)}; du -sh --total {q(venv)} {q(installer.CACHE)} | tail -1")
    print("size:\n" + sizes.stdout.rstrip())
    freeze = twin.run(installer.freeze_command(venv)).stdout.splitlines()
    print(f"packages: {len(freeze)}; " + ", ".join(p for p in freeze if p.split("==")[0] in
                                                  ("sglang", "torch", "sglang-kernel", "flashinfer-python")))

    spent, proc = timed(twin, f"{q(venv)}/bin/python -I -c {q(IMPORTS)}", timeout=600)
    print(f"imports ({spent:.1f} s):\n" + (proc.stdout + proc.stderr).rstrip())

    # SGLang's own start checks, as the launch check runs them, on every profile's argv
    twin.write_file(CONFIG, "api-key: bench-stand-in-key\n", mode=0o600)
    twin.write_file(PROGRAM, LAUNCH_PARSER)
    table = "/root/bench-parser-table.json"
    for one in found:
        argv = argv_of(one)
        cmd = f"{q(venv)}/bin/python -I {PROGRAM} check --prepare {table} bench {' '.join(q(a) for a in argv)}"
        spent, proc = timed(twin, cmd, timeout=600)
        said = (proc.stdout + proc.stderr).strip().splitlines()
        verdict = "accepted" if proc.returncode == 0 else f"REFUSED (rc {proc.returncode})"
        print(f"{one.profile.name}: {verdict} in {spent:.1f} s: {' | '.join(said[-2:])}")
        print(f"    argv: {' '.join(argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
