"""What the twin writes, as SGLang 0.5.23 writes it: log lines on stderr (the journal under
systemd), tracebacks at SGLang's own paths, and the secrets shown in clear or masked, as the
installed SGLang tree (patched or not) would.  ``StartupFailure`` ends a start whose error is
already logged.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
import time
from pathlib import Path

from dsv4deploy.sglang.patches import mask_secrets_applied

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
SECRET_FIELDS = ("api_key", "admin_api_key", "ssl_keyfile_password")


@functools.cache
def secrets_masked() -> bool:
    """Whether the SGLang installed next to the twin (the venv's real wheel, which the deploy
    patches) carries the mask-secrets patch: the twin then masks as the patched SGLang does."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return False
    site = Path(list(spec.submodule_search_locations)[0]).parent
    return mask_secrets_applied(site) is True


class Log:
    """SGLang-like log lines on stderr (the journal under systemd)."""

    def __init__(self, level: str = "info"):
        self.level = LEVELS.get(str(level).lower(), 20)

    def _emit(self, lvl: int, msg: str, tp: bool) -> None:
        if lvl < self.level:
            return
        ts = time.strftime("%Y-%m-%d %H:%M:%S")
        prefix = f"[{ts} TP0] " if tp else f"[{ts}] "
        if lvl >= 30:
            prefix += ("WARNING " if lvl == 30 else "ERROR ")
        sys.stderr.write(prefix + msg + "\n")
        sys.stderr.flush()

    def debug(self, msg: str, tp: bool = False) -> None:
        self._emit(10, msg, tp)

    def info(self, msg: str, tp: bool = False) -> None:
        self._emit(20, msg, tp)

    def warning(self, msg: str, tp: bool = False) -> None:
        self._emit(30, msg, tp)

    def error(self, msg: str, tp: bool = False) -> None:
        self._emit(40, msg, tp)

    @staticmethod
    def raw(text: str) -> None:
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.flush()


def _traceback(frames: list[tuple[str, int, str, str]], final: str) -> str:
    lines = ["Traceback (most recent call last):"]
    for path, line, func, code in frames:
        lines.append(f'  File "{path}", line {line}, in {func}')
        lines.append(f"    {code}")
    lines.append(final)
    return "\n".join(lines)


_SG = "/opt/sglang/lib/python3.11/site-packages/sglang/srt"


class StartupFailure(Exception):
    """Fatal startup error: message already logged, exit with ``code``."""

    def __init__(self, code: int = 1):
        super().__init__(code)
        self.code = code
