"""The render-time round trip: systemd's reading rules, and a renderer that quotes wrong is caught."""

from __future__ import annotations

import json

import pytest

from dsv4deploy.render import systemd
from dsv4deploy.render import unit as render_module
from dsv4deploy.profile.errors import ProfileError
from dsv4deploy.profile.load import schema
from checkout import load_profile
from dsv4deploy.render.unit import render
from dsv4deploy.render.unitcheck import (SyntaxProblem, env_file, environment_assignments, exec_argv, split_words,
                                         unit_directives)

SPEC = {"n": "sglang.service", "N": "sglang", "d": "/run/credentials/sglang.service"}


@pytest.mark.parametrize("value,argv", [
    ('/x a "b c" \'d e\'', ["/x", "a", "b c", "d e"]),
    (r'/x "a\"b" "c\\d" "\x41\t"', ["/x", 'a"b', "c\\d", "A\t"]),
    ("/x 100%% $$HOME", ["/x", "100%", "$HOME"]),
    ("/x --config %d/sglang-config %n", ["/x", "--config", "/run/credentials/sglang.service/sglang-config",
                                         "sglang.service"]),
    ('/x ";" \\;', ["/x", ";", ";"]),
    ("/x   a\tb", ["/x", "a", "b"]),
])
def test_exec_lines_read_as_systemd_reads_them(value, argv):
    assert exec_argv(value, SPEC) == argv


@pytest.mark.parametrize("value,why", [
    ("/x ; /bin/sh", "separates commands"),
    ("/x $HOME", "replaced"),
    ("/x ${HOME}", "not doubled"),
    ("/x a$b", "not doubled"),
    ("/x %H", "not resolved"),
    ("/x %", "lone"),
    ('/x "a', "unbalanced"),
    ('/x a"b"', "inside a word"),
    ('/x "a"b', "followed by whitespace"),
    (r"/x \q", "unknown escape"),
    (r"/x \x00", "not a character"),
    ("+/x", "prefix"),
    ("-/x", "prefix"),
    ("x y", "absolute path"),
])
def test_what_the_guard_will_not_guess(value, why):
    with pytest.raises(SyntaxProblem, match=why):
        exec_argv(value, SPEC)


def test_environment_does_not_expand_dollars_but_does_specifiers():
    assert environment_assignments('"A=$HOME x" B=100%% C=', SPEC) == [("A", "$HOME x"), ("B", "100%"), ("C", "")]
    with pytest.raises(SyntaxProblem):
        environment_assignments("notanassignment", SPEC)


def test_unit_continuations_comments_and_sections():
    text = ("# c\n[Unit]\nDescription=a \\\n# inside a continuation: skipped\nb\n"
            "[Service]\nExecStart=/x \\\\\nEnvironment=A=1\r\n; c\n")
    got = [(d.line, d.section, d.key, d.value) for d in unit_directives(text)]
    assert got == [(3, "Unit", "Description", "a  b"), (7, "Service", "ExecStart", "/x \\\\"),
                   (8, "Service", "Environment", "A=1")]
    with pytest.raises(SyntaxProblem):
        unit_directives("[Service]\nExecStart=/x \\")
    with pytest.raises(SyntaxProblem):
        unit_directives("[Service]\nnot an assignment\n")


def test_env_file_rules():
    text = ("# comment\n; also\n\n  A = 1  \nB='x \\ y' \nC=\"q \\\" \\\\ \\$ \\n\"\nD=a\\\nb\nE=\nF=a\\ b\n")
    assert env_file(text) == {"A": "1", "B": "x \\ y", "C": 'q " \\ $ \\n', "D": "ab", "E": "", "F": "a b"}
    for bad in ("novalue\n", "A='open\n", "# trailing backslash \\\nA=1\n", "1A=x\n"):
        with pytest.raises(SyntaxProblem):
            env_file(bad)


def test_split_words_counts_words_not_characters():
    assert split_words('a "b c" d') == ["a", "b c", "d"]


# --- the guard inside render() ------------------------------------------------------------------------

def test_a_renderer_that_forgets_to_escape_is_caught(profile_dir, monkeypatch):
    profile_dir.write("q", 'extends: nvfp4-ctx8k\nserver:\n  extra_args: [--chat-template, \'say "hi" $X\']\n')
    profile = load_profile("q")
    assert render(profile).argv[-1] == 'say "hi" $X'
    monkeypatch.setattr(systemd, "systemd_word", lambda w: '"' + w + '"')
    with pytest.raises(ProfileError) as info:
        render(profile)
    (problem,) = info.value.problems
    assert problem.path == "server.extra_args[1]" and problem.line == 3 and "refused at render" in problem.message


def test_a_renderer_that_doubles_dollars_in_environment_is_caught(profile_dir, monkeypatch):
    profile_dir.write("e", "extends: nvfp4-ctx8k\nserver:\n  env:\n    SGLANG_X: a$b\n")
    profile = load_profile("e")
    assert 'Environment=SGLANG_X=a$b\n' in render(profile).unit.replace('"', "")
    monkeypatch.setattr(render_module, "systemd_env", lambda k, v: render_module.systemd_word(f"{k}={v}"))
    with pytest.raises(ProfileError) as info:
        render(profile)
    assert [p.path for p in info.value.problems] == ["server.env.SGLANG_X"]


