"""run_gate plumbing without a server: runner choice, the built-in command (no key in it),
a client that crashes or prints garbage, an SSH call that times out."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4deploy.gate.inputs import GateHost, GateOptions, GateServer
from dsv4deploy.gate.result import FAILED, GateResult, LevelResult
from dsv4deploy.gate.runner import (CLIENT_PATH, PROBE_DEPENDENCIES, PROBE_TIMEOUT_S, builtin_command, choose_runner,
                                    local_execute, parse_client_output, prepare_command, prepare_gate, probe_command,
                                    run_gate)
from dsv4deploy.gate.spec import GateSpec, LevelSpec

SPEC = GateSpec(levels=(LevelSpec(1, 8, min_output_throughput=10), LevelSpec(64, 128, min_output_throughput=400)),
                budget_s=600)


def answers(rc, out):
    return lambda cmd, timeout_s: (rc, out, "")


def test_choose_runner():
    assert choose_runner("builtin", None, "/x") == ("builtin", "runner builtin (profile)", None)
    new, old = "sglang.benchmark.serving", "sglang.bench_serving"
    assert choose_runner("auto", answers(0, new + "\n"), "/v/bin/python")[::2] == ("bench_serving", new)
    assert choose_runner("auto", answers(0, old + "\n"), "/v/bin/python")[::2] == ("bench_serving", old)
    assert choose_runner("auto", answers(3, "\n"), "/v/bin/python")[::2] == ("builtin", None)
    assert choose_runner("auto", answers(0, ""), "/v/bin/python")[::2] == ("builtin", None)    # said nothing
    assert choose_runner("auto", answers(0, "os\n"), "/v/bin/python")[::2] == ("builtin", None)  # not a module of ours
    assert choose_runner("bench_serving", answers(0, old), "/v")[::2] == ("bench_serving", old)
    r, why, module = choose_runner("bench_serving", answers(3, ""), "/v")
    assert (r, module) == ("bench_serving", new) and "has neither" in why
    # an SGLang installed without its dependencies (pip --no-deps) cannot run its client
    r, why, module = choose_runner("auto", answers(3, new + " missing torch transformers\n"), "/v")
    assert (r, module) == ("builtin", None)
    assert why == f"auto: /v has {new} but not what it imports (torch, transformers); built-in client"
    assert choose_runner("bench_serving", answers(3, old + " missing torch\n"), "/v")[::2] == ("bench_serving", old)

    def boom(c, t):
        raise TimeoutError("ssh timed out")
    r, why, module = choose_runner("auto", boom, "/v/bin/python")
    assert r == "builtin" and module is None and "ssh timed out" in why


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory):
    """A venv with nothing installed: the site dir that on_path() names in it is all it has."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    return str(venv / "bin" / "python")


def on_path(venv_python: str, site: Path) -> None:
    """Put SITE on the venv's path as a package installed into it would be (a .pth in its
    site-packages: the probe runs isolated, so PYTHONPATH is not read)."""
    lib = Path(venv_python).parent.parent / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    (lib / "site-packages" / "dsv4deploy-test-tree.pth").write_text(f"{site}\n")


def sglang_tree(root: Path, *files: str, deps: tuple[str, ...] = PROBE_DEPENDENCIES) -> Path:
    """A site dir whose packages explode when imported (as sglang's __init__ would pull in torch)."""
    for rel in ("sglang/__init__.py", "sglang/benchmark/__init__.py", *files,
                *(f"{name}/__init__.py" for name in deps)):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("raise ImportError('the probe imported ' + __name__)\n")
    return root


NEW, OLD = ("sglang/benchmark/serving.py", "sglang/bench_serving.py"), ("sglang/bench_serving.py",)


@pytest.mark.parametrize("files,deps,expected,module", [
    (NEW, PROBE_DEPENDENCIES, (0, "sglang.benchmark.serving"), "sglang.benchmark.serving"),   # 0.5.17 on
    (OLD, PROBE_DEPENDENCIES, (0, "sglang.bench_serving"), "sglang.bench_serving"),           # 0.5.14 and before
    ((), PROBE_DEPENDENCIES, (3, ""), None),
    (NEW, ("aiohttp", "numpy", "requests", "tqdm"),                                           # pip --no-deps
     (3, "sglang.benchmark.serving missing torch transformers"), None),
])
def test_probe_finds_the_module_without_importing_sglang(tmp_path, monkeypatch, bare_python, files, deps,
                                                         expected, module):
    on_path(bare_python, sglang_tree(tmp_path / "site", *files, deps=deps))
    rc, out, err = local_execute(probe_command(bare_python), PROBE_TIMEOUT_S)
    assert (rc, out.strip()) == expected, err
    assert "imported" not in out + err
    assert choose_runner("auto", local_execute, bare_python)[2] == module


