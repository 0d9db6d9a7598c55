"""The SGLang venv's pure parts (dsv4deploy/tasks/venv.py): what the host's uv installs on a real host and on
the twin, which parser the launch check runs, and what a passed check is remembered by."""

from __future__ import annotations

import copy
import os
import re
import shlex

import pytest

from checkout import settings
from dsv4deploy.release import records as releases
from dsv4deploy.release.rollout import rollout_for
from dsv4deploy.sglang.versions import lock_file
from dsv4deploy.tasks.venv import LAUNCH_PARSER, PARSER_TABLE, installs, launch_check_key, launch_parser, parser_key

from ct200twin.host.stand_ins import STAND_INS, host_data

REAL = {"weights_source": {"type": "hf"}}


def twin(own_parser: bool = True) -> dict:
    stand_ins = copy.deepcopy(host_data())
    stand_ins["sglang"]["own_parser"] = own_parser
    return {"stand_ins": stand_ins, "weights_source": {"type": "rsync", "path": "/x"}}


def rollout(host_data: dict, profile: str = "nvfp4-ctx8k"):
    return rollout_for({**host_data, "profile": profile, "settings": settings()})


def test_a_real_host_installs_sglang_with_its_lock_and_parses_with_sglang():
    r = rollout(REAL)
    (cmd,) = installs(r)
    assert cmd.startswith("DSV4_UV_HOME=/opt/dsv4deploy/tools/uv-0.13.9/venv ")        # the host's pinned uv
    assert f"install --python {r.layout.venv}/bin/python --compile-bytecode " in cmd     # the service user runs it
    assert cmd.endswith(f"--require-hashes -r {r.layout.venv}/dsv4deploy.lock")        # the whole lock, hash-checked
    parse, what = launch_parser(r)
    assert what == "SGLang 0.5.23's own parser with its ServerArgs checks"       # prepare_without_gpu: true
    assert parse == (f"{r.layout.venv}/bin/python -I -c {shlex.quote(LAUNCH_PARSER)} check --prepare "   # isolated
                     f"{r.layout.venv}/{PARSER_TABLE} {parser_key(r)}")
    old = rollout(REAL, "nvfp4-ctx8k-sglang0513post1")                    # prepare_server_args needs a GPU there
    assert launch_parser(old)[1] == "SGLang 0.5.13.post1's own parser" and " check --prepare " not in launch_parser(old)[0]


def test_the_twin_installs_exactly_the_real_hosts_lock_by_the_same_command():
    """No CPU torch, no local wheel: the twin's venv is the real host's (the stand-in server's
    packages are pins of that lock, so nothing else is installed), and SGLang's own parser checks."""
    twin_r, real_r = rollout(twin()), rollout(REAL)
    assert installs(twin_r) == installs(real_r) and len(installs(twin_r)) == 1
    assert launch_parser(twin_r) == launch_parser(real_r)
    lock = lock_file("0.5.23").read_text()
    for req in STAND_INS["sglang"]["requirements"]:
        name, version = req.split("==")
        assert re.search(rf"^{re.escape(name)}=={re.escape(version)} ", lock, re.M | re.I), req


def test_a_stand_in_requirement_the_lock_lacks_is_installed_after_the_hosts_install():
    data = twin()
    data["stand_ins"]["sglang"]["requirements"] = [*data["stand_ins"]["sglang"]["requirements"], "rich==99.0"]
    r = rollout(data)
    host, extra = installs(r)
    assert host == installs(rollout(REAL))[0]
    assert extra.endswith(f"--compile-bytecode -c {r.layout.venv}/dsv4deploy.lock rich==99.0")


def test_a_twin_told_so_keeps_the_twins_parser_and_a_venv_without_torch():
    for profile in ("nvfp4-ctx8k", "nvfp4-ctx8k-sglang0513post1"):
        r = rollout(twin(own_parser=False), profile)
        server, wheel = installs(r)
        assert "--compile-bytecode -c " in server and "huggingface-hub==1.33.0" in server   # under the lock's pins
        assert wheel.endswith(f"--no-deps -c {r.layout.venv}/dsv4deploy.lock sglang=={r.data['sglang']['version']}")
        parse, what = launch_parser(r)
        assert parse.endswith("/bin/python -I -m ct200twin.server.args") and what.startswith("the twin's parser (stand-in")


def test_the_launch_checks_key_changes_with_the_argv_and_the_parser_not_with_the_unit(profile_dir):
    profile_dir.write("stop", "extends: nvfp4-ctx8k\nservice:\n  timeout_stop_s: 117\n")
    profile_dir.write("ctx", "extends: nvfp4-ctx8k\nserver:\n  context_length: 16384\n")
    base = launch_check_key(rollout(twin()))
    assert launch_check_key(rollout(twin(), "stop")) == base
    assert launch_check_key(rollout(twin(), "ctx")) != base
    assert launch_check_key(rollout(twin(own_parser=False))) != base
    assert launch_check_key(rollout(REAL)) == base             # the twin checks what a real host checks


def test_the_captured_parser_table_is_keyed_by_the_venv_and_its_patches_not_by_the_argv(profile_dir):
    """A table captured in a venv that then changed (other installs, another patch) is not used."""
    profile_dir.write("ctx", "extends: nvfp4-ctx8k\nserver:\n  context_length: 16384\n")
    base = parser_key(rollout(twin()))
    assert parser_key(rollout(twin(), "ctx")) == base
    other = rollout(twin())
    other.data["sglang"]["patches"] = [{**other.data["sglang"]["patches"][0], "sha256": "0" * 64}]
    assert parser_key(other) != base
    assert parser_key(rollout(REAL)) == base                    # the real host's venv: the same parser