def test_a_broken_env_file_is_caught(profile_dir, monkeypatch):
    profile_dir.write("n", "extends: nvfp4-ctx8k\nnccl:\n  preset: ll-ring\n  overrides:\n    NCCL_DEBUG: INFO\n")
    profile = load_profile("n")
    monkeypatch.setattr(render_module, "render_env_file", lambda env, header: "NCCL_DEBUG='INFO\n")
    with pytest.raises(ProfileError) as info:
        render(profile)
    assert info.value.problems[0].path.startswith("nccl")


def test_a_template_input_that_would_start_a_directive_is_caught(profile_dir, monkeypatch):
    from dsv4deploy.render.layout import Layout
    monkeypatch.setattr(Layout, "home", property(lambda self: "/var/lib/x\nExecStartPre=+/bin/sh"))
    with pytest.raises(ProfileError, match="home holds an unprintable character"):
        render(load_profile("nvfp4-ctx8k"))
    monkeypatch.setattr(Layout, "home", property(lambda self: "/var/lib/x\\"))
    with pytest.raises(ProfileError, match="trailing backslash"):
        render(load_profile("nvfp4-ctx8k"))


def test_env_values_with_dollars_reach_the_process_unchanged(profile_dir):
    profile_dir.write("d", "extends: nvfp4-ctx8k\nserver:\n  env:\n    SGLANG_X: 'p$a%s\"\\'\n")
    unit = render(load_profile("d")).unit
    line = next(l for l in unit.splitlines() if "SGLANG_X" in l)
    assert line == 'Environment="SGLANG_X=p$a%%s\\"\\\\"'


# --- the schema's own patterns (editors use them) --------------------------------------------------------

def _patterns(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "pattern":
                yield v
            else:
                yield from _patterns(v)
    elif isinstance(node, list):
        for v in node:
            yield from _patterns(v)


def test_every_schema_pattern_is_anchored_at_the_true_end():
    """`$` matches before a final newline in Python (jsonschema's engine); (?![\\s\\S]) is the end
    of input in Python and ECMA alike."""
    for pattern in _patterns(schema()):
        assert pattern.startswith("^"), pattern
        if pattern != "^[^-]":
            assert pattern.endswith(r"(?![\s\S])") and not pattern.endswith("$"), pattern


def test_the_schema_alone_refuses_a_trailing_newline():
    from jsonschema import Draft202012Validator
    data = json.loads(json.dumps(load_profile("nvfp4-ctx8k").data))
    data["model"]["served_model_name"] = "dsv4\n"
    errors = list(Draft202012Validator(schema()).iter_errors(data))
    assert errors and {tuple(e.absolute_path) for e in errors} == {("model", "served_model_name")}


# --- instances of a templated unit: `${NAME}` from the instance's env files ---------------------------

def test_a_braced_variable_is_one_word_from_the_instance_environment():
    env = {"P": "30001", "S": "a b"}
    assert exec_argv("/x --port ${P} ${S}", {}, env) == ["/x", "--port", "30001", "a b"]
    assert exec_argv("/x $${P}", {}, env) == ["/x", "${P}"]
    for line, why in (("/x ${Q}", "not set"), ("/x $P", "split"), ("/x a${P}", "not doubled"),
                      ("/x ${P}b", "not doubled")):
        with pytest.raises(SyntaxProblem, match=why):
            exec_argv(line, {}, env)
    with pytest.raises(SyntaxProblem):  # without an environment nothing is resolved
        exec_argv("/x ${P}", {})


def test_a_replica_renderer_that_forgets_to_escape_is_caught(profile_dir, monkeypatch):
    from dsv4deploy.render import replicas as render_replicas
    profile_dir.write("q", "extends: nvfp4-ctx8k-dp2\nserver:\n  extra_args: [--chat-template, 'a $X %i']\n")
    profile = load_profile("q")
    assert [r.argv[-1] for r in render(profile).replicas] == ["a $X %i"] * 2
    monkeypatch.setattr(render_replicas, "systemd_exec", lambda argv, raw=frozenset(): " ".join(argv))
    with pytest.raises(ProfileError) as info:
        render(profile)
    assert {p.path for p in info.value.problems} == {"server.extra_args[1]"}
    assert {p.message.split(":")[1].strip() for p in info.value.problems} == {"sglang@0.service", "sglang@1.service"}


def test_a_replica_env_file_without_the_port_is_caught(profile_dir, monkeypatch):
    from dsv4deploy.render import replicas as render_replicas
    real = render_replicas.replica_env_text
    monkeypatch.setattr(render_replicas, "replica_env_text",
                        lambda env, header: real({k: v for k, v in env.items() if k != "DSV4_REPLICA_PORT"}, header))
    with pytest.raises(ProfileError, match="DSV4_REPLICA_PORT"):
        render(load_profile("nvfp4-ctx8k-dp2"))


def test_a_gateway_argv_that_would_not_read_back_is_caught(monkeypatch):
    from dsv4deploy.render import replicas as render_replicas
    monkeypatch.setattr(render_replicas, "systemd_exec", lambda argv, raw=frozenset(): " ".join(argv)
                        if "--worker-urls" in argv else render_module.systemd_exec(argv, raw))
    monkeypatch.setattr(render_replicas.gateway, "launch_flags", lambda *a: ["--worker-urls", "a b"])
    with pytest.raises(ProfileError, match="sglang-gateway.service"):
        render(load_profile("nvfp4-ctx8k-dp2"))