def test_probe_when_sglang_is_absent_or_not_a_package(tmp_path, monkeypatch, bare_python):
    on_path(bare_python, tmp_path)
    assert local_execute(probe_command(bare_python), PROBE_TIMEOUT_S)[:2] == (3, "\n")
    (tmp_path / "sglang.py").write_text("raise ImportError('the probe imported sglang')\n")
    assert local_execute(probe_command(bare_python), PROBE_TIMEOUT_S)[:2] == (3, "\n")
    assert choose_runner("auto", local_execute, bare_python)[::2] == ("builtin", None)


def test_the_probe_sees_the_venv_not_the_logins_environment(tmp_path, monkeypatch, bare_python):
    """A PYTHONPATH the login sets (/etc/environment) or a working directory holding an sglang
    tree is not what the unit's python imports: the probe finds no bench_serving there."""
    on_path(bare_python, tmp_path / "empty")
    tree = sglang_tree(tmp_path / "site", *NEW)
    monkeypatch.setenv("PYTHONPATH", str(tree))
    monkeypatch.chdir(tree)
    assert local_execute(probe_command(bare_python), PROBE_TIMEOUT_S)[:2] == (3, "\n")


def test_builtin_command_checks_the_client_and_passes_the_key_by_fd():
    cmd = builtin_command(SPEC, GateHost(local_execute, run_as="dsv4deploy-gate"),
                          GateServer("http://127.0.0.1:30000", "/m", "/v", "/etc/dsv4deploy/secrets/sglang-api-key"),
                          budget_s=590)
    digest = hashlib.sha256(CLIENT_PATH.read_bytes()).hexdigest()
    assert cmd.startswith(f"echo '{digest}  /opt/dsv4deploy/gate/client.py' | sha256sum -c --status - || ")
    assert ("if [ -s /etc/dsv4deploy/secrets/sglang-api-key ]; then exec 3</etc/dsv4deploy/secrets/sglang-api-key; "
            "set -- --api-key-fd 3; else set --; fi; setpriv --reuid=dsv4deploy-gate --regid=dsv4deploy-gate "
            "--clear-groups --no-new-privs -- python3 -I -S - --base-url http://127.0.0.1:30000 --levels ") in cmd
    assert cmd.endswith(' "$@" </opt/dsv4deploy/gate/client.py')
    assert "--budget-s 590.000" in cmd and "--fail-fast" in cmd
    # what is left of the budget is the client's deadline; the profile's budget is what it names
    assert f"--gate-budget-s {SPEC.budget_s:g} " in cmd and SPEC.budget_s != 590
    levels = json.loads(cmd.split("--levels ")[1].split(" --warmup-requests")[0].strip("'"))
    assert [lv["concurrency"] for lv in levels] == [64, 1]           # highest concurrency first


def test_a_tampered_client_is_never_run(tmp_path):
    marker = tmp_path / "ran"

    def plant(src, dst):                     # what a hostile user would put there
        Path(dst).write_text(f"open({str(marker)!r}, 'w').write('pwned')\n")
        return True

    out = run_gate(SPEC,
                   GateHost(local_execute, upload=plant, host_python=sys.executable,
                            client_dir=str(tmp_path / "gate")),
                   GateServer("http://127.0.0.1:9", "/m", "/v"),
                   GateOptions(runner="builtin"))
    assert not marker.exists()
    assert not out.passed and "does not match sha256" in out.result.error
    assert oct((tmp_path / "gate").stat().st_mode & 0o777) == "0o700"


def test_a_failed_upload_fails_the_gate(tmp_path):
    out = run_gate(SPEC,
                   GateHost(local_execute, upload=lambda src, dst: False, host_python=sys.executable,
                            client_dir=str(tmp_path / "gate")),
                   GateServer("http://127.0.0.1:9", "/m", "/v"),
                   GateOptions(runner="builtin"))
    assert not out.passed and "uploading the gate client" in out.result.error

    def broken(src, dst):
        raise OSError("scp: connection lost")

    out = run_gate(SPEC,
                   GateHost(local_execute, upload=broken, host_python=sys.executable,
                            client_dir=str(tmp_path / "gate2")),
                   GateServer("http://127.0.0.1:9", "/m", "/v"),
                   GateOptions(runner="builtin"))
    assert not out.passed and "connection lost" in out.result.error


