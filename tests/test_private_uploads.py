"""Every upload goes through the private staging path (host/io.py staged(): the SSH user's 0700
folder), never pyinfra's /tmp/pyinfra-<sha1> name root would copy: a profile patch with `url:`
(fetched and checked here, uploaded like a local patch) and an rsync weights source (each file the
host lacks at its size, streamed)."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import grp
import importlib
import os
import pwd
import shutil
import subprocess
import threading

import pytest
from pyinfra.api import Config, DeployError, FileUploadCommand, Inventory, State
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host, ctx_state

from checkout import settings
from dsv4deploy.host import io as hostio
from dsv4deploy.host import ops
from dsv4deploy.host.state import HostState
from dsv4deploy.release.rollout import rollout_for
from dsv4deploy.tasks import venv as tv

STAGING = "/home/deploy/.cache/dsv4deploy-upload"


class Out:
    def __init__(self, stdout=""):
        self.stdout, self.stderr = stdout, ""


class SudoHost:
    """A host reached as `deploy` with sudo: records every command and upload. LISTING: what the
    host's `find` prints; RUN: run each command here too (sh -c), and each upload copies the file."""

    def __init__(self, listing: str = "", run: bool = False):
        self.name, self.print_prefix = f"sudo-{id(self)}", ""
        self.data = type("Data", (), {"_sudo": True, "ssh_user": "deploy"})()
        self.calls: list[tuple] = []
        self.listing, self.really = listing, run

    def run_shell_command(self, command, **kwargs):
        self.calls.append(("run", str(command), kwargs))
        if command == hostio.STAGING_COMMAND:
            return True, Out(STAGING + "\n")
        if self.really:
            done = subprocess.run(["sh", "-c", str(command)], capture_output=True, text=True)
            return done.returncode == 0, Out(done.stdout)
        return True, Out(self.listing if str(command).startswith("find ") else "")

    def put_file(self, src, dest, **kwargs):
        self.calls.append(("put", dest, kwargs, src))
        if self.really:
            shutil.copyfile(src, dest)
        return True


def _no_pyinfra_temp_names(calls: list[tuple]) -> None:
    for call in calls:
        remote = repr(call[:3])          # a put's 4th item is the local source
        assert "/tmp/pyinfra-" not in remote and "/tmp/" not in remote, call
        if call[0] == "put":
            assert call[2]["remote_temp_filename"].startswith(f"{STAGING}/"), call   # staged privately


def test_a_pushed_folder_uploads_only_what_the_host_lacks_at_its_size_through_the_private_folder(tmp_path):
    sizes = {"config.json": 10, "model-00001.safetensors": 3_000, "model-00002.safetensors": 3_000}
    listing = "10\tconfig.json\n1000\tmodel-00001.safetensors\n77\t.dsv4deploy-verified.json\n"
    h = SudoHost(listing)
    assert ops._upload_tree(None, h, str(tmp_path), "/srv/m/c", sizes, ("dsv4-fetch", "dsv4-fetch", "644"))
    puts = [c for c in h.calls if c[0] == "put"]
    # the truncated shard and the missing one, each streamed from its path (not read into memory)
    assert [(c[1], c[3]) for c in puts] == [("/srv/m/c/model-00001.safetensors.dsv4deploy-tmp",
                                             f"{tmp_path}/model-00001.safetensors"),
                                            ("/srv/m/c/model-00002.safetensors.dsv4deploy-tmp",
                                             f"{tmp_path}/model-00002.safetensors")]
    assert all(c[2]["_sudo"] for c in h.calls if c[0] != "run" or c[1] != hostio.STAGING_COMMAND)
    _no_pyinfra_temp_names(h.calls)


