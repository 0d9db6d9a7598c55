"""Property: any text in any free-text field either is refused cleanly (ProfileError, every
problem with file, line and key) or renders to a unit and an NCCL env file that read back,
under systemd's rules, to exactly the argv and environment the profile asked for.

Two oracles read the files back: unitcheck (systemd's rules, the render-time guard) and, for
ExecStart=/Environment=, POSIX shlex (the renderer only ever emits double quotes with \\\\ and
\\" inside, which both read alike), so the guard is not its own only witness."""

from __future__ import annotations

import pytest

import json
import shlex

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsv4deploy.profile.errors import ProfileError
from dsv4deploy.render.nccl import env_file_value
from checkout import load_profile
from dsv4deploy.render.systemd import systemd_env, systemd_exec, unit_specifiers
from dsv4deploy.render.unit import render
from dsv4deploy.render.unitcheck import env_file, environment_assignments, exec_argv, split_words, unit_directives
from dsv4deploy.profile.validate import validate

SPECIAL = list("\n\r\t\x00\x0b\x0c\x1b\x7f\x85\xa0\u2028\u2029\u202e\ufeff\"'\\$%;#=` {}[]:,&*!|>@-") + [
    "$$", "%%", "%n", "%d", "${X}", "$X", "\\n", "\\x41", "--", "-h", "é", "日本", "\U0001f600"]
TEXT = st.lists(st.one_of(st.sampled_from(SPECIAL), st.characters()), max_size=24).map("".join)

# field -> (YAML after the base with {} for the value)
FIELDS = {
    "served_model_name": "model:\n  served_model_name: {}\n",
    "source.path": "model:\n  source:\n    type: local\n    path: {}\n",
    "description": "description: {}\n",
    "calibration.measured": "calibration:\n  measured: {}\n",
    "extra_args": "server:\n  extra_args: [--chat-template, {}]\n",
    "env.value": "server:\n  env:\n    SGLANG_X: {}\n",
    "env.key": "server:\n  env:\n    {}: v\n",
    "nccl.value": "nccl:\n  preset: ll-ring\n  overrides:\n    NCCL_DEBUG: {}\n",
    "nccl.key": "nccl:\n  preset: ll-ring\n  overrides:\n    {}: '1'\n",
    "server.host": "server:\n  host: {}\n",
    "service.user": "service:\n  user: {}\n",
    "service.name": "service:\n  name: {}\n",
}
PRINTABLE = st.text(st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"))
                    | st.sampled_from(list(" \"'\\$%;#=`{}")), max_size=30)
# Mostly-valid shapes per field, so acceptance is exercised as often as refusal.
SHAPES = {
    "served_model_name": r"[A-Za-z0-9][A-Za-z0-9._/-]{0,12}",
    "env.key": r"[A-Z][A-Z0-9_]{0,10}",
    "nccl.key": r"NCCL_[A-Z0-9_]{1,10}",
    "nccl.value": r"[A-Za-z0-9.,:=+/@%^_-]{1,12}",
    "server.host": r"[0-9A-Za-z:][0-9A-Za-z.:-]{0,12}",
    "service.user": r"[a-z_][a-z0-9_-]{0,10}",
    "service.name": r"[a-z][a-z0-9-]{0,10}",
}


def field_text(field: str) -> st.SearchStrategy[str]:
    shape = st.from_regex(SHAPES.get(field, r"[A-Za-z0-9 ._/-]{1,12}"), fullmatch=True)
    return st.one_of(TEXT, PRINTABLE, shape, st.tuples(shape, st.sampled_from(SPECIAL)).map("".join))


PROFILE = settings(max_examples=150, deadline=None, database=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def read_back(unit: str, service: str) -> tuple[list[str], dict[str, str]]:
    """ExecStart= argv and Environment= variables, read by unitcheck and checked against shlex."""
    argv, env = None, {}
    for d in unit_directives(unit):
        if d.section != "Service":
            continue
        if d.key == "ExecStart":
            argv = exec_argv(d.value, unit_specifiers(service))
            assert [w.replace("$$", "\0").replace("%%", "%").replace("\0", "$")
                    for w in shlex.split(d.value)] == argv
        elif d.key == "Environment":
            pairs = environment_assignments(d.value, unit_specifiers(service))
            assert [tuple(w.replace("%%", "%").split("=", 1)) for w in shlex.split(d.value)] == pairs
            env.update(pairs)
    return argv, env


@pytest.mark.slow
@PROFILE
@given(data=st.data())
def test_any_text_in_any_field_is_refused_or_round_trips(profile_dir, data):
    field = data.draw(st.sampled_from(sorted(FIELDS)), label="field")
    text = data.draw(field_text(field), label="text")
    profile_dir.write("prop", "extends: nvfp4-ctx8k\n" + FIELDS[field].format(json.dumps(text)))
    try:
        report = validate(load_profile("prop"))
        if report.errors:
            raise ProfileError(report.errors)
        rendered = render(report.profile)
    except ProfileError as exc:
        for p in exc.problems:
            assert p.file and p.line and p.path, str(p)
            assert "\n" not in str(p) and "\r" not in str(p)
        return
    profile = report.profile.data
    argv, env = read_back(rendered.unit, profile["service"]["name"])
    assert argv == rendered.argv
    nccl = env_file(rendered.nccl_env)
    overrides = profile["nccl"]["overrides"]
    assert {k: nccl[k] for k in overrides} == {k: str(v) for k, v in overrides.items()}
    if field == "served_model_name":
        assert argv[argv.index("--served-model-name") + 1] == text
    elif field == "extra_args":
        assert argv[-2:] == ["--chat-template", text]
    elif field == "env.value":
        assert env["SGLANG_X"] == text
    elif field == "env.key":
        assert env[text] == "v"
    elif field == "nccl.value":
        assert nccl["NCCL_DEBUG"] == text
    elif field == "nccl.key":
        assert nccl[text] == "1"
    elif field == "server.host":
        assert argv[argv.index("--host") + 1] == text


@settings(max_examples=400, deadline=None, database=None)
@given(argv=st.lists(PRINTABLE, min_size=1, max_size=6))
def test_exec_words_round_trip(argv):
    argv = ["/opt/python", *argv]
    line = systemd_exec(argv)
    assert exec_argv(line, unit_specifiers("sglang")) == argv
    assert len(split_words(line)) == len(argv)


@pytest.mark.slow
@settings(max_examples=400, deadline=None, database=None)
@given(name=st.from_regex(r"[A-Z][A-Z0-9_]{0,8}", fullmatch=True), value=PRINTABLE)
def test_environment_assignment_round_trips(name, value):
    assert environment_assignments(systemd_env(name, value), {}) == [(name, value)]


@settings(max_examples=400, deadline=None, database=None)
@given(value=st.text(st.characters(blacklist_characters="\n\r\x00", blacklist_categories=("Cs",)), max_size=30))
def test_env_file_values_round_trip(value):
    assert env_file(f"# c\nK={env_file_value(value)}\nL=1\n") == {"K": value, "L": "1"}
