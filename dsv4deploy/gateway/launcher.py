"""Start smg with its keys read from systemd credentials, never from argv or environment.

smg 1.13.0 takes its keys only on its command line (`--api-key KEY`, `--control-plane-api-keys
id:name:role:KEY`: world-readable in /proc/PID/cmdline) and reads no environment variable or
file for them. Its Python launcher parses the command line into a `RouterArgs` dataclass and
hands it to the Rust core; this file does the same and sets `api_key` (the inference key: the
data plane, and what smg sends to the workers) and `control_plane_api_keys` (the control-plane
key, one admin entry: with it set, `/workers` takes only that key) in between, each from its
own file under `$CREDENTIALS_DIRECTORY`. Runs in the gateway's own venv (stdlib plus smg;
nothing from dsv4deploy), copied there by the deploy as a rendered file:

    python dsv4deploy-gateway-launch.py --key-credential gateway-api-key \
        --control-credential gateway-control-key -- <smg launch flags>
    python dsv4deploy-gateway-launch.py -- <smg launch flags>          # a profile without a key
"""

from __future__ import annotations

import os
import sys

USAGE = ("usage: dsv4deploy-gateway-launch.py [--key-credential NAME --control-credential NAME] "
         "-- SMG_LAUNCH_FLAGS...")
CONTROL_KEY_ID = "dsv4deploy"      # the control-plane key's id and name in smg (its audit log shows them)
REFUSED = ("--api-key", "--control-plane-api-keys", "--tenant-api-key")


def _fail(message: str) -> int:
    print(f"dsv4deploy-gateway-launch: {message}", file=sys.stderr)
    return 2


def split_argv(argv: list[str]) -> tuple[str | None, str | None, list[str]]:
    """(inference key's credential name, control-plane key's, smg flags): both names or neither;
    ValueError on any other shape."""
    if argv[:1] == ["--"]:
        name, control, flags = None, None, argv[1:]
    elif (len(argv) >= 5 and argv[0] == "--key-credential" and argv[2] == "--control-credential"
          and argv[4] == "--"):
        name, control, flags = argv[1], argv[3], argv[5:]
        for option, value in (("--key-credential", name), ("--control-credential", control)):
            if not value or "/" in value or value in (".", ".."):
                raise ValueError(f"{option} takes a credential name, got {value!r}")
        if name == control:
            raise ValueError("the inference key and the control-plane key are two credentials")
    else:
        raise ValueError(USAGE)
    for flag in flags:
        if flag.split("=", 1)[0] in REFUSED:
            raise ValueError(f"{flag.split('=', 1)[0]} on the command line would show the key in "
                             "/proc/PID/cmdline; the key comes from the credential")
    return name, control, flags


def read_key(name: str, environ) -> str:
    """The key in $CREDENTIALS_DIRECTORY/name (of ENVIRON, the process's own as main passes it):
    one line, stripped; ValueError if absent or empty."""
    folder = environ.get("CREDENTIALS_DIRECTORY")
    if not folder:
        raise ValueError("CREDENTIALS_DIRECTORY is not set: start this from the unit (LoadCredential=)")
    try:
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            key = f.read(4097).strip()
    except OSError as exc:
        raise ValueError(f"credential {name}: {exc.strerror}") from None
    if not key or len(key) > 4096 or not key.isprintable() or " " in key:
        raise ValueError(f"credential {name}: expected one line holding the key")
    return key


def main(argv: list[str] | None = None) -> int:
    try:
        name, control, flags = split_argv(sys.argv[1:] if argv is None else argv)
        key = read_key(name, os.environ) if name else None
        control_key = read_key(control, os.environ) if control else None
        if key and key == control_key:
            raise ValueError(f"credentials {name} and {control} hold the same key: one key per power")
    except ValueError as exc:
        return _fail(str(exc))
    from smg.launch_router import launch_router, parse_router_args

    args = parse_router_args(flags)
    if key:
        args.api_key = key  # data plane and the gateway's calls to the workers
    if control_key:         # (id, name, key, role), as smg's own parser makes it: /workers takes only this
        args.control_plane_api_keys = [(CONTROL_KEY_ID, CONTROL_KEY_ID, control_key, "admin")]
    launch_router(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
