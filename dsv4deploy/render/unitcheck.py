"""Read rendered files back the way systemd reads them.

The renderer quotes; this module un-quotes with systemd's own rules, written from
systemd.syntax(7) ("Quoting"), systemd.service(5) ("Command lines"), systemd.exec(5)
(Environment=, EnvironmentFile=) and the parsers they describe (conf-parser.c,
extract-word.c, load-fragment.c config_parse_exec/config_parse_environ, env-file.c).
render.py refuses a release unless the unit's ExecStart= and Environment= lines and the NCCL
env file read back to exactly the argv and environment the profile asked for.

Small and strict on purpose: what it does not model exactly (escapes outside systemd's table,
quotes opening inside a word, an unquoted lone ';', `$VAR` references, specifiers it cannot
resolve at render time, a comment line ending in a backslash) is a SyntaxProblem, never a guess.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

WHITESPACE = " \t\n\r"
COMMENTS = "#;"
LINE_BREAKS = re.compile(r"[\n\r\x00]")  # where systemd's read_line() ends a line
SHELL_NEED_ESCAPE = '"\\`$'
_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
                   "\\": "\\", '"': '"', "'": "'", "s": " "}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class SyntaxProblem(ValueError):
    """The text does not read back unambiguously under systemd's rules."""


@dataclass(frozen=True)
class Directive:
    line: int       # physical line the assignment starts on (1-based)
    section: str
    key: str
    value: str


# --- unit files ------------------------------------------------------------------------------

def unit_directives(text: str) -> list[Directive]:
    """Assignments of a unit file: comment and blank lines dropped, a line ending in an odd
    number of backslashes continued on the next (the backslash becomes a space), comment
    lines inside a continuation skipped, key and value stripped at the first '='."""
    out: list[Directive] = []
    section = ""
    pending: str | None = None
    start = 0
    for number, raw in enumerate(LINE_BREAKS.split(text), 1):
        stripped = raw.strip(WHITESPACE)
        if stripped[:1] and stripped[0] in COMMENTS:
            continue
        line = raw if pending is None else pending + raw
        if pending is None:
            start = number
        if line.rstrip(WHITESPACE).endswith("\\") and not line.endswith("\\"):
            raise SyntaxProblem(f"line {number}: a backslash followed by trailing whitespace")
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2:
            pending = line[:-1] + " "
            continue
        pending = None
        line = line.strip(WHITESPACE)
        if not line:
            continue
        if line.startswith("["):
            if not line.endswith("]"):
                raise SyntaxProblem(f"line {start}: malformed section header {line!r}")
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise SyntaxProblem(f"line {start}: not an assignment (systemd ignores it): {line[:60]!r}")
        out.append(Directive(start, section, key.strip(WHITESPACE), value.strip(WHITESPACE)))
    if pending is not None:
        raise SyntaxProblem("the file ends inside a continued line")
    return out


def _unescape(text: str, i: int) -> tuple[str, int]:
    """One C escape after a backslash at text[i-1] (systemd's cunescape_one)."""
    if i >= len(text):
        raise SyntaxProblem("a backslash at the end of the value")
    c = text[i]
    if c in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[c], i + 1
    for prefix, digits in (("x", 2), ("u", 4), ("U", 8)):
        if c == prefix:
            chunk = text[i + 1:i + 1 + digits]
            if not re.fullmatch(f"[0-9A-Fa-f]{{{digits}}}", chunk):
                raise SyntaxProblem(f"bad \\{prefix} escape")
            code = int(chunk, 16)
            if code == 0 or code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise SyntaxProblem(f"\\{prefix}{chunk} is not a character systemd accepts")
            return chr(code), i + 1 + digits
    if c in "01234567":
        chunk = text[i:i + 3]
        if not re.fullmatch(r"[0-7]{3}", chunk) or not 0 < int(chunk, 8) <= 0o377:
            raise SyntaxProblem("bad octal escape")
        return chr(int(chunk, 8)), i + 3
    raise SyntaxProblem(f"unknown escape \\{c} (systemd would keep it verbatim, with a warning)")


