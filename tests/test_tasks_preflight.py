"""Preflight's disk check, without a host: what is still written, per file system
(dsv4deploy/preflight/disk.py), and the host read's fact that feeds it (host/facts.py DiskRoom)."""

import subprocess

import pytest

from dsv4deploy.host.facts import DiskRoom
from dsv4deploy.preflight.disk import GIB, Room, disk_problems, venv_need, weights_need
from dsv4deploy.render.layout import MODELS, OPT

ONE = {MODELS: Room("64769", "/", 200 * GIB), OPT: Room("64769", "/", 200 * GIB)}


def two(models_free_gib: float, opt_free_gib: float) -> dict:
    return {MODELS: Room("2049", "/srv", int(models_free_gib * GIB)), OPT: Room("64769", "/", int(opt_free_gib * GIB))}


def test_weights_already_on_disk_are_not_asked_for_again():
    # 140 of 148.66 GiB are there (complete shards and a partial one): 8.66 GiB still come
    need = weights_need(MODELS, 148.66, 140 * GIB)
    assert round(need.bytes / GIB, 2) == 8.66
    assert "8.7 GiB still to come (148.66 GiB, 140.00 GiB already there)" in need.what
    assert disk_problems([need], two(10, 0)) == []            # 8.66 x 1.05 = 9.1 GiB fit in 10
    # a fresh host needs it all; more bytes than the checkpoint (an older revision's) count as all of it
    assert weights_need(MODELS, 148.66, None).bytes == int(148.66 * GIB)
    assert weights_need(MODELS, 148.66, 200 * GIB).bytes == 0


def test_one_file_system_adds_the_weights_and_the_venv():
    needs = [weights_need(MODELS, 100, 0), venv_need(OPT, 10, False, "SGLang 0.5.23 venv")]
    room = {p: Room("64769", "/", int(110 * GIB)) for p in (MODELS, OPT)}
    assert disk_problems(needs, room) == [
        f"not enough disk for {MODELS} and {OPT} (file system at /): 110.0 GiB free, 115.5 GiB needed: "
        "the weights' 100.0 GiB still to come (100.00 GiB) + the SGLang 0.5.23 venv's 10.0 GiB + 5% spare"]
    assert disk_problems(needs, {p: Room("64769", "/", int(115.5 * GIB)) for p in (MODELS, OPT)}) == []


def test_two_file_systems_are_judged_each_on_its_own():
    needs = [weights_need(MODELS, 100, 0), venv_need(OPT, 10, False, "SGLang 0.5.23 venv")]
    assert disk_problems(needs, two(110, 20)) == []            # each fits where it goes
    said = disk_problems(needs, two(110, 5))
    assert said == [f"not enough disk for {OPT} (file system at /): 5.0 GiB free, 10.5 GiB needed: "
                    "the SGLang 0.5.23 venv's 10.0 GiB + 5% spare"]
    assert len(disk_problems(needs, two(50, 5))) == 2          # both short: one line each


def test_a_venv_the_host_holds_and_a_complete_checkpoint_need_nothing():
    needs = [weights_need(MODELS, 148.66, 148.66 * GIB), venv_need(OPT, 9.5, True, "SGLang 0.5.23 venv")]
    assert [n.bytes for n in needs] == [0, 0]
    assert disk_problems(needs, two(0, 0)) == []               # a full disk is no problem when nothing comes


def test_a_failed_df_is_not_reported_as_a_full_disk():
    said = disk_problems([weights_need(MODELS, 1000, 0)], {})
    assert said == [f"could not read the free disk space under {MODELS} (df printed nothing usable); "
                    "1000.0 GiB are needed there for the weights' 1000.0 GiB still to come (1000.00 GiB)"]


def test_the_host_read_counts_complete_and_partial_files(tmp_path):
    # the deploy's folders may not exist yet: the nearest existing parent's file system counts
    model = tmp_path / "models" / "repo" / "rev"
    (model / ".cache" / "huggingface" / "download").mkdir(parents=True)
    (model / "model-00001-of-00002.safetensors").write_bytes(b"x" * 3000)
    (model / ".cache" / "huggingface" / "download" / "model-00002-of-00002.safetensors.incomplete").write_bytes(b"y" * 1000)
    fact = DiskRoom()
    absent = str(tmp_path / "opt" / "dsv4deploy")
    out = subprocess.run(["sh", "-c", fact.command([str(tmp_path / "models"), absent], str(model))],
                         capture_output=True, text=True, check=True).stdout
    found = fact.process(out.splitlines())
    assert found["present_bytes"] >= 4000                      # du counts the folders' own entries too
    rooms = found["rooms"]
    assert set(rooms) == {str(tmp_path / "models"), absent}
    assert rooms[absent]["device"] == rooms[str(tmp_path / "models")]["device"] and rooms[absent]["free_bytes"] > 0
    assert fact.process(["room\t/srv\t\t2049 /srv"]) == {"rooms": {}, "present_bytes": 0}   # df said nothing


def test_what_a_deploy_still_writes_is_read_from_the_host_s_state():
    """disk_needs on a fresh host, a host holding the venv and the complete checkpoint, and a twin
    whose venv holds a stand-in (host data stand_ins.sglang.venv_gib: its own size, not SGLang's)."""
    from checkout import settings
    from dsv4deploy.host.state import HostState
    from dsv4deploy.release.rollout import rollout_for
    from dsv4deploy.tasks.preflight import disk_needs
    from dsv4deploy.tasks.venv import venv_marker

    r = rollout_for({"weights_source": {"type": "hf"}, "profile": "nvfp4-ctx8k", "settings": settings()})
    fresh = HostState(values={"disk": {"present_bytes": 40 * GIB}})
    weights, venv = disk_needs(r, fresh)
    assert (weights.path, round(weights.bytes / GIB, 2)) == (MODELS, 108.66)      # 148.66 less the 40 there
    assert (venv.path, venv.bytes, venv.what) == (OPT, int(9.5 * GIB), "the SGLang 0.5.23 venv's 9.5 GiB")
    held = HostState(values={"venv": venv_marker(r), "files": {f"{r.layout.venv}/bin/python": {"type": "file"}},
                             "checkpoint": {"complete": True, "marker": True}, "disk": {"present_bytes": 0}})
    assert [n.bytes for n in disk_needs(r, held)] == [0, 0]

    from ct200twin.host.stand_ins import host_data
    stand_in = host_data()
    stand_in["sglang"] = {**stand_in["sglang"], "venv_gib": 0.25}
    twin = rollout_for({"weights_source": {"type": "rsync", "path": "/x", "size_gib": 0.01}, "stand_ins": stand_in,
                        "profile": "nvfp4-ctx8k", "settings": settings()})
    assert [n.bytes for n in disk_needs(twin, HostState(values={}))] == [int(0.01 * GIB), int(0.25 * GIB)]


@pytest.mark.parametrize("size", ["9.5", 0, -1, True])
def test_a_stand_in_venv_size_that_is_no_size_is_refused(size):
    from dsv4deploy.release.rollout import stand_in_problems

    from ct200twin.host.stand_ins import host_data
    stand_in = host_data()
    stand_in["sglang"] = {**stand_in["sglang"], "venv_gib": size}
    assert stand_in_problems(stand_in) == [
        f"stand_ins.sglang.venv_gib: {size!r}: the stand-in venv's size on disk, GiB > 0"]