def test_client_dir_must_be_root_only_when_privileges_drop(tmp_path):
    loose = tmp_path / "gate"
    loose.mkdir()
    rc, _, err = local_execute(prepare_command(str(loose), as_root=True), 10)
    owned_by_root = os.geteuid() == 0
    assert (rc == 0) == owned_by_root, err   # as root the dir is root-owned once chmod 700 has run
    if not owned_by_root:
        assert "is not root-owned 0700" in err


def test_client_is_stdlib_only():
    src = CLIENT_PATH.read_text()
    assert "dsv4deploy" not in src.split('"""', 2)[2].split("SCHEMA")[0]   # no package imports
    imports = {line.split()[1].split(".")[0] for line in src.splitlines()
               if line.startswith(("import ", "from ")) and not line.startswith("from __future__")}
    assert imports <= {"argparse", "asyncio", "collections", "json", "math", "os", "random", "resource",
                       "signal", "ssl", "sys", "time", "urllib"}, imports


def test_client_garbage_or_crash_is_a_failed_gate():
    res = parse_client_output(1, "", "Traceback ...\nSyntaxError: invalid syntax", SPEC)
    assert res.error.startswith("client wrote no JSON result; exit 1; stderr:") and "SyntaxError" in res.error
    assert all(lv.status == FAILED for lv in res.levels)
    res = parse_client_output(0, '{"schema": "other"}', "", SPEC)
    assert "not a gate result" in res.error
    good = GateResult("builtin", [LevelResult(64, 128, output_throughput=500.0, completed=128),
                                  LevelResult(1, 8, output_throughput=20.0, completed=8)])
    res = parse_client_output(0, "progress noise\n" + good.to_json(indent=None), "", SPEC)
    assert res.error is None and res.level(64).output_throughput == 500.0


def test_run_gate_ssh_timeout_is_a_failure(tmp_path):
    calls = []

    def execute(cmd, timeout_s):
        calls.append(timeout_s)
        raise TimeoutError(f"command timed out after {timeout_s} s")

    def execute_prepared(cmd, timeout_s):
        if cmd.startswith("mkdir -p"):
            return 0, "", ""
        return execute(cmd, timeout_s)

    out = run_gate(SPEC,
                   GateHost(execute_prepared, upload=lambda a, b: None),
                   GateServer("http://127.0.0.1:30000", "/m", "/v"),
                   GateOptions(runner="builtin"))
    assert not out.passed
    assert out.verdict.failures[0].startswith("gate runner (builtin) failed: client wrote no JSON result; exit None")
    assert 600 < calls[0] <= 600 + 30                                  # just above the budget
    with pytest.raises(ValueError):
        run_gate(SPEC, GateHost(execute), GateServer("http://x:1", "/m", "/v"), GateOptions(runner="builtin"))


def test_a_gate_prepared_ahead_runs_with_one_command_and_a_failed_preparation_fails_it():
    """prepare_gate chooses the runner and puts the client in place before the server is up (a
    deploy does it while its server starts); the gate then sends its run alone. A client that
    could not be put in place is a failed gate naming why, and nothing is run."""
    sent = []

    def execute(cmd, timeout_s):
        sent.append(cmd.split()[0])
        if cmd.startswith("mkdir -p"):
            return 0, "", ""                                        # the 0700 folder, no client in it yet
        return 0, GateResult("builtin", [LevelResult(64, 128, output_throughput=500.0, completed=128),
                                         LevelResult(1, 8, output_throughput=20.0, completed=8)]).to_json(indent=None), ""

    uploads = []
    ready = prepare_gate(SPEC, GateHost(execute, upload=lambda a, b: uploads.append(b)), "/v", "builtin")
    assert (ready.runner, ready.error) == ("builtin", None) and uploads == ["/opt/dsv4deploy/gate/client.py"]
    sent.clear()
    out = run_gate(SPEC,
                   GateHost(execute, upload=lambda a, b: uploads.append(b)),
                   GateServer("http://127.0.0.1:30000", "/m", "/v"),
                   GateOptions(runner="builtin"),
                   prepared=ready)
    assert len(sent) == 1 and len(uploads) == 1 and out.result.error is None   # the run alone

    broken = prepare_gate(SPEC, GateHost(execute, upload=lambda a, b: False), "/v", "builtin")
    assert broken.error.startswith("ClientInstallError: uploading the gate client")
    sent.clear()
    out = run_gate(SPEC,
                   GateHost(execute, upload=lambda a, b: None),
                   GateServer("http://127.0.0.1:30000", "/m", "/v"),
                   GateOptions(runner="builtin"),
                   prepared=broken)
    assert not out.passed and sent == [] and "uploading the gate client" in out.result.error
