"""Start smg with the API key read from a systemd credential, never from argv or environment.

smg 1.13.0 takes its key only as `--api-key KEY` (argv: world-readable in /proc/PID/cmdline)
and reads no environment variable or file for it. Its Python launcher parses the command line
into a `RouterArgs` dataclass and hands it to the Rust core; this file does the same and sets
`api_key` in between, from `$CREDENTIALS_DIRECTORY/<name>`. Runs in the gateway's own venv
(stdlib plus smg; nothing from dsv4deploy), copied there by the deploy as a rendered file:

    python dsv4deploy-gateway-launch.py --key-credential gateway-api-key -- <smg launch flags>
    python dsv4deploy-gateway-launch.py -- <smg launch flags>          # a profile without a key
"""

from __future__ import annotations

import os
import sys

USAGE = "usage: dsv4deploy-gateway-launch.py [--key-credential NAME] -- SMG_LAUNCH_FLAGS..."
REFUSED = ("--api-key", "--control-plane-api-keys", "--tenant-api-key")


def _fail(message: str) -> int:
    print(f"dsv4deploy-gateway-launch: {message}", file=sys.stderr)
    return 2


def split_argv(argv: list[str]) -> tuple[str | None, list[str]]:
    """(credential name or None, smg flags); ValueError on any other shape."""
    if argv[:1] == ["--"]:
        name, flags = None, argv[1:]
    elif len(argv) >= 3 and argv[0] == "--key-credential" and argv[2] == "--":
        name, flags = argv[1], argv[3:]
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"--key-credential takes a credential name, got {name!r}")
    else:
        raise ValueError(USAGE)
    for flag in flags:
        if flag.split("=", 1)[0] in REFUSED:
            raise ValueError(f"{flag.split('=', 1)[0]} on the command line would show the key in "
                             "/proc/PID/cmdline; the key comes from the credential")
    return name, flags


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
        name, flags = split_argv(sys.argv[1:] if argv is None else argv)
        key = read_key(name, os.environ) if name else None
    except ValueError as exc:
        return _fail(str(exc))
    from smg.launch_router import launch_router, parse_router_args

    args = parse_router_args(flags)
    if key:
        args.api_key = key  # data plane, control plane (/workers) and the gateway's calls to the workers
    launch_router(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
