"""`ls dsv4deploy/` names the parts of the tool: a short list of folders (profile, sglang, render,
release, gate, gateway, weights, host, tasks, preflight, tune, cli, data) and the package's own two
files, each folder opening with what it holds. A new module goes into the part it serves."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "dsv4deploy"
MOST_TOP_LEVEL_ENTRIES = 16


def _entries() -> list[str]:
    return sorted(p.name for p in PKG.iterdir() if p.name != "__pycache__" and not p.name.endswith(".pyc"))


def test_the_top_level_is_a_short_list_of_parts():
    entries = _entries()
    assert len(entries) <= MOST_TOP_LEVEL_ENTRIES, (
        f"dsv4deploy/ holds {len(entries)} entries (at most {MOST_TOP_LEVEL_ENTRIES}): {entries}; "
        "put a new module in the folder of the part it serves")
    loose = [e for e in entries if e.endswith(".py") and e not in ("__init__.py", "__main__.py")]
    assert not loose, f"modules at the top of dsv4deploy/: {loose}; each belongs to a part (a folder)"


def test_every_part_says_what_it_holds():
    for folder in (PKG / e for e in _entries()):
        init = folder / "__init__.py"
        if folder.is_dir() and init.exists():
            assert ast.get_docstring(ast.parse(init.read_text())), f"{init.relative_to(PKG.parent)}: no docstring"
