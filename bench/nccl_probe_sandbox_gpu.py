"""The deploy's NCCL probe in the unit's sandbox on a lent 1-GPU machine: the files for one run.

Run here, then on the device (its working tree is this checkout; `.gpu-probe` is made ignored
and carried, so it never reaches a commit):

    echo /.gpu-probe/ >> .git/info/exclude
    .venv/bin/python bench/nccl_probe_sandbox_gpu.py .gpu-probe
    # device tool `run`, carry [".gpu-probe"]:  bash bench/nccl_probe_sandbox_gpu.sh

The files: `sandboxed.sh` is probe_command(probe_argv(PROFILE, one rank)) exactly as the deploy
sends it (systemd-run with the rendered unit's sandbox, the empty private HOME); `bare.sh` the
same probe argv without systemd-run, for a machine whose PID 1 is not systemd, where
bench/nccl_probe_sandbox_gpu.sh runs it in a network namespace holding only `lo`, with a private
/tmp, as the service's user (what that proves and what it does not is in its output); `bad.sh`
the sandboxed command with a wrong sha256; `nccl.env.next` the profile's NCCL env file plus
NCCL_NVLS_ENABLE=0 (the lent machines' rule: NVLink multicast stays off).
"""

from __future__ import annotations

import hashlib
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from checkout import load_profile  # noqa: E402
from dsv4deploy.preflight import PROBE_SCRIPT, probe_argv  # noqa: E402
from dsv4deploy.render.layout import Layout  # noqa: E402
from dsv4deploy.render.unit import render  # noqa: E402
from dsv4deploy.sglang.flags import home_environment  # noqa: E402
from dsv4deploy.tasks.nccl_probe import PROBE_HOME, probe_command  # noqa: E402

PROFILE = "nvfp4-ctx8k"


def main(out: Path) -> int:
    data = load_profile(PROFILE).data
    layout = Layout.of(data)
    rendered = render(load_profile(PROFILE))
    script, env_file = f"{layout.venv}/nccl_probe.py", f"{layout.config_dir}/nccl.env.next"
    program = PROBE_SCRIPT.read_bytes()
    sha = hashlib.sha256(program).hexdigest()
    argv = probe_argv(data, script=script, env_file=env_file, timeout_s=120, nranks=1)
    home = [a for k, v in home_environment(PROBE_HOME).items() for a in ("--env", f"{k}={v}")]
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "sandboxed.sh": probe_command(argv, script=script, sha256=sha, unit=rendered.unit),
        "bad.sh": probe_command(argv, script=script, sha256="0" * 64, unit=rendered.unit),
        "bare.sh": shlex.join([*argv, *home]),
        "nccl.env.next": rendered.nccl_env + "NCCL_NVLS_ENABLE=0\n",
        "vars": f"U={data['service']['user']}\nV={layout.venv}\nCFG={layout.config_dir}\nSTATE={layout.state_dir}\n",
    }
    for name, text in files.items():
        (out / name).write_text(text if text.endswith("\n") else text + "\n")
    (out / "nccl_probe.py").write_bytes(program)
    print(f"wrote {', '.join(sorted([*files, 'nccl_probe.py']))} to {out} (profile {PROFILE}, venv {layout.venv})")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else ".gpu-probe")))
