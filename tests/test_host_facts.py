"""host/facts.py: each fact alone, from fixtures of what its command prints, in pyinfra's own
style (its tests/facts/<module>.<Fact>/<case>.json). A fixture is
tests/fixtures/facts/<Fact>/<case>.json: "arg" (the command's keyword arguments), "command" (the
exact shell it gives, where short enough to read), "output" (the lines a Debian host prints, from
recordings where the repository has them: nvidia-smi, smg, release records, the twin's checkpoint
run through the real checkers) and "fact" (what `process` makes of them), or "raises" (a piece of
the ValueError's message: a damaged line; a batch read turns that into the fact's default, or stops
the run for a `strict` fact: host/snapshot.py). Every fact must have fixtures: a new one without
them fails here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pyinfra.api import FactBase

from dsv4deploy.host import facts
from dsv4deploy.host.snapshot import _as_shell

FIXTURES = Path(__file__).parent / "fixtures" / "facts"
CASES = sorted(FIXTURES.glob("*/*.json"))

def _defined_facts() -> set[str]:
    return {name for name, obj in vars(facts).items()
            if isinstance(obj, type) and issubclass(obj, FactBase) and obj.__module__ == facts.__name__}


def _with_fixtures() -> set[str]:
    return {p.parent.name for p in CASES}


@pytest.mark.parametrize("path", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_fact_reads_what_its_command_prints(path):
    case = json.loads(path.read_text())
    fact = getattr(facts, path.parent.name)()
    command = _as_shell(fact.command(**case["arg"]))      # also: the arguments still fit
    if "command" in case:
        assert command == case["command"]
    if "raises" in case:
        with pytest.raises(ValueError, match=re.escape(case["raises"])):
            fact.process(case["output"])
    else:
        assert json.loads(json.dumps(fact.process(case["output"]))) == case["fact"]


def test_every_fact_has_fixtures():
    missing = _defined_facts() - _with_fixtures()
    assert not missing, f"facts without fixtures in {FIXTURES}: {sorted(missing)}"
    assert not _with_fixtures() - _defined_facts(), "fixtures of a fact host/facts.py no longer defines"