def test_a_refreshed_lock_is_a_new_venv_and_a_new_launch_check(monkeypatch, tmp_path):
    r = rollout(twin())
    base, venv = launch_check_key(r), r.layout.venv
    refreshed = tmp_path / "0.5.23.lock"
    refreshed.write_text(lock_file("0.5.23").read_text().replace("\nnumpy==2.3.5 ", "\nnumpy==2.3.6 "))
    monkeypatch.setattr("dsv4deploy.sglang.versions.lock_file", lambda version: refreshed)
    monkeypatch.setattr("dsv4deploy.render.layout.lock_sha256", lambda version: "f" * 64)
    monkeypatch.setattr("dsv4deploy.tasks.venv.lock_sha256", lambda version: "f" * 64)
    again = rollout(twin())
    assert again.layout.venv != venv and launch_check_key(again) != base


def test_a_rollback_record_keeps_the_launch_check_of_the_release_it_restores():
    first = {**releases.new_record([], profile="p", content_hash="c", manifest_sha256="m", sglang_version="0.5.23",
                                   launch_check="k1"), "status": releases.DEPLOYED}
    back = releases.rollback_record([first], first, "gate failed")
    assert back["launch_check"] == "k1" and back["restores"] == 1


@pytest.mark.parametrize("value", ["SGLANG", "twin ", "real"])
def test_an_unknown_launch_check_choice_is_refused(value, monkeypatch):
    import importlib

    import ct200twin.host.stand_ins as stand_ins
    before = os.environ.get("DSV4_SIM_LAUNCH_CHECK")
    monkeypatch.setenv("DSV4_SIM_LAUNCH_CHECK", value)
    assert "DSV4_SIM_LAUNCH_CHECK" in importlib.reload(stand_ins).launch_check_problem()
    monkeypatch.delenv("DSV4_SIM_LAUNCH_CHECK")
    reloaded = importlib.reload(stand_ins)
    assert reloaded.OWN_PARSER and reloaded.launch_check_problem() is None     # unset: SGLang's own parser
    if before is not None:                             # leave the module as this process's environment says
        monkeypatch.setenv("DSV4_SIM_LAUNCH_CHECK", before)
        importlib.reload(stand_ins)


def test_a_named_index_gives_its_packages_only_and_nothing_is_best_matched(profile_dir):
    profile_dir.write("idx", "extends: nvfp4-ctx8k\nsglang:\n  indexes:\n    - {name: pytorch, url: "
                      "'https://download.pytorch.org/whl/cu130', packages: [torch, triton]}\n")
    (cmd,) = installs(rollout(REAL, "idx"))
    assert " --pinned-index pytorch:torch,triton=https://download.pytorch.org/whl/cu130 " in cmd
    assert "--extra-index-url" not in cmd and "--index-strategy" not in cmd


def test_the_twin_server_archive_is_the_same_bytes_every_run_and_holds_only_what_it_imports():
    """Its hash decides whether the twin's server is replaced: built twice, the same bytes; inside,
    the twin's server package and the product's data, no byte-code. The inventory hands the deploy
    its path, and the deploy uploads exactly those bytes."""
    import io
    import tarfile
    from pathlib import Path

    from ct200twin.host.stand_ins import server_archive
    from dsv4deploy.tasks.venv import stand_in_archive

    first = server_archive()
    assert server_archive() == first
    with tarfile.open(fileobj=io.BytesIO(first), mode="r:gz") as tar:
        names = tar.getnames()
    assert "ct200twin/server/main.py" in names and "dsv4deploy/__init__.py" in names
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    assert not any(n.startswith(("dsv4deploy/tasks/", "dsv4deploy/host/", "ct200twin/host/")) for n in names)
    r = rollout(twin())
    assert Path(r.stand_ins["sglang"]["bundle"]).read_bytes() == first == stand_in_archive(r)


def _without(*path):
    def change(stand_ins):
        for key in path[:-1]:
            stand_ins = stand_ins[key]
        del stand_ins[path[-1]]
    return change


@pytest.mark.parametrize("change, said", [
    (_without("launch_check_module"), r"stand_ins\.launch_check_module"),
    (_without("server_module"), r"stand_ins\.server_module"),
    (_without("sglang", "bundle"), r"stand_ins\.sglang\.bundle: the path"),
    (lambda s: s["sglang"].update(bundle="/nonexistent/server.tar.gz"), "/nonexistent/server.tar.gz: no such file"),
    (lambda s: s.update(driver=True), r"stand_ins\.driver\.install"),
])
def test_a_stand_in_that_leaves_out_a_part_is_refused_before_anything_runs(change, said):
    """The product assumes nothing of a stand-in: what the inventory leaves out is named."""
    from pyinfra.api import DeployError

    data = twin()
    change(data["stand_ins"])
    with pytest.raises(DeployError, match=said):
        rollout(data)


def test_the_twins_hub_client_is_the_real_hosts_lock():
    """The twin downloads with the huggingface_hub (and hf-xet) the real host's lock installs, in
    every twin mode: the pins come from the lock, so a new lock moves the twin too."""
    from ct200twin.host.stand_ins import host_lock_pins

    lock = lock_file("0.5.23").read_text().splitlines()
    reqs = STAND_INS["sglang"]["requirements"]
    for name in ("huggingface_hub", "hf-xet"):
        pin = next(line.split(" ;")[0] for line in lock
                   if line.lower().replace("_", "-").startswith(name.replace("_", "-") + "=="))
        assert pin in reqs and host_lock_pins(name) == [pin]
