"""The mask-secrets patch for SGLang 0.5.23: it applies like the deploy applies it, once, and the
patched SGLang code itself no longer shows the API key where it showed it.

SGLang is the real 0.5.23 wheel of the CPU parser venv (tests/tools/sglang_parser.py; built here
if missing, as in test_sglang_parser.py, never skipped). Its ``sglang`` package is copied twice
into temp dirs (the shared cache is never touched): one copy gets the patch, the other stays
pristine as the negative control. tests/tools/sglang_mask_probe.py then runs, with the venv's
python and the copy first on PYTHONPATH, SGLang's own ``prepare_server_args`` on an argv that
passes the key through ``--config FILE`` (as the rendered unit does), evaluates engine.py's
``server_args=`` log f-strings and awaits http_server.py's ``/server_info`` and
``/get_server_info`` handlers, as written in that copy.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))
import sglang_parser  # noqa: E402

from dsv4deploy import PACKAGE_DATA  # noqa: E402
from dsv4deploy.sglang import patches  # noqa: E402
from dsv4deploy.sglang import patching  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
PATCH = patches.MASK_SECRETS_PATCH
PATCH_FILE = REPO / PATCH["file"]
README = PATCH_FILE.parent / "README.md"
PROBE = Path(__file__).resolve().parent / "tools" / "sglang_mask_probe.py"
MASK = patches.MASK

API_KEY = "sk-test-1234567890abcdef-mask"          # in the --config file, as on the host
EQ_KEY = "sk-eq-flag-0011223344"                    # --api-key=VALUE on the command line
ADMIN_KEY = "sk-admin-abbrev-5566778899"            # --admin-api VALUE (an argparse abbreviation)
SSL_PASSWORD = "pw-ssl-keyfile-31415926"            # --ssl-keyfile-password VALUE
SECRETS = (API_KEY, EQ_KEY, ADMIN_KEY, SSL_PASSWORD)


def _patch_files(patch_text: str) -> list[str]:
    return [line.split()[1][2:] for line in patch_text.splitlines() if line.startswith("--- a/")]


def _sh(cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


def _apply_like_deploy(site: Path) -> dict:
    """What the deploy's venv step does (the PatchesApplied fact's check, then `patch`), with the
    forward dry-run before and the reverse dry-run after spelled out. Returns what happened."""
    strip = int(PATCH["strip"])
    detect = _sh(patching.state_command(str(site), str(PATCH_FILE), strip))
    if patching.parse_state(detect.stdout.splitlines()):
        forward = _sh(f"cd {site} && patch -p{strip} --forward --dry-run < {PATCH_FILE}")
        return {"already": True, "forward_dry_run_rc": forward.returncode}
    forward = _sh(f"cd {site} && patch -p{strip} --forward --dry-run < {PATCH_FILE}")
    assert forward.returncode == 0, f"forward dry-run on pristine SGLang failed:\n{forward.stdout}"
    applied = _sh(f"cd {site} && patch -p{strip} -s -f --no-backup-if-mismatch < {PATCH_FILE}")
    assert applied.returncode == 0, f"patch failed:\n{applied.stdout}"
    reverse = _sh(f"cd {site} && patch -p{strip} -R --dry-run < {PATCH_FILE}")
    assert reverse.returncode == 0, f"reverse dry-run after applying failed:\n{reverse.stdout}"
    return {"already": False}


def _digests(site: Path, rels: list[str]) -> dict:
    return {rel: hashlib.sha256((site / rel).read_bytes()).hexdigest() for rel in rels}


@pytest.fixture(scope="session")
def sglang_parser_venv():
    """The SGLang 0.5.23 parser venv, built here if it is missing (CI starts without it)."""
    return sglang_parser.ensure(PATCH["sglang_version"])


@pytest.fixture(scope="module")
def trees(sglang_parser_venv, tmp_path_factory):
    """Two copies of the venv's sglang package: (pristine site, patched site, apply records)."""
    venv_site = next((sglang_parser.venv_dir(PATCH["sglang_version"]) / "lib")
                     .glob("python3.*/site-packages"))
    root = tmp_path_factory.mktemp("sglang-mask")
    pristine, patched = root / "pristine", root / "patched"
    for site in (pristine, patched):
        shutil.copytree(venv_site / "sglang", site / "sglang", symlinks=True)
    rels = _patch_files(PATCH_FILE.read_text())
    before = _digests(patched, rels)
    first = _apply_like_deploy(patched)
    after_first = _digests(patched, rels)
    second = _apply_like_deploy(patched)
    after_second = _digests(patched, rels)
    return {"pristine": pristine, "patched": patched, "rels": rels, "before": before,
            "first": first, "after_first": after_first, "second": second,
            "after_second": after_second}