def split_words(value: str) -> list[str]:
    """extract_first_word(EXTRACT_UNQUOTE|EXTRACT_CUNESCAPE) until the end: whitespace
    separates words, a word may be wrapped whole in '...' or "...", C escapes work inside and
    outside quotes. An unquoted lone ';' (ExecStart's command separator) is refused."""
    words: list[str] = []
    i, n = 0, len(value)
    while True:
        while i < n and value[i] in WHITESPACE:
            i += 1
        if i >= n:
            return words
        if value[i] == ";" and (i + 1 == n or value[i + 1] in WHITESPACE):
            raise SyntaxProblem("an unquoted ';' separates commands")
        if value[i:i + 2] == "\\;" and (i + 2 == n or value[i + 2] in WHITESPACE):
            words.append(";")  # config_parse_exec: the token \; is a literal ';'
            i += 2
            continue
        word, quote = [], None
        if value[i] in "'\"":
            quote, i = value[i], i + 1
        while True:
            if i >= n:
                if quote:
                    raise SyntaxProblem("unbalanced quotes")
                break
            c = value[i]
            if c == "\\":
                ch, i = _unescape(value, i + 1)
                word.append(ch)
                continue
            if quote:
                if c == quote:
                    i += 1
                    if i < n and value[i] not in WHITESPACE:
                        raise SyntaxProblem("a closing quote must be followed by whitespace")
                    break
            elif c in WHITESPACE:
                break
            elif c in "'\"":
                raise SyntaxProblem("a quote inside a word")
            word.append(c)
            i += 1
        words.append("".join(word))


def expand_specifiers(text: str, specifiers: dict[str, str]) -> str:
    """'%%' -> '%', '%x' -> specifiers[x]; any other specifier is refused."""
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c != "%":
            out.append(c)
            i += 1
            continue
        if i + 1 >= len(text):
            raise SyntaxProblem("a lone '%' at the end")
        spec = text[i + 1]
        if spec == "%":
            out.append("%")
        elif spec in specifiers:
            out.append(specifiers[spec])
        else:
            raise SyntaxProblem(f"specifier %{spec} is not resolved at render time")
        i += 2
    return "".join(out)


def expand_dollars(word: str, env: dict[str, str] | None = None) -> str:
    """ExecStart's exec-time variable step: '$$' is a literal '$'; '$NAME' and '${NAME}' would
    be replaced by the environment, so any other '$' is refused. With `env` (the unit's exec
    environment, known at render time), a word that is exactly '${NAME}' becomes env[NAME] as
    one word, as systemd.service(5) says ("always resulting in exactly a single argument")."""
    if env is not None and word.startswith("${") and word.endswith("}") and _ENV_NAME.fullmatch(word[2:-1]):
        if word[2:-1] not in env:
            raise SyntaxProblem(f"{word} is not set in the unit's environment (it would be empty)")
        return env[word[2:-1]]
    if word.startswith("$") and _ENV_NAME.fullmatch(word[1:]):
        raise SyntaxProblem(f"{word} is replaced (and split) by the environment")
    out, i = [], 0
    while i < len(word):
        if word[i] == "$":
            if word[i + 1:i + 2] != "$":
                raise SyntaxProblem("a '$' that is not doubled")
            out.append("$")
            i += 2
        else:
            out.append(word[i])
            i += 1
    return "".join(out)


def exec_argv(value: str, specifiers: dict[str, str], env: dict[str, str] | None = None) -> list[str]:
    """The argv an ExecStart= value starts. Both orders systemd has used (specifiers on the
    whole line before un-quoting, and per word after) must agree."""
    if value[:1] in "-@:+!":
        raise SyntaxProblem(f"ExecStart prefix {value[0]!r} changes how the command runs")
    per_word = [expand_dollars(expand_specifiers(w, specifiers), env) for w in split_words(value)]
    whole_line = [expand_dollars(w, env) for w in split_words(expand_specifiers(value, specifiers))]
    if per_word != whole_line:
        raise SyntaxProblem("the command reads differently depending on when specifiers expand")
    if not per_word or not per_word[0].startswith("/"):
        raise SyntaxProblem("the command must start with an absolute path")
    return per_word


def environment_assignments(value: str, specifiers: dict[str, str]) -> list[tuple[str, str]]:
    """The (name, value) pairs of one Environment= line; '$' is not special there."""
    per_word = [expand_specifiers(w, specifiers) for w in split_words(value)]
    whole_line = split_words(expand_specifiers(value, specifiers))
    if per_word != whole_line:
        raise SyntaxProblem("the assignment reads differently depending on when specifiers expand")
    pairs = []
    for word in per_word:
        name, sep, val = word.partition("=")
        if not sep or not _ENV_NAME.fullmatch(name):
            raise SyntaxProblem(f"not a variable assignment (systemd ignores it): {word[:60]!r}")
        pairs.append((name, val))
    return pairs


