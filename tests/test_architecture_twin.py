"""The product (dsv4deploy/) never reaches the twin (ct200twin/, a test bench beside it): an
installed dsv4deploy has no twin to import, so one import of it, even in a function that only a
twin deploy runs, would break a real deploy. The twin's parts reach a deploy as host data only."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PRODUCT = REPO / "dsv4deploy"
TWIN = "ct200twin"
IMPORTERS = {"__import__", "import_module", "find_spec", "spec_from_file_location", "run_module"}


def _is_twin(name: object) -> bool:
    return isinstance(name, str) and (name == TWIN or name.startswith(TWIN + "."))


def twin_imports(source: str, filename: str) -> list[str]:
    """`file:line: what` for every import in SOURCE that reaches the twin: `import x`, `from x
    import y` (top level or in a function) and an import by name (__import__, importlib)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module] if node.level == 0 else []
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            names = [arg.value for arg in node.args[:1] if isinstance(arg, ast.Constant)] if called in IMPORTERS else []
        elif isinstance(node, ast.Constant) and _is_twin(node.value):
            # a module name kept for a later import by name (`for m in ("ct200twin.cli",): __import__(m)`)
            found.append(f"{filename}:{node.lineno}: names the module {node.value}")
            continue
        else:
            continue
        found += [f"{filename}:{node.lineno}: imports {name}" for name in names if _is_twin(name)]
    return found


def test_the_scan_finds_every_kind_of_import():
    source = ("import ct200twin.cli\n"
              "def f():\n    from ct200twin.host import stand_ins\n"
              "import importlib\nimportlib.import_module('ct200twin.server.main')\n"
              "__import__('ct200twin')\n"
              "import ct200twinkle, json\nfrom . import ct200twin\n"
              "for m in ('ct200twin.cli',):\n    __import__(m)\n")
    assert set(twin_imports(source, "x.py")) == {
        "x.py:1: imports ct200twin.cli", "x.py:3: imports ct200twin.host", "x.py:5: imports ct200twin.server.main",
        "x.py:5: names the module ct200twin.server.main", "x.py:6: imports ct200twin",
        "x.py:6: names the module ct200twin", "x.py:9: names the module ct200twin.cli"}


def test_no_module_of_the_product_imports_the_twin():
    found = []
    for path in sorted(PRODUCT.rglob("*.py")):
        found += twin_imports(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))
    assert not found, "\n".join(found)


def test_the_product_does_not_even_name_the_twin():
    """No module name in a string, no comment about it: what a stand-in is comes from host data."""
    found = [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
             for path in sorted(PRODUCT.rglob("*")) if path.is_file() and "__pycache__" not in path.parts
             for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
             if TWIN in line]
    assert not found, "\n".join(found)


def test_importing_every_module_of_the_product_loads_neither_the_twin_nor_its_dependencies():
    """Isolated (-I: no current directory or PYTHONPATH on the path); the command line's parser is
    built too (the `dsv4deploy` command once plugged the twin's verbs in while it was built)."""
    code = ("import importlib, pkgutil, sys, dsv4deploy\n"
            "names = [m.name for m in pkgutil.walk_packages(dsv4deploy.__path__, 'dsv4deploy.')\n"
            "         if not m.name.endswith('.__main__')]\n"
            "for name in names:\n    importlib.import_module(name)\n"
            "import dsv4deploy.cli.main\ndsv4deploy.cli.main.build_parser()\n"
            "print(len(names))\n"
            "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in ('ct200twin', 'aiohttp'))))\n")
    proc = subprocess.run([sys.executable, "-I", "-c", code], cwd="/", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    count, loaded = (proc.stdout.splitlines() + [""])[:2]
    assert int(count) > 50                         # the walk saw the product's modules
    assert loaded == "", f"importing dsv4deploy loaded {loaded}"