def test_a_pushed_folder_on_a_host_here_repairs_what_is_cut_makes_folders_and_deletes_nothing(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    (src / "sub").mkdir(parents=True)
    files = {"a.safetensors": b"a" * 5000, "b.safetensors": b"b" * 4000, "sub/tokenizer.json": b"{}"}
    for rel, body in files.items():
        (src / rel).write_bytes(body)
    dest.mkdir()
    (dest / "a.safetensors").write_bytes(b"a" * 5000)        # already there: left as it is
    (dest / "b.safetensors").write_bytes(b"b" * 10)          # cut short: replaced
    (dest / "extra.txt").write_text("mine")                  # not the source's: kept
    inode = (dest / "a.safetensors").stat().st_ino
    me, group = pwd.getpwuid(os.getuid()).pw_name, grp.getgrgid(os.getgid()).gr_name
    h = SudoHost(run=True)
    assert ops._upload_tree(None, h, str(src), str(dest), {r: len(b) for r, b in files.items()}, (me, group, "644"))
    assert {rel: (dest / rel).read_bytes() for rel in files} == files
    assert (dest / "a.safetensors").stat().st_ino == inode and (dest / "extra.txt").read_text() == "mine"
    assert oct((dest / "sub/tokenizer.json").stat().st_mode & 0o777) == "0o644"
    assert [c[1] for c in h.calls if c[0] == "put"] == [f"{dest}/b.safetensors.dsv4deploy-tmp",
                                                        f"{dest}/sub/tokenizer.json.dsv4deploy-tmp"]
    assert not list(dest.rglob("*.dsv4deploy-tmp"))
    h.calls.clear()
    assert ops._upload_tree(None, h, str(src), str(dest), {r: len(b) for r, b in files.items()}, (me, group, "644"))
    assert [c[0] for c in h.calls] == ["run"]                # again: one listing, nothing uploaded


def test_a_source_file_gone_mid_push_fails_the_operation_with_one_line(tmp_path):
    h = SudoHost(run=False)
    h.put_file = lambda *a, **k: (_ for _ in ()).throw(FileNotFoundError(2, "No such file or directory"))
    assert ops._upload_tree(None, h, str(tmp_path), "/srv/m/c", {"x": 1}, ("u", "u", "644")) is False


# --- a profile patch with url: ------------------------------------------------------------------

@pytest.fixture
def served():
    """A patch served over HTTP on 127.0.0.1: (url, body, requests seen)."""
    body = b"--- a/sglang/x.py\n+++ b/sglang/x.py\n@@ -1 +1 @@\n-a\n+b\n"
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/x.patch", body, seen
    server.shutdown()


def _plan(step, r, state: HostState) -> list:
    """(operation name, command) for what STEP plans on a host (pyinfra's own plan, no connection)."""
    inventory = Inventory((["@local"], {}))
    pstate = State(inventory, Config())
    h = inventory.get_host("@local")
    pstate.activate_host(h)
    pstate.current_stage = StateStage.Prepare
    with ctx_state.use(pstate), ctx_host.use(h):
        step(r, state)
        return [(next(iter(pstate.get_op_meta(op).names)), c) for op in pstate.get_op_order()
                for c in pstate.get_op_data_for_host(h, op).command_generator()]


def _planned(r, state: HostState) -> list:
    """The commands sglang_venv plans."""
    return _plan(tv.sglang_venv, r, state)


def _url_patch_rollout(url: str, sha256: str, cache):
    r = rollout_for({"weights_source": {"type": "hf"}, "profile": "nvfp4-ctx8k", "settings": settings()})
    r.data["sglang"]["patches"] = [{"name": "fix-x", "url": url, "sha256": sha256, "strip": 1}]
    return dataclasses.replace(r, settings=dataclasses.replace(r.settings, cache=cache))


def _held(r, patch_sha: str | None) -> HostState:
    """A host whose venv is filled; its patch file has PATCH_SHA (None: no patch file)."""
    venv = r.layout.venv
    files = {f"{venv}/bin/python": {"type": "file"}}
    if patch_sha:
        files[f"{venv}/patches/fix-x.patch"] = {"type": "file", "mode": "644", "user": "root", "group": "root",
                                                 "sha256": patch_sha}
    return HostState(values={"venv": tv.venv_marker(r), "files": files, "basics": {"python": "3.11"}})


def test_a_url_patch_is_fetched_here_checked_and_uploaded_like_a_local_one(served, tmp_path):
    url, body, seen = served
    r = _url_patch_rollout(url, hashlib.sha256(body).hexdigest(), tmp_path)
    planned = _planned(r, _held(r, None))
    writes = [str(c) for name, c in planned if "| patch fix-x" in name]
    assert seen == ["/x.patch"] and len(writes) == 1 and "/tmp/pyinfra-" not in " ".join(map(str, planned))
    assert writes[0].endswith(f"mv -f {r.layout.venv}/patches/fix-x.patch.dsv4deploy-tmp "
                              f"{r.layout.venv}/patches/fix-x.patch")
    assert any(name.endswith("| apply fix-x") for name, _ in planned)
    # kept here by its sha256: the next host or deploy fetches nothing
    assert tv.url_patch(r.data["sglang"]["patches"][0], tmp_path) == body and seen == ["/x.patch"]


def test_a_host_that_holds_the_pinned_patch_gets_no_fetch_and_no_upload(served, tmp_path):
    url, body, seen = served
    digest = hashlib.sha256(body).hexdigest()
    r = _url_patch_rollout(url, digest, tmp_path)
    planned = _planned(r, _held(r, digest))
    assert seen == [] and not any("| patch fix-x" in name for name, _ in planned)


def test_a_url_patch_whose_sha256_differs_is_refused_naming_it_and_nothing_is_uploaded(served, tmp_path):
    url, body, seen = served
    r = _url_patch_rollout(url, "0" * 64, tmp_path)
    with pytest.raises(DeployError, match=r"^patch fix-x: http://127\.0\.0\.1:\d+/x\.patch has sha256 "
                                          rf"{hashlib.sha256(body).hexdigest()}, the profile pins sha256 0{{64}}: "
                                          "nothing uploaded$"):
        _planned(r, _held(r, None))
    assert seen == ["/x.patch"] and list(tmp_path.rglob("*.patch")) == []     # not kept either


def test_an_unreachable_patch_url_is_one_line_naming_the_patch(tmp_path):
    with pytest.raises(DeployError, match=r"^patch fix-x: cannot fetch http://127\.0\.0\.1:9/x\.patch: "):
        tv.url_patch({"name": "fix-x", "url": "http://127.0.0.1:9/x.patch", "sha256": "0" * 64}, tmp_path, timeout=5)


# --- the rsync weights source ------------------------------------------------------------------

def _planned_weights(r, state: HostState) -> list:
    weights = importlib.import_module("dsv4deploy.tasks.weights")    # the package exports the step by this name
    return [(name.split(" | ")[-1], c) for name, c in _plan(weights.weights, r, state)]


def test_an_unproven_copy_is_verified_first_so_a_wrong_one_is_pushed_again_in_the_same_run(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "model.safetensors.index.json").write_text('{"weight_map": {"w": "model-1.safetensors"}}')
    (folder / "model-1.safetensors").write_bytes(b"w" * 100)
    r = rollout_for({"weights_source": {"type": "rsync", "path": str(folder)}, "profile": "nvfp4-ctx8k",
                     "settings": dataclasses.replace(settings(), cache=tmp_path / "cache")})
    state = HostState(values={"files": {}, "checkpoint": {"complete": False, "problems": [],
                                                          "unverified": ["model-1.safetensors"]}})
    planned = _planned_weights(r, state)
    names = list(dict.fromkeys(name for name, _ in planned))
    assert [n.split(" (")[0] for n in names] == ["model dir", "verify the copies not yet proven", f"push {folder}",
                                                 "verify every file by size and sha256 against the source"]
    repair = [str(c) for name, c in planned if name.startswith("verify the copies")]
    assert repair[-1].endswith("|| true") and "--remove-bad" in repair[-1]       # the wrong ones go, the run goes on
    (push,) = [c for name, c in planned if name.startswith("push ")]
    assert push.args[:3] == (str(folder), r.layout.model_dir, {"model-1.safetensors": 100,
                                                               "model.safetensors.index.json": 44})
    assert not any(isinstance(c, FileUploadCommand) for _, c in planned)        # no pyinfra upload planned
