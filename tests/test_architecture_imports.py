"""The package's import graph: no module of dsv4deploy/ imports itself round a circle, and no
private name (a leading underscore) crosses a module boundary.

Every import counts, wherever it stands (top level, inside a function, under TYPE_CHECKING),
absolute or relative; `from pkg import mod` is an import of pkg.mod when mod is a module. A
circle works only by the order its modules happen to load in (or a lazy import that hides it),
and a private name imported elsewhere is an interface no one declared.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "dsv4deploy"


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file, for every .py under ROOT (a package's __init__.py is the package)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imports_of(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, str | None, int]]:
    """(module imported, name taken from it or None, line) for each import in NAME's file that
    reaches a module of KNOWN."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _known_prefix(alias.name, known)
                if target:
                    found.append((target, None, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            for alias in node.names:
                if f"{base}.{alias.name}" in known:          # from pkg import mod
                    found.append((f"{base}.{alias.name}", None, node.lineno))
                elif base in known:
                    found.append((base, alias.name, node.lineno))
    return found


def _known_prefix(dotted: str, known: dict[str, Path]) -> str | None:
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in known:
            return ".".join(parts[:n])
    return None


def graph(root: Path) -> tuple[dict[str, set[str]], list[str]]:
    """The import graph of the package at ROOT, and each private name one of its modules takes
    from another ("file:line: name from module")."""
    known = module_names(root)
    edges: dict[str, set[str]] = {name: set() for name in known}
    private = []
    for name, path in known.items():
        for target, taken, line in imports_of(name, path, known):
            if target != name:
                edges[name].add(target)
            if taken and taken.startswith("_") and not (taken.startswith("__") and taken.endswith("__")):
                private.append(f"{path.relative_to(root.parent)}:{line}: {taken} from {target}")
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each strongly connected group of modules (Tarjan), as a path that
    ends where it starts."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return [_circle(min(group), group, edges) for group in groups]


def _circle(start: str, group: set[str], edges: dict[str, set[str]]) -> list[str]:
    """A shortest path from START back to itself inside GROUP (breadth first)."""
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & group):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return [*reversed(path), start]
                if w not in came:
                    came[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no circle through {start}")


def test_no_module_of_dsv4deploy_imports_itself_round_a_circle():
    edges, _ = graph(PACKAGE)
    assert len(edges) > 50                        # the whole package was read
    found = cycles(edges)
    assert not found, "import circles in dsv4deploy/:\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_private_name_crosses_a_module_boundary():
    _, private = graph(PACKAGE)
    assert not private, ("private names imported from another dsv4deploy module (make them public, or keep "
                         "them where they are used):\n" + "\n".join(private))


def test_the_check_finds_a_circle_hidden_in_a_function_a_relative_import_and_a_private_name(tmp_path):
    """The scan itself, on a package made here: a -> b by `from pkg import b` inside a function,
    b -> c relative, c -> a by a dotted `import pkg.a`; and a private name taken (renamed or not)."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg import b\n    return b\n")
    (pkg / "b.py").write_text("from .c import _hidden\n")
    (pkg / "c.py").write_text("import pkg.a\n_hidden = 1\n")
    (pkg / "d.py").write_text("from pkg.a import f\nfrom pkg.c import _hidden as hidden\n")
    edges, private = graph(pkg)
    assert cycles(edges) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    assert private == ["pkg/b.py:1: _hidden from pkg.c", "pkg/d.py:2: _hidden from pkg.c"]
    (pkg / "c.py").write_text("_hidden = 1\n")
    assert cycles(graph(pkg)[0]) == []