@pytest.fixture(scope="module")
def probed(trees, sglang_parser_venv, tmp_path_factory):
    """The probe's answers from each copy, for the same argvs."""
    tmp = tmp_path_factory.mktemp("sglang-mask-config")
    config = tmp / "secret-args.yaml"          # stand-in for the systemd credential file
    config.write_text(f'api-key: "{API_KEY}"\n')
    argvs = [
        ["--model-path", "/m", "--tp-size", "4", "--config", str(config)],
        ["--model-path", "/m", f"--api-key={EQ_KEY}", "--admin-api", ADMIN_KEY,
         "--ssl-keyfile-password", SSL_PASSWORD],
    ]
    out = {}
    for name in ("pristine", "patched"):
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONDONTWRITEBYTECODE")}
        env.update(PYTHONPATH=str(trees[name]), CUDA_VISIBLE_DEVICES="", PYTHONNOUSERSITE="1")
        proc = subprocess.run([str(sglang_parser_venv), str(PROBE)], input=json.dumps({"argvs": argvs}),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert proc.returncode == 0, f"probe on the {name} copy failed:\n{proc.stderr[-4000:]}"
        answer = json.loads(proc.stdout)
        assert Path(answer["sglang_file"]).is_relative_to(trees[name]), \
            f"the probe imported {answer['sglang_file']}, not the {name} copy"
        assert answer["version"] == PATCH["sglang_version"]
        out[name] = answer["results"]
    return out


def _shown(result: dict) -> dict[str, str]:
    """Every surface, as text."""
    shown = {f"log line engine.py:{entry['line']}": entry["text"] for entry in result["log_lines"]}
    shown.update({"repr": result["repr"], "f'{server_args=}'": result["self_documenting"],
                  "launch_command": result["launch_command"] or "",
                  "/server_info": result["server_info_json"],
                  "/get_server_info": result["get_server_info_json"]})
    return shown


# --- the patch file -----------------------------------------------------------------------------

def test_patch_sha256_is_the_pinned_one():
    digest = hashlib.sha256(PATCH_FILE.read_bytes()).hexdigest()
    assert digest == PATCH["sha256"], f"{PATCH_FILE.name} changed: sha256 {digest}"
    readme = README.read_text()
    section = readme[readme.index(f"## {PATCH_FILE.name}"):]
    pinned = re.search(r"\| sha256 \| `([0-9a-f]{64})` \|", section)
    assert pinned and pinned.group(1) == digest, "README.md's sha256 is not the patch's"
    assert f"| size | {PATCH_FILE.stat().st_size} bytes |" in section
    assert (Path(str(PACKAGE_DATA / "patches")) / PATCH_FILE.name).read_bytes() == PATCH_FILE.read_bytes()  # installed
    assert patches.profile_entry() == {k: PATCH[k] for k in ("name", "file", "sha256", "strip")}


def test_patch_touches_the_files_the_markers_name():
    assert _patch_files(PATCH_FILE.read_text()) == list(patches.MASK_SECRETS_MARKERS)


# --- applying it --------------------------------------------------------------------------------

def test_patch_applies_once_like_the_deploy(trees):
    assert trees["first"] == {"already": False}
    assert trees["after_first"] != trees["before"]
    # second run: the deploy's PatchesApplied fact sees it, nothing is written, and a forward
    # apply would be refused
    assert trees["second"]["already"] is True
    assert trees["second"]["forward_dry_run_rc"] != 0
    assert trees["after_second"] == trees["after_first"]
    # the pristine copy is untouched and detected as such
    assert _digests(trees["pristine"], trees["rels"]) == trees["before"]


def test_marker_detects_the_patched_tree(trees):
    assert patches.mask_secrets_applied(trees["patched"]) is True
    assert patches.mask_secrets_applied(trees["pristine"]) is False
    text = (trees["patched"] / "sglang/srt/sampling/watermarking/config.py").read_text()
    assert patches.MASK_SECRETS_MARKERS["sglang/srt/sampling/watermarking/config.py"] in text.splitlines()


def test_patch_reverses_to_the_pristine_bytes(trees, tmp_path):
    scratch = tmp_path / "site"
    for rel in trees["rels"]:
        (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(trees["patched"] / rel, scratch / rel)
    proc = _sh(f"cd {scratch} && patch -p1 -R -s -f --no-backup-if-mismatch < {PATCH_FILE}")
    assert proc.returncode == 0, proc.stdout
    assert _digests(scratch, trees["rels"]) == trees["before"]


# --- what the patched SGLang shows --------------------------------------------------------------

def test_server_args_log_lines_are_masked(probed):
    """(a) engine.py's startup `server_args=` lines: the mask, never the key."""
    for result in probed["patched"]:
        lines = result["log_lines"]
        assert [entry["line"] for entry in lines] == [311, 1185], \
            "engine.py's server_args= log calls moved: re-check the patch against it"
        for entry in lines:
            assert entry["source"] == "f'server_args={_server_args_for_logging(server_args)}'"
            for secret in SECRETS:
                assert secret not in entry["text"], f"engine.py:{entry['line']} logs {secret}"
            assert f"'api_key': '{MASK}'" in entry["text"]
    first = probed["patched"][0]["log_lines"][0]["text"]
    assert "'admin_api_key': None" in first       # unset stays visible as unset


def test_server_info_is_masked(probed):
    """(b) /server_info and /get_server_info: fields, internal_states and launch_command."""
    via_config, via_flags = probed["patched"]
    for result in (via_config, via_flags):
        for endpoint in ("server_info", "get_server_info"):
            info = result[endpoint]
            for secret in SECRETS:
                assert secret not in result[f"{endpoint}_json"], f"/{endpoint} shows {secret}"
            assert info["api_key"] == MASK
            assert info["internal_states"][0]["api_key"] == MASK
            assert info["version"] == PATCH["sglang_version"]
    cfg = via_config["server_info"]
    assert cfg["admin_api_key"] is None and cfg["ssl_keyfile_password"] is None
    # the --config merge put `--api-key <key>` in front of the argv launch_command is built from
    assert cfg["launch_command"] == f"--api-key {MASK} --model-path /m --tp-size 4"
    assert cfg["model_path"] == "/m" and cfg["tp_size"] == 4          # the rest is untouched
    flags = via_flags["server_info"]
    assert flags["admin_api_key"] == MASK and flags["ssl_keyfile_password"] == MASK
    assert flags["launch_command"] == (f"--model-path /m --api-key={MASK} --admin-api {MASK} "
                                       f"--ssl-keyfile-password {MASK}")


def test_repr_is_masked(probed):
    for result in probed["patched"]:
        for text in (result["repr"], result["self_documenting"]):
            for secret in SECRETS:
                assert secret not in text
            assert f"api_key='{MASK}'" in text


def test_the_real_key_is_still_on_the_record(probed):
    """(c) what auth reads (ServerArgs.api_key & co, published to get_serving()) is the real key."""
    via_config, via_flags = probed["patched"]
    assert via_config["api_key"] == API_KEY
    assert via_flags["api_key"] == EQ_KEY
    assert via_flags["admin_api_key"] == ADMIN_KEY
    assert via_flags["ssl_keyfile_password"] == SSL_PASSWORD


def test_pristine_sglang_shows_the_key(probed):
    """Negative control: the same probe on the unpatched copy finds the key everywhere."""
    via_config, via_flags = probed["pristine"]
    for surface, text in _shown(via_config).items():
        assert API_KEY in text, f"pristine SGLang's {surface} does not show the key: probe is blind"
    assert via_config["server_info"]["launch_command"] == \
        f"--api-key {API_KEY} --model-path /m --tp-size 4"
    assert via_config["api_key"] == API_KEY
    for secret in (EQ_KEY, ADMIN_KEY, SSL_PASSWORD):
        assert secret in via_flags["server_info_json"]
    for surface, text in _shown(probed["patched"][0]).items():
        assert API_KEY not in text, f"patched SGLang's {surface} shows the key"