# --- environment files -------------------------------------------------------------------------

def env_file(text: str) -> dict[str, str]:
    """KEY=VALUE pairs as EnvironmentFile= loads them (env-file.c's state machine): '#'/';'
    comment lines, whitespace around keys and unquoted values dropped, '...' literal,
    "..." with \\" \\\\ \\` \\$ escapes, a backslash outside quotes taking the next character
    literally and a backslash-newline continuing the value. Later assignments win."""
    env: dict[str, str] = {}
    state, key, val = "pre_key", [], []
    last_ws: int | None = None
    key_ws: int | None = None

    def push() -> None:
        k = "".join(key[:key_ws] if key_ws is not None else key)
        if not _ENV_NAME.fullmatch(k):
            raise SyntaxProblem(f"not a variable name: {k[:60]!r}")
        env[k] = "".join(val)

    for c in text:
        if c == "\x00":
            raise SyntaxProblem("a NUL byte")
        if state == "pre_key":
            if c in COMMENTS:
                state = "comment"
            elif c not in WHITESPACE:
                state, key, val, key_ws = "key", [c], [], None
        elif state == "key":
            if c in "\n\r":
                raise SyntaxProblem(f"a line without '=' (systemd drops it): {''.join(key)[:60]!r}")
            if c == "=":
                state, last_ws = "pre_value", None
            else:
                if c not in WHITESPACE:
                    key_ws = None
                elif key_ws is None:
                    key_ws = len(key)
                key.append(c)
        elif state == "pre_value":
            if c in "\n\r":
                push()
                state = "pre_key"
            elif c == "'":
                state = "single"
            elif c == '"':
                state = "double"
            elif c == "\\":
                state = "value_escape"
            elif c not in WHITESPACE:
                state = "value"
                val.append(c)
        elif state == "value":
            if c in "\n\r":
                del val[last_ws if last_ws is not None else len(val):]
                push()
                state = "pre_key"
            elif c == "\\":
                state, last_ws = "value_escape", None
            else:
                if c not in WHITESPACE:
                    last_ws = None
                elif last_ws is None:
                    last_ws = len(val)
                val.append(c)
        elif state == "value_escape":
            state = "value"
            if c not in "\n\r":
                val.append(c)
        elif state == "single":
            if c == "'":
                state = "pre_value"
            else:
                val.append(c)
        elif state == "double":
            if c == '"':
                state = "pre_value"
            elif c == "\\":
                state = "double_escape"
            else:
                val.append(c)
        elif state == "double_escape":
            state = "double"
            if c in SHELL_NEED_ESCAPE:
                val.append(c)
            elif c != "\n":
                val += ["\\", c]
        elif state == "comment":
            if c == "\\":
                state = "comment_escape"
            elif c in "\n\r":
                state = "pre_key"
        elif state == "comment_escape":
            if c in "\n\r":  # systemd < 254 continued the comment onto the next line
                raise SyntaxProblem("a comment line ending in a backslash reads differently across "
                                    "systemd versions")
            state = "comment"
    if state in ("key",):
        raise SyntaxProblem(f"a line without '=' (systemd drops it): {''.join(key)[:60]!r}")
    if state in ("single", "double", "double_escape"):
        raise SyntaxProblem("unbalanced quotes at the end of the file")
    if state in ("pre_value", "value", "value_escape"):
        if state == "value" and last_ws is not None:
            del val[last_ws:]
        push()
    return env


# --- the round trip ----------------------------------------------------------------------------

