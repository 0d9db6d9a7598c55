"""Run a deploy step's program as an unprivileged account in the server unit's sandbox.

Root installs the venvs and fetches nothing itself: every program that reads the network or a
venv's packages (the weights download with the venv's `hf`, the checkpoint's verification, the
launch check that imports SGLang, the NCCL probe) runs as a transient unit, `systemd-run --wait
--pipe --collect`, whose properties are the rendered server unit's sandbox (its ProtectSystem,
NoNewPrivileges, empty capability set, system-call filter, device and IP rules) with the
differences each use needs, stated in USES and nowhere else. Root only moves files, writes units
and talks to systemd.

Who runs what: the server's account runs the launch check and the NCCL probe (what the server
will run, with what the server gets). The download and the verification run as FETCH_USER, the
account that owns the checkpoint folders: the server's account must never be able to change a
checkpoint (it holds code that runs with trust_remote_code, in every later release), so it
reads them as anyone reads a 0644 file, and no release's model code can rewrite them.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from dsv4deploy.render.layout import FETCH_USER
from dsv4deploy.render.unitcheck import unit_directives

# What the server's unit says about starting, stopping and feeding its own process, not about its
# sandbox: everything else in its [Service] (User=, the Protect*/Restrict* settings, the device
# and IP rules, the limits) is each use's too, read from the rendered unit (unit_sandbox).
LAUNCH_ONLY = frozenset({"Type", "ExecStart", "Restart", "RestartSec", "TimeoutStartSec", "TimeoutStopSec",
                         "KillMode", "KillSignal", "Environment", "EnvironmentFile", "LoadCredential",
                         "WorkingDirectory", "StateDirectory", "StateDirectoryMode"})
# HOME of every use: its own private /tmp (PrivateTmp=yes), empty at start and removed by systemd
# when the unit ends; never an account's home nor a release's (Layout.home).
HOME = "/tmp"
# The host's proxy settings, as the login that runs the deploy has them (systemd-run --setenv=NAME
# copies NAME from its own environment): the download's route to the hub, as before.
PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
# Where a use's credentials are, in its argv: systemd puts its own $CREDENTIALS_DIRECTORY there
# at exec time, whatever the transient unit is called (a fixed --unit= name can stay loaded after
# its run where systemd cannot empty its cgroup, and the next run then cannot start).
CREDENTIALS = "${CREDENTIALS_DIRECTORY}"


@dataclass(frozen=True)
class Use:
    """How one use differs from the server's sandbox: USER instead of the unit's (None: the
    unit's own), the unit's settings it does not take (DROP), the ones it adds (ADD), and whether
    the host's proxy variables reach it (PROXIES)."""

    why: str
    user: str | None = None
    drop: frozenset[str] = frozenset()
    add: tuple[str, ...] = ()
    proxies: bool = False


USES = {
    # The download needs the hub and its CDN, which are not loopback: no IPAddressDeny/Allow is
    # copied to it (the server's egress rule would refuse every byte); it needs no GPU; and what it
    # writes must be readable by the server's account (UMask 0022 instead of the unit's 0027).
    "download": Use("fetches the checkpoint: network to the hub, writes the checkpoint folder only",
                    user=FETCH_USER, drop=frozenset({"User", "Group", "IPAddressDeny", "IPAddressAllow", "DeviceAllow"}),
                    add=("UMask=0022", "PrivateTmp=yes"), proxies=True),
    # The verification reads every byte and writes its marker (one record per file proven) and
    # removes the files it proved bad, in that folder and nowhere else; no network at all.
    "verify": Use("hashes the checkpoint: no network, writes its marker in the checkpoint folder only",
                  user=FETCH_USER, drop=frozenset({"User", "Group", "DeviceAllow"}),
                  add=("UMask=0022", "PrivateNetwork=yes", "PrivateTmp=yes")),
    # The launch check imports the venv's SGLang as the server will, with the venv read-only (the
    # server's ProtectSystem=strict), no network and an empty HOME.
    "launch check": Use("imports the venv's SGLang: the server's account, no network, empty HOME",
                        add=("PrivateNetwork=yes", "PrivateTmp=yes")),
    # The NCCL probe: exactly the server's sandbox (its IPAddressDeny=any included), empty HOME.
    "nccl probe": Use("all-reduces on the server's GPUs: the server's account and sandbox, empty HOME",
                      add=("PrivateTmp=yes",)),
}


def unit_sandbox(unit: str) -> list[str]:
    """The rendered unit's sandbox as `systemd-run --property=` values, in the unit's order.
    ValueError for a setting holding a specifier (%i, %d): a transient unit would not resolve it
    as the unit does."""
    found = [f"{d.key}={d.value}" for d in unit_directives(unit) if d.section == "Service" and d.key not in LAUNCH_ONLY]
    unresolved = [p for p in found if "%" in p]
    if unresolved:
        raise ValueError(f"the unit's {unresolved[0]} holds a specifier: not a sandbox setting systemd-run can take")
    return found


def properties(unit: str, use: str, writable: tuple[str, ...] = (), credentials: dict[str, str] | None = None) -> list[str]:
    """USE's properties: the unit's sandbox less what USES drops, its account, what it adds, the
    folders it may write (ReadWritePaths=) and its credentials (LoadCredential=NAME:FILE: a root-only
    file systemd hands to the unit's account, never in argv or environment)."""
    u = USES[use]
    added = dict(p.split("=", 1) for p in u.add)
    # a setting the use adds takes the unit's own place (UMask=0022 for its UMask=0027), the rest follow
    props = [f"{key}={added.pop(key)}" if key in added else f"{key}={value}"
             for key, value in (p.split("=", 1) for p in unit_sandbox(unit)) if key not in u.drop]
    if u.user:
        props += [f"User={u.user}", f"Group={u.user}"]
    props += [f"{key}={value}" for key, value in added.items()]
    props += [f"ReadWritePaths={path}" for path in writable]
    props += [f"LoadCredential={name}:{path}" for name, path in (credentials or {}).items()]
    return props


def _literal(arg: str) -> str:
    """ARG as systemd passes it on: it expands `$` in a transient unit's command line at exec time
    (systemd 252, Debian 12) and reads `$$` as one `$`; only CREDENTIALS is left to it."""
    return arg.replace("$", "$$").replace("$" + CREDENTIALS, CREDENTIALS)


def command(argv: list[str], unit: str, use: str, *, writable: tuple[str, ...] = (), env: dict[str, str] | None = None,
            credentials: dict[str, str] | None = None) -> str:
    """The shell command that runs ARGV as USE (see USES) and waits for it; its stdin, stdout,
    stderr and exit status are the caller's. A credential NAME is CREDENTIALS/NAME in ARGV."""
    q = shlex.quote
    run = ["systemd-run", "--quiet", "--wait", "--pipe", "--collect",
           *(f"--property={p}" for p in properties(unit, use, writable, credentials)),
           *(f"--setenv={k}={v}" for k, v in {"HOME": HOME, **(env or {})}.items()),
           *(f"--setenv={k}" for k in (PROXY_VARIABLES if USES[use].proxies else ())),
           "--", *(_literal(a) for a in argv)]
    return " ".join(q(a) for a in run)
