"""The flag table (dsv4deploy/sglang/flags.py) drives both sides: what the renderer writes and what the
validator refuses in extra_args are the same spellings."""

from __future__ import annotations

from dsv4deploy.sglang.flags import MANAGED_FLAGS, flag, flag_owner
from checkout import load_profile
from dsv4deploy.render.argv import server_args
from dsv4deploy.profile.validate import validate


def test_every_flag_the_renderer_writes_is_managed_by_its_profile_key():
    args = server_args(load_profile("nvfp4-ctx8k"))
    written = [a for a in args if a.startswith("--")]
    assert written and all(flag_owner(a) for a in written), [a for a in written if not flag_owner(a)]
    assert flag("max_running_requests") == "--max-running-requests"


def test_each_alias_of_a_managed_flag_is_refused_in_extra_args(profile_dir):
    for key, spellings in MANAGED_FLAGS.items():
        for spelling in spellings:
            profile_dir.write("x", f"extends: nvfp4-ctx8k\nserver:\n  extra_args: ['{spelling}', '1']\n")
            problems = [p for p in validate(load_profile("x")).errors if "server.extra_args" in str(p)]
            assert problems, f"{spelling} ({key}) passed in extra_args"
