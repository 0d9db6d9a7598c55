"""Explicit inputs: outside the entry layer (dsv4deploy/cli/: the command, the inventories' helpers
and the run's settings), no module of the package reads the command line (sys.argv) or the
environment (os.environ, os.getenv), and none finds the checkout from its own file
(`Path(__file__).parents[...]`): what a run is started with is read once, in cli/settings.py,
and handed down. A program that runs on the GPU host by itself may read its own argv and
environment in its `main` (or its `if __name__ == "__main__":` block) and pass them on.
"""

from __future__ import annotations

import ast
from pathlib import Path

from dsv4deploy.host import HOST_PROGRAMS

PACKAGE = Path(__file__).resolve().parent.parent / "dsv4deploy"
ENTRY_LAYER = "cli"
# programs started by themselves on the GPU host: their main reads what they were started with
PROGRAMS = {
    **{path: "a host program (dsv4deploy/host/__init__.py HOST_PROGRAMS)" for path in HOST_PROGRAMS},
    "gateway/launcher.py": "the gateway's launcher, run by its unit in the gateway's venv on the host",
}
READS = {("sys", "argv"), ("os", "environ"), ("os", "environb"), ("os", "getenv"), ("os", "getenvb")}


def _entry_spans(tree: ast.Module) -> list[tuple[int, int]]:
    """Lines of a program's `def main` and `if __name__ == "__main__":` block, at the top level."""
    spans = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "main":
            spans.append((node.lineno, node.end_lineno))
        elif (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
              and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"):
            spans.append((node.lineno, node.end_lineno))
    return spans


def _is_file_name(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "__file__" for n in ast.walk(node))


def reads_in(source: str, filename: str) -> list[tuple[int, str]]:
    """(line, what) for each read of argv or the environment, and each checkout found from
    __file__, in SOURCE."""
    tree = ast.parse(source, filename)
    found = []
    aliases = {}                               # a name bound to sys / os, or to argv / environ itself
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in ("os", "sys"):
                    aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module in ("os", "sys"):
            for alias in node.names:
                if (node.module, alias.name) in READS:
                    found.append((node.lineno, f"from {node.module} import {alias.name}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            module = aliases.get(node.value.id)
            if module and (module, node.attr) in READS:
                found.append((node.lineno, f"{module}.{node.attr}"))
        if isinstance(node, ast.Attribute) and node.attr == "parents" and _is_file_name(node.value):
            found.append((node.lineno, "the checkout from __file__ (.parents)"))
        if (isinstance(node, ast.Attribute) and node.attr == "parent" and isinstance(node.value, ast.Attribute)
                and node.value.attr == "parent" and _is_file_name(node.value)):
            found.append((node.lineno, "the checkout from __file__ (.parent.parent)"))
    return sorted(set(found))


def violations(package: Path) -> list[str]:
    out = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package).as_posix()
        if rel.split("/")[0] == ENTRY_LAYER:
            continue
        source = path.read_text()
        spans = _entry_spans(ast.parse(source)) if rel in PROGRAMS else []
        for line, what in reads_in(source, str(path)):
            if any(first <= line <= last for first, last in spans) and not what.startswith("the checkout"):
                continue
            out.append(f"dsv4deploy/{rel}:{line}: {what}")
    return out


def test_no_module_outside_the_entry_layer_reads_argv_or_the_environment():
    found = violations(PACKAGE)
    assert not found, ("read argv/the environment in dsv4deploy/cli/ (cli/settings.py Settings) and hand the "
                       "value down; a host program reads them in its main:\n" + "\n".join(found))


def test_the_programs_named_exist():
    for rel in PROGRAMS:
        assert (PACKAGE / rel).is_file(), rel


def test_the_scan_finds_each_kind_of_read_and_spares_a_programs_main(tmp_path):
    pkg = tmp_path / "dsv4deploy"
    (pkg / "cli").mkdir(parents=True)
    (pkg / "gateway").mkdir()
    (pkg / "cli" / "settings.py").write_text("import os\nX = os.environ\n")          # the entry layer: fine
    (pkg / "lib.py").write_text(
        "import os as o\nimport sys\nfrom os import getenv\nfrom pathlib import Path\n"
        "A = o.environ.get('X')\n"
        "def f(env=o.environ):\n    return sys.argv[1:]\n"
        "ROOT = Path(__file__).resolve().parents[2]\nUP = Path(__file__).parent.parent\n"
        "HERE = Path(__file__).with_name('x')\n")
    (pkg / "gateway" / "launcher.py").write_text(
        "import os, sys\ndef helper():\n    return os.getenv('X')\n"
        "def main():\n    return sys.argv, os.environ\n"
        "if __name__ == '__main__':\n    main(sys.argv[1:])\n")
    assert violations(pkg) == [
        "dsv4deploy/gateway/launcher.py:3: os.getenv",
        "dsv4deploy/lib.py:3: from os import getenv",
        "dsv4deploy/lib.py:5: os.environ",
        "dsv4deploy/lib.py:6: os.environ",
        "dsv4deploy/lib.py:7: sys.argv",
        "dsv4deploy/lib.py:8: the checkout from __file__ (.parents)",
        "dsv4deploy/lib.py:9: the checkout from __file__ (.parent.parent)",
    ]
