"""profiles/<base>-tuned.yaml: extends the base, holds only the chosen values, validates, and
never replaces a profile the tune did not write."""

from __future__ import annotations

import pytest
import yaml

from dsv4deploy.profile.errors import ProfileError
from checkout import load_profile, profiles_dir
from dsv4deploy.tune import tuned
from dsv4deploy.tune.command import prepare
from dsv4deploy.tune.tuned import MARKER, write_tuned
from dsv4deploy.profile.validate import validate


@pytest.fixture(autouse=True)
def _no_shipped_tuned_profile(request):
    """These tests write fp8-ctx1m-baseline-tuned.yaml themselves: start without the shipped one."""
    if "profile_dir" in request.fixturenames:
        request.getfixturevalue("profile_dir").path.joinpath("fp8-ctx1m-baseline-tuned.yaml").unlink(missing_ok=True)


@pytest.fixture
def chosen(profile_dir):
    prep = prepare("fp8-ctx1m-baseline", ["server.context_length=8192", "server.mem_fraction_static=0.7,0.75"], directory=profiles_dir())
    return next(c for c in prep.candidates if c.overrides == {"server.context_length": 8192,
                                                              "server.mem_fraction_static": 0.75})


def write(profile_dir, cand):
    return write_tuned("fp8-ctx1m-baseline", cand, description="fp8 tuned: test", notes=["Report: here"],
                       directory=profile_dir.path)


def test_the_tuned_profile_extends_the_base_holds_only_the_chosen_values_and_validates(profile_dir, chosen):
    path = write(profile_dir, chosen)
    assert path == profile_dir.path / "fp8-ctx1m-baseline-tuned.yaml"
    text = path.read_text()
    assert text.splitlines()[0] == "# yaml-language-server: $schema=../dsv4deploy/schema/profile.schema.json"
    assert MARKER in text.splitlines()[1]
    doc = yaml.safe_load(text)
    assert doc == {"extends": "fp8-ctx1m-baseline", "description": "fp8 tuned: test",
                   "server": {"context_length": 8192, "mem_fraction_static": 0.75}}
    loaded = load_profile("fp8-ctx1m-baseline-tuned")
    assert validate(loaded).ok
    assert loaded.data["server"] == chosen.profile.data["server"]
    assert loaded.content_hash != load_profile("fp8-ctx1m-baseline").content_hash


def test_a_hand_written_profile_of_that_name_is_never_replaced(profile_dir, chosen):
    mine = profile_dir.write("fp8-ctx1m-baseline-tuned", "extends: fp8-ctx1m-baseline\n")
    with pytest.raises(ProfileError) as exc:
        write(profile_dir, chosen)
    assert "was not written by dsv4deploy tune" in str(exc.value)
    assert mine.read_text() == "extends: fp8-ctx1m-baseline\n"


def test_an_earlier_tuned_profile_is_replaced(profile_dir, chosen):
    write(profile_dir, chosen)
    chosen.overrides = {"server.context_length": 8192}
    chosen.profile.data["server"]["mem_fraction_static"] = 0.7
    path = write(profile_dir, chosen)
    assert yaml.safe_load(path.read_text())["server"] == {"context_length": 8192}


def test_a_file_that_reads_back_as_something_else_is_not_kept(profile_dir, chosen, monkeypatch):
    real = tuned.tuned_text
    monkeypatch.setattr(tuned, "tuned_text", lambda *a, **kw: real(*a, **kw).replace("8192", "4096"))
    with pytest.raises(ProfileError) as exc:
        write(profile_dir, chosen)
    assert "reads back as another configuration" in str(exc.value)
    assert not (profile_dir.path / "fp8-ctx1m-baseline-tuned.yaml").exists()


def test_a_tuned_profile_that_does_not_validate_is_not_kept(profile_dir, chosen, monkeypatch):
    real = tuned.tuned_text
    monkeypatch.setattr(tuned, "tuned_text",
                        lambda *a, **kw: real(*a, **kw).replace("mem_fraction_static: 0.75", "mem_fraction_static: 0.85"))
    with pytest.raises(ProfileError) as exc:
        write(profile_dir, chosen)
    assert "CUDA-graph capture would run out" in str(exc.value)
    assert not (profile_dir.path / "fp8-ctx1m-baseline-tuned.yaml").exists()


def test_a_base_name_too_long_for_a_tuned_name_is_refused_before_anything(profile_dir):
    name = "p" * 97
    profile_dir.write(name, "extends: nvfp4-ctx8k\n")
    with pytest.raises(ProfileError) as exc:
        prepare(name, ["server.context_length=4096"], directory=profiles_dir())
    assert "the tuned profile would be named" in str(exc.value)
