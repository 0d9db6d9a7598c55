"""The programs that run on the GPU host with its own python3 follow one visible convention: a
marker line at the top and imports from the standard library only (a dsv4deploy import, or a
third-party one, would fail on a host that has neither)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from dsv4deploy.host import HOST_PROGRAM_MARK, HOST_PROGRAMS

PKG = Path(__file__).resolve().parent.parent / "dsv4deploy"


# the twin's own host program (its nvidia-smi) follows the same convention
TWIN_PROGRAMS = ("host/nvidia_smi.py",)
TWIN = PKG.parent / "ct200twin"


@pytest.mark.parametrize("rel", HOST_PROGRAMS + tuple(f"../ct200twin/{p}" for p in TWIN_PROGRAMS))
def test_host_program_is_marked_and_stdlib_only(rel):
    text = (PKG / rel).read_text()
    head = text.splitlines()[:2]
    assert HOST_PROGRAM_MARK in head, f"{rel}: first lines must carry the host-program mark"
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{rel}:{node.lineno}: relative import"
            names = [node.module or ""]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            # torch is imported inside the NCCL probe's ranks only, sglang inside the launch check's
            # fallback only (both run in the SGLang venv)
            if (rel, top) in (("preflight/nccl_probe.py", "torch"), ("sglang/launch_parser.py", "sglang")):
                continue
            assert top in sys.stdlib_module_names or top == "__future__", f"{rel}:{node.lineno}: imports {name}"


def test_every_marked_file_is_listed():
    marked = {p.relative_to(PKG).as_posix() for p in PKG.rglob("*.py")
              if p.read_text().splitlines()[:2].count(HOST_PROGRAM_MARK)}
    assert marked == set(HOST_PROGRAMS)
