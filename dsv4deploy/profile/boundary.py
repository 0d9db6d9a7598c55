"""The one rule for every string that leaves a profile for a rendered file, an argv word or a
shell: a full-match pattern (never `^...$`: `$` also matches before a final newline, which is
how a value ending in "\\n" used to smuggle an `ExecStartPre=+...` line into the unit), only
printable characters (no C0/C1 controls, DEL, U+0085, U+2028/U+2029, bidi or zero-width
format characters), and a length limit.

`value_problems` walks the whole merged profile once and answers (key path, message) pairs;
profiles.py turns them into file:line problems. The render-time round trip (unitcheck.py)
then proves the rendered files say exactly what the profile asked for.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass

MAX_ARG_STRLEN = 131072           # Linux: the most bytes one argv or environment string may hold (NUL included)
SYSTEMD_LINE_MAX = 1024 * 1024    # systemd reads unit and environment-file lines up to LONG_LINE_MAX
RENDERED_LINE_MAX = 256 * 1024    # our ceiling for one rendered line: well under systemd's
MAX_INT = 2**53                   # beyond this a number is no setting anyone meant (and JSON tools lose it)

_CHAR_NAMES = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\x00": "a NUL byte",
               "\x7f": "DEL", "\x85": "U+0085 (next line)", "\u2028": "U+2028 (line separator)",
               "\u2029": "U+2029 (paragraph separator)", "\ufeff": "U+FEFF (byte order mark)"}


def char_name(ch: str) -> str:
    """How a refused character is named in a message: 'a newline', 'U+202E (RIGHT-TO-LEFT OVERRIDE)'."""
    if ch in _CHAR_NAMES:
        return _CHAR_NAMES[ch]
    name = unicodedata.name(ch, "") or unicodedata.category(ch)
    return f"U+{ord(ch):04X} ({name})"


def first_unprintable(text: str) -> int | None:
    """Index of the first character that is not printable (str.isprintable: every Cc, Cf, Cs,
    Co, Cn, Zl, Zp and every space but ' '), or None. The common case is one C-speed call."""
    if text.isprintable():
        return None
    return next(i for i, ch in enumerate(text) if not ch.isprintable())


def escaped(text: str, keep: str = "") -> str:
    """TEXT as a terminal may show it: each character that is not printable (an escape sequence's
    ESC, a carriage return, a bidi override) written as Python escapes it (\\x1b, \\r, \\u202e),
    except those in KEEP. For what a host or its server wrote (a journal line, an HTTP answer, a
    file's diff): model code runs there and must not drive the operator's terminal."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch in keep else ascii(ch)[1:-1] for ch in text)


def shown(value, limit: int = 60) -> str:
    """A value quoted for a message: control characters escaped, long values cut."""
    text = ascii(value) if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Rule:
    """What one kind of string must be: `what` is said to the user when `pattern` does not match."""

    what: str
    max_len: int
    pattern: str | None = None
    min_len: int = 1

    def check(self, value: str) -> str | None:
        """None when `value` is acceptable, else the message."""
        if len(value) > self.max_len:
            return f"too long: {len(value):,} characters, at most {self.max_len:,} ({self.what})"
        if len(value) < self.min_len:
            return "must not be empty"
        bad = first_unprintable(value)
        if bad is not None:
            return (f"contains {char_name(value[bad])} at character {bad + 1}: {shown(value)}; no newline "
                    "or control character may reach the unit, an argv word or a shell")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            return f"{shown(value)} is not valid here: {self.what}"
        return None


NAME_PATTERN = r"_?[A-Za-z0-9][A-Za-z0-9._-]*"
PROFILE_NAME = Rule("a profile name: letters, digits, '.', '_' and '-', starting with a letter or digit "
                    "(a leading '_' marks a shared base)", 100, NAME_PATTERN)
TEXT = Rule("one line of printable text", 1024)
KEY = Rule("a key", 128)
URL = Rule("an http(s) URL of RFC 3986 characters, without quotes, backslashes, '$' or ';' "
           "(percent-encode them)", 4096, r"https?://[A-Za-z0-9._~:/?#\[\]@!&()*+,=%-]+")
INDEX_URL = Rule("an https:// URL of RFC 3986 characters, without quotes, backslashes, '$' or ';' (an index "
                 "over http:// can be answered by anyone on the way, and root installs what it serves)", 4096,
                 r"https://[A-Za-z0-9._~:/?#\[\]@!&()*+,=%-]+")
PACKAGE_NAME = Rule("a package name as PyPI spells it: letters, digits, '.', '_' and '-'", 128,
                    r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
ARGV_WORD = Rule("one argv word", 16384)
ENV_KEY = Rule("an environment variable name: upper-case letters, digits and '_'", 128, r"[A-Z][A-Z0-9_]*")
ENV_VALUE = Rule("an environment value", 16384, min_len=0)
NCCL_KEY = Rule("an NCCL variable: NCCL_ then upper-case letters, digits and '_'", 128, r"NCCL_[A-Z0-9_]+")
NCCL_VALUE = Rule("an NCCL value: letters, digits and . , : = + / @ % ^ _ - (no spaces, quotes, "
                  "backslashes or $: nccl.env is read by systemd's EnvironmentFile= parser and by NCCL)",
                  256, r"[A-Za-z0-9.,:=+/@%^_-]+")
NETWORK = Rule("an IP network in CIDR notation or one address, e.g. 10.0.0.0/8, 192.0.2.7 or fd00::/8 "
               "(network.py then parses it)", 64, r"[0-9A-Fa-f.:]+(/[0-9]{1,3})?")

# Every string position in a profile; "*" is any list index, "<key>" any mapping key.
RULES: dict[tuple, Rule] = {
    ("description",): TEXT,
    ("$schema",): Rule("a schema URL or path", 4096),
    ("model", "repo"): Rule("a Hugging Face repo id: owner/name", 256,
                            r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*"),
    ("model", "revision"): Rule("a 40-hex commit sha", 40, r"[0-9a-f]{40}"),
    ("model", "source", "path"): Rule("a local folder or an rsync source, not starting with '-'", 4096,
                                      r"[^-].*"),
    ("model", "served_model_name"): Rule("letters, digits, '.', '_', '/' and '-', starting with a letter "
                                         "or digit", 256, r"[A-Za-z0-9][A-Za-z0-9._/-]*"),
    ("sglang", "version"): Rule("a release like 0.5.23", 32, r"[0-9]+\.[0-9]+\.[0-9]+(\.post[0-9]+)?"),
    ("sglang", "extras", "*"): Rule("a pip extra: lower-case letters, digits, '_' and '-'", 64,
                                    r"[a-z0-9][a-z0-9_-]*"),
    ("sglang", "index_url"): INDEX_URL,
    ("sglang", "extra_index_urls", "*"): INDEX_URL,
    ("sglang", "indexes", "*", "name"): Rule("an index name: letters, digits, '.', '_' and '-', starting with a "
                                             "letter or digit", 64, r"[A-Za-z0-9][A-Za-z0-9._-]*"),
    ("sglang", "indexes", "*", "url"): INDEX_URL,
    ("sglang", "indexes", "*", "packages", "*"): PACKAGE_NAME,
    ("sglang", "patches", "*", "name"): Rule("letters, digits, '.', '_' and '-', starting with a letter or "
                                             "digit", 100, r"[A-Za-z0-9][A-Za-z0-9._-]*"),
    ("sglang", "patches", "*", "url"): URL,
    ("sglang", "patches", "*", "file"): Rule("a relative path inside the project (letters, digits, "
                                             "'.', '_', '-', '/'; no '..')", 1024,
                                             r"(?!.*(^|/)\.\.?(/|$))[A-Za-z0-9_][A-Za-z0-9._/-]*"),
    ("sglang", "patches", "*", "sha256"): Rule("lower-case hex sha256", 64, r"[0-9a-f]{64}"),
    ("server", "host"): Rule("a host name or IP address", 255, r"[0-9A-Za-z:][0-9A-Za-z.:-]*"),
    ("server", "extra_args", "*"): ARGV_WORD,
    ("server", "env", "<key>"): ENV_VALUE,
    ("nccl", "overrides", "<key>"): NCCL_VALUE,
    ("driver", "cuda_toolkit"): Rule("an apt package like cuda-toolkit-13-0", 64, r"cuda-toolkit-[0-9]+-[0-9]+"),
    ("service", "name"): Rule("a unit name: lower-case letters, digits and '-', starting with a letter",
                              64, r"[a-z][a-z0-9-]*"),
    ("service", "user"): Rule("a user name: lower-case letters, digits, '_' and '-'", 32,
                              r"[a-z_][a-z0-9_-]*"),
    ("service", "hardening_off_reason"): TEXT,
    ("service", "allow_clients", "*"): NETWORK,
    ("service", "allow_egress", "*"): NETWORK,
    ("calibration", "measured"): TEXT,
    ("replicas", "gateway", "host"): Rule("a host name or IP address", 255, r"[0-9A-Za-z:][0-9A-Za-z.:-]*"),
    ("replicas", "gateway", "version"): Rule("an smg release like 1.13.0", 32, r"[0-9]+\.[0-9]+\.[0-9]+(\.post[0-9]+)?"),
}
KEY_RULES: dict[tuple, Rule] = {("server", "env"): ENV_KEY, ("nccl", "overrides"): NCCL_KEY}
# Strings and integers go through the same rule here (an integer is checked as it is rendered),
# and load.py turns them into that rendered text (normalize_rendered) before any rule reads them.
STRINGLIKE = {("server", "env", "<key>"), ("nccl", "overrides", "<key>")}

assert all(r.max_len * 4 < MAX_ARG_STRLEN for r in (*RULES.values(), *KEY_RULES.values()))


def _rule_key(path: tuple) -> tuple:
    """("server", "extra_args", 3) -> ("server", "extra_args", "*"); env keys -> "<key>"."""
    out = []
    for i, part in enumerate(path):
        if isinstance(part, int):
            out.append("*")
        elif i == 2 and tuple(path[:2]) in KEY_RULES:
            out.append("<key>")
        else:
            out.append(part)
    return tuple(out)


def rule_for(path: tuple) -> Rule:
    return RULES.get(_rule_key(path), TEXT)


def value_problems(data, path: tuple = ()) -> list[tuple[tuple, str]]:
    """(key path, message) for every string, key or number of `data` that breaks its rule."""
    found: list[tuple[tuple, str]] = []
    if isinstance(data, dict):
        key_rule = KEY_RULES.get(path, KEY)
        for key, value in data.items():
            sub = path + (key,)
            msg = key_rule.check(key) if isinstance(key, str) else None
            if msg:
                found.append((sub, f"key {msg}"))
                continue
            found += value_problems(value, sub)
    elif isinstance(data, list):
        for i, item in enumerate(data):
            found += value_problems(item, path + (i,))
    elif isinstance(data, str):
        msg = rule_for(path).check(data)
        if msg:
            found.append((path, msg))
    elif isinstance(data, bool) or data is None:
        pass
    elif isinstance(data, int):
        if abs(data) > MAX_INT:
            found.append((path, f"number too large: {shown(data)}"))
        elif _rule_key(path) in STRINGLIKE:
            msg = rule_for(path).check(str(data))
            if msg:
                found.append((path, msg))
    elif isinstance(data, float):
        if not math.isfinite(data):
            found.append((path, f"must be a finite number, got {data}"))
        elif abs(data) > MAX_INT:
            found.append((path, f"number too large: {data!r}"))
    return found


def rendered_text(value) -> str:
    """The text an environment or NCCL value is rendered as, the one spelling rules judge:
    a string as it is, an integer in decimal (YAML's 1, 0x1 and 01 are all "1"), true and false
    as "1" and "0". The schema refuses every other type before this runs (1.0, a list, null)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, (int, str)):
        return str(value)
    raise TypeError(f"not a rendered scalar: {value!r}")


def normalize_rendered(data: dict) -> None:
    """Replace, in place, every STRINGLIKE value of a schema-valid profile (server.env,
    nccl.overrides) by its rendered text: a rule then sees what the host will get, never the
    YAML spelling (`NCCL_P2P_DISABLE: 1` and `"1"` are one value)."""
    for top, sub, _ in sorted(STRINGLIKE):
        mapping = (data.get(top) or {}).get(sub)
        if isinstance(mapping, dict):
            for key, value in mapping.items():
                mapping[key] = rendered_text(value)


def check_name(name) -> str | None:
    """The profile-name rule, for the command line and `extends:`."""
    if not isinstance(name, str):
        return "expected a profile name (string)"
    return PROFILE_NAME.check(name)
