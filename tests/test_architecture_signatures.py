"""No function of dsv4deploy/ takes more than 7 parameters (self and cls not counted, *args and
**kwargs one each) unless it is named below with the reason; the list stays short (at most 5)
and names only functions that still need it. More than 7 is usually a concept with no name yet:
group it in a small dataclass (gate/inputs.py GateHost/GateServer/GateOptions, preflight's
ProbeSettings, fleet's FleetRequest, tune's TuneFolders)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "dsv4deploy"
LIMIT = 7
ALLOWED = {
    "preflight/cli.py:probe_argv": "builds nccl_probe.py `launch`'s command line: one keyword per flag of that "
                                   "argparse (script, python, env file, timeout, ranks, sizes, groups)",
    "render/unitcheck.py:check_unit": "the one round-trip checker: the unit, what was asked of it (argv, env), how "
                                      "systemd reads it (specifiers, line limit, the renderer's quoting) and an "
                                      "instance's exec environment; both renderers and check_instance call it",
    "render/replicas.py:_manifest": "private, one caller: the replica set's manifest, one argument per part of the "
                                    "rendered set it records",
}
MAX_ALLOWED = 5


def parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def wide_functions(package: Path) -> dict[str, tuple[int, int]]:
    """'file:function' -> (parameters, line) for every function over LIMIT parameters."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and parameters(node) > LIMIT:
                found[f"{rel}:{node.name}"] = (parameters(node), node.lineno)
    return found


def test_no_function_takes_more_than_seven_parameters_unless_listed_with_its_reason():
    wide = wide_functions(PACKAGE)
    unlisted = [f"dsv4deploy/{name.split(':')[0]}:{line}: {name.split(':')[1]} takes {count} parameters"
                for name, (count, line) in sorted(wide.items()) if name not in ALLOWED]
    assert not unlisted, (f"more than {LIMIT} parameters: group them in a dataclass that names the concept "
                          "(or, with a reason, in ALLOWED):\n" + "\n".join(unlisted))


def test_the_allow_list_is_short_and_names_only_functions_that_need_it():
    assert len(ALLOWED) <= MAX_ALLOWED and all(reason.strip() for reason in ALLOWED.values())
    stale = sorted(set(ALLOWED) - set(wide_functions(PACKAGE)))
    assert not stale, f"no longer over {LIMIT} parameters (or gone): take them off ALLOWED: {stale}"


def test_the_count_leaves_out_self_and_counts_star_args_once(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text("class C:\n    def m(self, a, b, c, d, e, f, g):\n        pass\n"
                              "def seven(a, b, c, d, e, *args, **kw):\n    pass\n"
                              "def eight(a, b, c, d, e, f, *, g, h):\n    pass\n"
                              "async def nine(a, b, c, d, e, f, g, /, h, *rest):\n    pass\n")
    assert wide_functions(pkg) == {"m.py:eight": (8, 6), "m.py:nine": (9, 8)}
