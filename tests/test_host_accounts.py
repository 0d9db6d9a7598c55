"""host/accounts.py: the service's and the gate's accounts are ones the deploy makes, or made
before, or the deploy is refused before any change. Judged from what the host's one read says
(the Accounts fact's fixtures, tests/fixtures/facts/Accounts/, and small variations of them)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from dsv4deploy.host.accounts import MARKER, account_problems, login_problem, verdict
from dsv4deploy.host.facts import Accounts
from dsv4deploy.host.release_store import LOGIN_CHECK, LOGIN_MARK, login_refused
from dsv4deploy.render.layout import GATE_USER

FACTS = Path(__file__).parent / "fixtures" / "facts" / "Accounts"
HOME = "/var/lib/dsv4deploy/sglang"


def read(case: str) -> dict:
    """What the Accounts fact made of a recorded read."""
    return json.loads((FACTS / f"{case}.json").read_text())["fact"]


def wanted(user: str = "sglang") -> list[tuple[str, str, str, str]]:
    return [(user, HOME, "service.user", "name another"), (GATE_USER, "/nonexistent", "gate", "remove it")]


def with_user(accounts: dict, name: str, **fields) -> dict:
    changed = copy.deepcopy(accounts)
    changed["users"][name] = {**changed["users"].get(name, {}), **fields}
    return changed


def test_a_fresh_host_gets_both_accounts_made():
    accounts = read("fresh-host")
    assert [verdict(name, home, accounts).action for name, home, _, _ in wanted()] == ["create", "create"]
    assert account_problems(wanted(), accounts) == []


def test_accounts_the_deploy_marked_are_its_own():
    accounts = read("marked-under-sudo")
    assert verdict("sglang", HOME, accounts).action == "ours"
    assert verdict(GATE_USER, "/nonexistent", accounts).action == "ours"
    assert account_problems(wanted(), accounts) == []


def test_an_earlier_release_s_unmarked_accounts_are_adopted():
    """What useradd made before the marker: system uid, nologin, empty comment, the deploy's home
    (a service renamed since: another folder under the deploy's state)."""
    accounts = read("both-present")
    assert verdict("sglang", HOME, accounts).action == "adopt"
    assert verdict("sglang", "/var/lib/dsv4deploy/sglang-ctx8k", accounts).action == "adopt"
    assert verdict(GATE_USER, "/nonexistent", accounts).action == "adopt"


def test_a_login_account_is_refused_and_named():
    problems = account_problems(wanted(), read("user-made-by-hand"))
    assert len(problems) == 1 and problems[0].startswith("account 'sglang' (service.user)")
    assert "login account (uid 1001, above SYS_UID_MAX 999)" in problems[0]


def test_the_ssh_user_is_refused_even_when_it_looks_like_a_system_account():
    accounts = read("ssh-user-as-service")
    assert "the SSH user" in verdict("deploy", HOME, accounts).why
    quiet = with_user(accounts, "deploy", uid=990, shell="/usr/sbin/nologin", comment=MARKER)
    assert verdict("deploy", HOME, quiet).action == "refuse"
    assert account_problems(wanted("deploy"), accounts)[0].startswith("account 'deploy' (service.user)")


def test_root_is_refused_by_uid_whatever_its_name():
    accounts = with_user(read("fresh-host"), "sglang", uid=0, gid=0, comment=MARKER, home=HOME,
                         shell="/usr/sbin/nologin")
    assert verdict("sglang", HOME, accounts).why == "it is root (uid 0)"


@pytest.mark.parametrize("fields, why", [
    ({"shell": "/bin/bash"}, "login shell (/bin/bash)"),                       # marked, then given a shell
    ({"comment": "SGLang server"}, "did not make"),                            # someone else's comment
    ({"comment": "", "home": "/opt/sglang"}, "did not make"),                  # unmarked, not the deploy's home
    ({"uid": 1500}, "above SYS_UID_MAX 499"),                                  # login.defs' bound is read
], ids=["shell", "other-comment", "unmarked-elsewhere", "uid-above-bound"])
def test_anything_else_is_refused(fields, why):
    accounts = with_user(read("marked-under-sudo"), "sglang", **fields)
    v = verdict("sglang", HOME, accounts)
    assert v.action == "refuse" and why in v.why


def test_an_existing_login_group_of_the_name_is_refused():
    accounts = copy.deepcopy(read("fresh-host"))
    accounts["groups"]["sglang"] = 1000
    assert "group sglang with gid 1000" in verdict("sglang", HOME, accounts).why
    accounts["groups"]["sglang"] = 990                  # a system group left behind: the account joins it
    assert verdict("sglang", HOME, accounts).action == "create"


def test_a_read_that_said_nothing_refuses_rather_than_assumes_absent():
    assert "could not read the host's accounts" in account_problems(wanted(), {})[0]


# --- the login itself: root, or through sudo -------------------------------------------------

def test_root_or_sudo_may_deploy_and_any_other_login_is_refused():
    assert login_problem("root", None, sudo=False) is None           # the inventory's root, before connecting
    assert login_problem("ops", 0, sudo=False) is None               # what the host says wins over the name
    assert login_problem("ops", None, sudo=True) is None
    said = login_problem("ops", 1000, sudo=False, sudo_usable=False)
    assert said.startswith("the deploy logs in as ops (uid 1000) without sudo, but it writes /opt") and \
        "connect as root, or give ops passwordless sudo" in said
    assert "ops has passwordless sudo there: use it (CT200_SUDO=1" in login_problem("ops", 1000, False, True)
    assert login_problem("root", 1000, sudo=False)                   # a "root" that is not uid 0


def test_the_lock_s_login_check_is_read_back_and_nothing_else_is():
    assert login_refused([f"{LOGIN_MARK} ops 1000 yes"]) == login_problem("ops", 1000, False, True)
    assert login_refused(['{"controller": "c", "pid": 1}']) is None    # a lock holder's owner.json
    assert LOGIN_CHECK.startswith('[ "$(id -u)" = 0 ] ||')


def test_the_host_read_says_who_it_ran_as():
    found = Accounts().process(["ssh_user:ops", "uid:1000", "sudo:no"])
    assert (found["uid"], found["sudo_usable"]) == (1000, False)
    assert "sudo_usable" not in Accounts().process(["ssh_user:ops", "uid:0"])    # root is not asked