def check_unit(unit: str, argv: list[str], env: dict[str, str], specifiers: dict[str, str],
               max_line: int, quote=None, exec_env: dict[str, str] | None = None,
               skip_exec: bool = False) -> list[tuple[tuple, str]]:
    """Mismatches between what the unit makes systemd run and what was asked for, each
    (locator, message): ("argv", i), ("env", name) or ("unit", ...). `quote` (the renderer's
    word quoting) only helps name the word an unreadable ExecStart= went wrong at; `exec_env`
    resolves '${NAME}' words (check_instance); `skip_exec` checks all but ExecStart=."""
    found: list[tuple[tuple, str]] = []
    for number, line in enumerate(LINE_BREAKS.split(unit), 1):
        if len(line.encode()) > max_line:
            found.append((("unit", "length"), f"line {number} is {len(line.encode()):,} bytes; the limit is "
                                              f"{max_line:,} (systemd reads at most 1 MiB per line)"))
    if found:  # not worth reading further (and bounded work for any input)
        return found
    try:
        directives = unit_directives(unit)
    except SyntaxProblem as exc:
        return found + [(("unit",), f"the unit does not read back: {exc}")]
    starts = [d for d in directives if d.section == "Service" and d.key == "ExecStart"]
    if len(starts) != 1:
        found.append((("unit",), f"expected one ExecStart= in [Service], found {len(starts)}"))
    for d in starts[:0] if skip_exec else starts[:1]:
        try:
            got = exec_argv(d.value, specifiers, exec_env)
        except SyntaxProblem as exc:
            where = _first_bad_word(argv, quote, specifiers) if quote else len(argv) - 1
            found.append((("argv", where), f"ExecStart= does not read back: {exc}"))
        else:
            found += _argv_mismatch(got, argv)
    got_env: dict[str, str] = {}
    for d in directives:
        if d.section == "Service" and d.key == "Environment":
            try:
                got_env.update(environment_assignments(d.value, specifiers))
            except SyntaxProblem as exc:
                name = d.value.lstrip('"').partition("=")[0]
                found.append((("env", name), f"Environment= line {d.line} does not read back: {exc}"))
                return found
    for name in sorted(set(env) | set(got_env)):
        if env.get(name) != got_env.get(name):
            found.append((("env", name), f"Environment= gives {name}={got_env.get(name)!r}, the profile asked for "
                                         f"{env.get(name)!r}"))
    return found


def check_instance(unit: str, argv: list[str], env: dict[str, str], env_files: dict[str, str],
                   specifiers: dict[str, str], max_line: int, quote=None) -> list[tuple[tuple, str]]:
    """check_unit for one instance of a templated unit whose ExecStart= takes '${NAME}' words
    from its EnvironmentFile=s: `specifiers` are the instance's (%i, %n, %d, ...), `env_files`
    maps the host path of every env file this instance must read to its rendered text. The
    EnvironmentFile= lines must name exactly those files; the exec environment is Environment=
    with the files over it (systemd.exec(5): the files' settings override Environment=)."""
    found = check_unit(unit, argv, env, specifiers, max_line, quote=quote, exec_env=None, skip_exec=True)
    if found:
        return found
    directives = unit_directives(unit)
    named = []
    for d in directives:
        if d.section == "Service" and d.key == "EnvironmentFile":
            try:
                path = expand_specifiers(d.value, specifiers)
            except SyntaxProblem as exc:
                return [(("unit",), f"EnvironmentFile= line {d.line} does not read back: {exc}")]
            if path.startswith("-") or path not in env_files:
                return [(("unit",), f"EnvironmentFile= line {d.line} names {path}, which this release does "
                                    "not render for the instance")]
            named.append(path)
    if sorted(named) != sorted(env_files):
        return [(("unit",), f"the instance reads env files {named}, the release renders {sorted(env_files)}")]
    exec_env = dict(env)
    for path in named:
        try:
            exec_env.update(env_file(env_files[path]))
        except SyntaxProblem as exc:
            return [(("env", None), f"{path} does not read back: {exc}")]
    return check_unit(unit, argv, env, specifiers, max_line, quote=quote, exec_env=exec_env)


IP_KEYWORDS = ("any", "localhost", "link-local", "multicast")


def _ip_entries(value: str) -> list[str]:
    """One IPAddressAllow=/IPAddressDeny= value as systemd reads it: whitespace-separated
    keywords and prefixes (a bare address is its /32 or /128), host bits masked off."""
    out = []
    for word in value.split():
        if word in IP_KEYWORDS:
            out.append(word)
            continue
        try:
            out.append(str(ipaddress.ip_network(word, strict=False)))
        except ValueError:
            raise SyntaxProblem(f"{word!r} is not an address prefix systemd reads") from None
    return out


def ip_access(unit: str) -> tuple[list[str], list[str]]:
    """(allowed, denied) of the unit's [Service] as systemd builds them: each assignment adds
    to its list, an empty one empties it."""
    lists: dict[str, list[str]] = {"IPAddressAllow": [], "IPAddressDeny": []}
    for d in unit_directives(unit):
        if d.section == "Service" and d.key in lists:
            lists[d.key] = lists[d.key] + _ip_entries(d.value) if d.value else []
    return lists["IPAddressAllow"], lists["IPAddressDeny"]


