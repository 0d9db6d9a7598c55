"""Whose account the service and the gate run as: one the deploy makes, or one it made before.

The deploy sets its accounts' shell to nologin and their home to its state folder. Done to a
login account (the SSH user's, an operator's, root) that locks a person out and hands their
files to model code. So, judged from the host's one read (host/facts.py Accounts), before
anything changes (tasks/preflight.py), an account is:

- absent: made as a system account with MARKER as its comment (useradd --comment);
- ours: a system uid (1..SYS_UID_MAX), a nologin shell and MARKER;
- adopted: what an earlier release made before the marker existed: a system uid, a nologin
  shell, an empty comment and the home the deploy gives it (under its state folder; the gate's
  /nonexistent); the deploy then sets MARKER;
- anything else, and always the SSH user (the deploy's own login, sudo or not) or uid 0: refused.

The login itself must be root, or go through sudo (login_problem): the inventory says so before
connecting (inventory/ct200.py), the host's read for any inventory (uid and `sudo -n`).
"""

from __future__ import annotations

from dataclasses import dataclass

from dsv4deploy.render.layout import STATE

MARKER = "dsv4deploy service account"       # the comment (GECOS) the deploy gives the accounts it makes
NOLOGIN_SHELLS = ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false", "/usr/bin/false")
SYS_UID_MAX = 999                           # /etc/login.defs' default when it names none


@dataclass(frozen=True)
class Verdict:
    action: str             # "create", "ours", "adopt" or "refuse"
    why: str = ""           # a refusal's reason


def verdict(name: str, home: str, accounts: dict) -> Verdict:
    """Pure: what the deploy may do with account NAME (its home to be HOME), from ACCOUNTS
    (the Accounts fact: users, groups, ssh_user, sys_uid_max)."""
    entry = (accounts.get("users") or {}).get(name)
    limit = accounts.get("sys_uid_max") or SYS_UID_MAX
    if name == accounts.get("ssh_user"):
        return Verdict("refuse", "it is the account this deploy logs in as (the SSH user): the deploy would "
                                 "set its shell to nologin and its home to the service's folder")
    if entry is None:
        gid = (accounts.get("groups") or {}).get(name)
        if gid is not None and not 0 < gid <= limit:
            return Verdict("refuse", f"the account is absent but a group {name} with gid {gid} exists (not a "
                                     f"system group, 1..{limit}): the service would join it")
        return Verdict("create")
    uid, shell, comment = entry.get("uid"), entry.get("shell", ""), entry.get("comment", "")
    if uid == 0:
        return Verdict("refuse", "it is root (uid 0)")
    if not isinstance(uid, int) or uid > limit:
        return Verdict("refuse", f"it is a login account (uid {uid}, above SYS_UID_MAX {limit})")
    if shell not in NOLOGIN_SHELLS:
        return Verdict("refuse", f"it has a login shell ({shell or 'the default shell'})")
    if comment == MARKER:
        return Verdict("ours")
    if comment == "" and _deploys_home(entry.get("home", ""), home):
        return Verdict("adopt")
    return Verdict("refuse", f"it is a system account dsv4deploy did not make (comment {comment!r}, home "
                             f"{entry.get('home')!r}; the accounts dsv4deploy makes say {MARKER!r})")


def _deploys_home(have: str, want: str) -> bool:
    """HAVE is a home the deploy gives: WANT itself, or (a service) a folder under its state."""
    return have == want or (want.startswith(f"{STATE}/") and have.startswith(f"{STATE}/"))


def account_problems(wanted: list[tuple[str, str, str, str]], accounts: dict) -> list[str]:
    """Pure: one line per refused account of WANTED ((name, home, what it is for, what to do
    instead)); [] when each
    is absent, ours or adoptable. ACCOUNTS without the host's answer (the read failed) is refused:
    the deploy does not take over an account it could not look at."""
    if "ssh_user" not in accounts:
        return ["could not read the host's accounts (getent passwd): the deploy does not make or change an "
                "account it could not look at"]
    problems = []
    for name, home, role, remedy in wanted:
        v = verdict(name, home, accounts)
        if v.action == "refuse":
            problems.append(f"account {name!r} ({role}) cannot be the deploy's: {v.why}; {remedy}")
    return problems


# What a deploy writes as root: a login that is neither root nor through sudo cannot, and would
# fail at its first write (the lock under /var/lib) with a message about the lock, not the login.
NEEDS_ROOT = "it writes /opt, /etc, /srv, /var/lib and systemd units as root"
USE_SUDO = "CT200_SUDO=1 with inventory/ct200.py, pyinfra's --sudo, or host data _sudo: True"


def login_problem(user: str, uid: int | None, sudo: bool, sudo_usable: bool | None = None) -> str | None:
    """Pure: why the deploy cannot run as USER (uid UID; None: not known before connecting) with
    the inventory's SUDO; None when it can (root, or any login through sudo). SUDO_USABLE: whether
    `sudo -n true` worked for USER on the host (None: not asked), which says what to do."""
    if sudo or uid == 0 or (uid is None and user == "root"):
        return None
    who = user if uid is None else f"{user} (uid {uid})"
    if sudo_usable:
        fix = f"{user} has passwordless sudo there: use it ({USE_SUDO})"
    else:
        fix = f"connect as root, or give {user} passwordless sudo and use it ({USE_SUDO})"
    return f"the deploy logs in as {who} without sudo, but {NEEDS_ROOT}: {fix}"
