"""The operator's Hugging Face token on the control node: DSV4_HF_TOKEN_FILE (a file) or
DSV4_HF_TOKEN. Never a profile key. Pure: the deploy's secrets step (which copies it to the
host's 0600 token file) and `dsv4deploy pin` (which resolves a revision with it) share it."""

from __future__ import annotations

import re
from pathlib import Path

HF_TOKEN_FILE_VAR, HF_TOKEN_VAR = "DSV4_HF_TOKEN_FILE", "DSV4_HF_TOKEN"
HF_TOKEN_RE = re.compile(r"[A-Za-z0-9_.-]{8,512}")


class HfTokenError(ValueError):
    """The token the environment names cannot be used; `source` is the variable at fault."""

    def __init__(self, message: str, source: str):
        super().__init__(message)
        self.source = source


def hf_token_from_env(env) -> str | None:
    """The token ENV (the control node's environment, as the command's settings hold it) names,
    None when neither variable is set; HfTokenError when unreadable or malformed."""
    path = env.get(HF_TOKEN_FILE_VAR)
    if path:
        try:
            token = Path(path).expanduser().read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise HfTokenError(f"{HF_TOKEN_FILE_VAR}={path}: cannot read the HF token ({exc})",
                               HF_TOKEN_FILE_VAR) from None
    else:
        token = env.get(HF_TOKEN_VAR, "").strip()
    if not token:
        return None
    if not HF_TOKEN_RE.fullmatch(token):
        source = HF_TOKEN_FILE_VAR if path else HF_TOKEN_VAR
        raise HfTokenError(f"the HF token from {source} is not one line of "
                           "token characters (letters, digits, '_', '-', '.')", source)
    return token