def check_ip_access(unit: str, allow: list[str] | None) -> list[tuple[tuple, str]]:
    """Mismatches between the peers the unit lets through and ALLOW (None: no IP rules at all,
    the sandbox is off): IPAddressDeny= must be exactly `any`, IPAddressAllow= exactly ALLOW."""
    try:
        got_allow, got_deny = ip_access(unit)
        want = sorted(set(_ip_entries(" ".join(allow or []))))
    except SyntaxProblem as exc:
        return [(("ip",), f"IPAddressAllow=/IPAddressDeny= do not read back: {exc}")]
    if allow is None:
        if got_allow or got_deny:
            return [(("ip",), f"the unit has IP rules (allow {got_allow}, deny {got_deny}), the profile none")]
        return []
    found = []
    if sorted(set(got_deny)) != ["any"]:
        found.append((("ip",), f"IPAddressDeny= reads back as {got_deny}, not ['any']: other peers would pass"))
    if sorted(set(got_allow)) != want:
        found.append((("ip",), f"IPAddressAllow= reads back as {sorted(set(got_allow))}, the profile allows {want}"))
    return found


STATE_ROOT = "/var/lib"     # where systemd puts StateDirectory= (system units)


def check_home(unit: str, home: str, names: tuple[str, ...], specifiers: dict[str, str]) -> list[tuple[tuple, str]]:
    """Mismatches between where the unit lets the server keep files and HOME (one folder per
    venv): StateDirectory= must be exactly HOME, WorkingDirectory= HOME, no ReadWritePaths=
    (the account's passwd home and all else stay read-only under ProtectSystem=strict), and
    Environment= must set each of NAMES (HOME, the caches) to HOME or a folder under it."""
    try:
        directives = [d for d in unit_directives(unit) if d.section == "Service"]
        env = dict(kv for d in directives if d.key == "Environment"
                   for kv in environment_assignments(d.value, specifiers))
        state = [w for d in directives if d.key == "StateDirectory" for w in split_words(d.value)]
    except SyntaxProblem as exc:
        return [(("unit",), f"the unit does not read back: {exc}")]
    found = []
    if [f"{STATE_ROOT}/{w}" for w in state] != [home]:
        found.append((("home",), f"StateDirectory= reads back as {state}, not the venv's own home {home}"))
    work = [d.value for d in directives if d.key == "WorkingDirectory"]
    if work != [home]:
        found.append((("home",), f"WorkingDirectory= reads back as {work}, not {home}"))
    writable = [d.value for d in directives if d.key == "ReadWritePaths" and d.value]
    if writable:
        found.append((("home",), f"ReadWritePaths={' '.join(writable)}: the server may write only its home {home}"))
    found += [(("home",), f"Environment= gives {name}={env.get(name)!r}, not the venv's own home {home} or under it")
              for name in names if env.get(name) != home and not (env.get(name) or "").startswith(home + "/")]
    return found


def check_env_file(text: str, env: dict[str, str]) -> list[tuple[tuple, str]]:
    """Mismatches between an EnvironmentFile= as systemd loads it and `env`."""
    try:
        got = env_file(text)
    except SyntaxProblem as exc:
        return [(("env", None), f"the env file does not read back: {exc}")]
    return [(("env", name), f"the env file gives {name}={got.get(name)!r}, the profile asked for {env.get(name)!r}")
            for name in sorted(set(env) | set(got)) if env.get(name) != got.get(name)]


def _argv_mismatch(got: list[str], want: list[str]) -> list[tuple[tuple, str]]:
    for i, (g, w) in enumerate(zip(got, want)):
        if g != w:
            return [(("argv", i), f"ExecStart= word {i} reads back as {g!r}, the profile asked for {w!r}")]
    if len(got) != len(want):
        i = min(len(got), len(want))
        return [(("argv", min(i, len(want) - 1)),
                 f"ExecStart= reads back as {len(got)} words, the profile asked for {len(want)}")]
    return []


def _first_bad_word(argv: list[str], quote, specifiers: dict[str, str]) -> int:
    """Best guess of the argv word an unreadable ExecStart= went wrong at: the first whose own
    quoted form (by the renderer's `quote`) does not read back to itself."""
    for i, word in enumerate(argv):
        try:
            if exec_argv(f"/x {quote(word)}", specifiers) != ["/x", word]:
                return i
        except SyntaxProblem:
            return i
    return len(argv) - 1
