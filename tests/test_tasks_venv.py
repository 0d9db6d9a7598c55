"""The SGLang venv's pure parts (dsv4deploy/tasks/venv.py): what the host's uv installs on a real host and on
the twin, which parser the launch check runs, and what a passed check is remembered by."""

from __future__ import annotations

import copy
import os
import shlex

import pytest

from checkout import settings
from dsv4deploy.release import records as releases
from dsv4deploy.host.state import PARSER_LOCK
from dsv4deploy.release.rollout import rollout_for
from dsv4deploy.sglang.versions import lock_file, parser_lock_file
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
    assert what == "SGLang 0.5.23's own parser"
    assert parse == (f"{r.layout.venv}/bin/python -I -c {shlex.quote(LAUNCH_PARSER)} check "   # isolated
                     f"{r.layout.venv}/{PARSER_TABLE} {parser_key(r)}")


def test_the_twin_installs_the_real_wheel_and_what_its_parser_imports():
    r = rollout(twin())
    server, parser, wheel = installs(r)
    assert "huggingface-hub==1.33.0" in server and "--compile-bytecode" in server   # the server imports these
    assert f"-c {r.layout.venv}/{PARSER_LOCK} " in server                           # under the lock's pins
    assert parser.endswith(f"--python {r.layout.venv}/bin/python -r {r.layout.venv}/{PARSER_LOCK}")  # not compiled
    assert wheel.endswith(f"--python {r.layout.venv}/bin/python --no-deps sglang==0.5.23")
    assert launch_parser(r)[1] == "SGLang 0.5.23's own parser"
    lock = parser_lock_file("0.5.23").read_text().splitlines()
    assert "torch==2.13.0+cpu" in lock and not any(line.startswith("sglang==") for line in lock)


def test_the_stand_ins_pins_agree_with_the_parser_lock():
    """The stand-in's pins are installed under the lock's (-c): a pin that differs from the lock
    would fail every twin deploy at pip."""
    lock = {line.split("==")[0].lower().replace("_", "-"): line
            for line in parser_lock_file("0.5.23").read_text().splitlines() if "==" in line and not line.startswith("#")}
    for req in STAND_INS["sglang"]["requirements"]:
        name = req.split("==")[0].lower().replace("_", "-")
        assert lock.get(name, req).lower() == req.lower(), (req, lock.get(name))


def test_a_twin_told_so_or_a_release_without_a_parser_lock_keeps_the_twins_parser():
    for r in (rollout(twin(own_parser=False)), rollout(twin(), "nvfp4-ctx8k-sglang0513post1")):
        assert not any(PARSER_LOCK in c for c in installs(r))
        parse, what = launch_parser(r)
        assert parse.endswith("/bin/python -I -m ct200twin.server.args") and what.startswith("the twin's parser (stand-in")


def test_the_launch_checks_key_changes_with_the_argv_and_the_parser_not_with_the_unit(profile_dir):
    profile_dir.write("stop", "extends: nvfp4-ctx8k\nservice:\n  timeout_stop_s: 117\n")
    profile_dir.write("ctx", "extends: nvfp4-ctx8k\nserver:\n  context_length: 16384\n")
    base = launch_check_key(rollout(twin()))
    assert launch_check_key(rollout(twin(), "stop")) == base
    assert launch_check_key(rollout(twin(), "ctx")) != base
    assert launch_check_key(rollout(twin(own_parser=False))) != base
    assert launch_check_key(rollout(REAL)) != base


def test_the_captured_parser_table_is_keyed_by_the_venv_and_its_patches_not_by_the_argv(profile_dir):
    """A table captured in a venv that then changed (other installs, another patch) is not used."""
    profile_dir.write("ctx", "extends: nvfp4-ctx8k\nserver:\n  context_length: 16384\n")
    base = parser_key(rollout(twin()))
    assert parser_key(rollout(twin(), "ctx")) == base
    other = rollout(twin())
    other.data["sglang"]["patches"] = [{**other.data["sglang"]["patches"][0], "sha256": "0" * 64}]
    assert parser_key(other) != base
    assert parser_key(rollout(REAL)) != base


def test_a_refreshed_parser_lock_is_a_new_launch_check(monkeypatch, tmp_path):
    r = rollout(twin())
    base = launch_check_key(r)
    refreshed = tmp_path / "0.5.23.parser.lock"
    refreshed.write_text(parser_lock_file("0.5.23").read_text().replace("numpy==2.4.6", "numpy==2.4.7"))
    monkeypatch.setattr("dsv4deploy.tasks.venv.parser_lock_file", lambda version: refreshed)
    assert installs(r) == installs(rollout(twin())) and launch_check_key(r) != base


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


def test_extra_indexes_are_searched_for_the_best_match_as_pip_does(profile_dir):
    profile_dir.write("idx", "extends: nvfp4-ctx8k\nsglang:\n  extra_index_urls: [https://download.pytorch.org/whl/cu130]\n")
    (cmd,) = installs(rollout(REAL, "idx"))
    assert "--extra-index-url https://download.pytorch.org/whl/cu130 --index-strategy unsafe-best-match " in cmd


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
