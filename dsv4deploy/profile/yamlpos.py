"""YAML loading that remembers where every key came from, bounded against hostile files.

Error messages must name the file and line of the offending key, so the loader returns,
next to the plain data, a map from key path (a tuple) to (file, line).

A profile is small; anything that is not refuses early with file:line (never a traceback,
never minutes of CPU or gigabytes of memory): files over MAX_FILE_BYTES are not parsed,
nesting deeper than MAX_DEPTH is refused while composing (before Python's recursion limit),
and aliases are expanded under a budget of MAX_NODES values and MAX_TEXT characters (an
alias bomb stops after a few thousand steps; a self-referencing alias is named as such).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from dsv4deploy.profile.errors import Problem, ProfileError

Path_ = tuple  # key path: ("server", "tp_size") or ("gate", "levels", 0)
Origins = dict  # Path_ -> (file, line)

MAX_FILE_BYTES = 256 * 1024
MAX_DEPTH = 50
MAX_NODES = 10_000
MAX_TEXT = 1024 * 1024  # characters of all strings once aliases are expanded


def _refuse(message: str, name: str, line: int | None, path: Path_ = ()) -> ProfileError:
    return ProfileError([Problem(message, path=format_path(path), file=name, line=line)])


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose composer counts nodes and depth, and knows the key path it is in."""

    def __init__(self, text: str, name: str):
        super().__init__(text)
        self.display = name
        self.depth = 0
        self.composed = 0
        self.path: list = []

    def compose_node(self, parent, index):
        self.depth += 1
        self.composed += 1
        pushed = False
        if isinstance(index, int):
            self.path.append(index)
            pushed = True
        elif isinstance(index, yaml.ScalarNode):
            self.path.append(str(index.value))
            pushed = True
        try:
            if self.depth > MAX_DEPTH or self.composed > MAX_NODES:
                line = self.peek_event().start_mark.line + 1
                what = (f"nested deeper than {MAX_DEPTH} levels" if self.depth > MAX_DEPTH
                        else f"more than {MAX_NODES:,} values")
                raise _refuse(f"refused: {what} (a profile needs a few dozen)", self.display, line,
                              tuple(self.path))
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1
            if pushed:
                self.path.pop()


def read_text(path: Path, name: str) -> str:
    """The file as text: at most MAX_FILE_BYTES, UTF-8, or a ProfileError with the line."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ProfileError([Problem(f"cannot read: {exc.strerror}", file=name)]) from None
    if len(raw) > MAX_FILE_BYTES:
        line = raw.count(b"\n", 0, MAX_FILE_BYTES) + 1
        raise _refuse(f"file larger than {MAX_FILE_BYTES // 1024} KiB: not parsed (a profile needs a "
                      "few KiB; the limit is crossed on this line)", name, line)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise _refuse(f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset {exc.start}", name, line) from None


def load_yaml(path: Path, display: str | None = None) -> tuple[dict, Origins]:
    """Parse one YAML mapping; raise ProfileError (with line) when it is not well formed."""
    name = display or str(path)
    text = read_text(path, name)
    loader = None
    try:
        loader = _BoundedLoader(text, name)
        node = loader.get_single_node()
        if node is None:
            raise ProfileError([Problem("empty file: expected a mapping of profile keys", file=name, line=1)])
        origins: Origins = {}
        data = _Builder(loader, name, origins).build(node, ())
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        what = f"U+{exc.character:04X}" if isinstance(exc.character, int) else repr(exc.character)
        raise _refuse(f"malformed YAML: special character {what} is not allowed", name, line) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        what = exc.problem or exc.context or "syntax error"
        raise _refuse(f"malformed YAML: {what}", name, line) from None
    except yaml.YAMLError as exc:  # pragma: no cover - every other pyyaml error is marked
        raise _refuse(f"malformed YAML: {exc}", name, None) from None
    finally:
        if loader is not None:
            loader.dispose()
    if not isinstance(data, dict):
        raise ProfileError([Problem("expected a mapping of profile keys at the top level",
                                    file=name, line=node.start_mark.line + 1)])
    return data, origins


class _Builder:
    """Plain data from the composed nodes, expanding aliases under a budget."""

    def __init__(self, loader: yaml.SafeLoader, name: str, origins: Origins):
        self.loader, self.name, self.origins = loader, name, origins
        self.visits = 0
        self.text = 0
        self.open: set[int] = set()  # ids of the collection nodes being built (cycle check)

    def refuse(self, message: str, node: yaml.Node, path: Path_) -> ProfileError:
        return _refuse(message, self.name, node.start_mark.line + 1, path)

    def build(self, node: yaml.Node, path: Path_):
        self.visits += 1
        if self.visits > MAX_NODES:
            raise self.refuse(f"refused: aliases expand to more than {MAX_NODES:,} values "
                              "(an alias bomb?)", node, path)
        if len(path) > MAX_DEPTH:
            raise self.refuse(f"refused: aliases nest deeper than {MAX_DEPTH} levels", node, path)
        self.origins.setdefault(path, (self.name, node.start_mark.line + 1))
        if isinstance(node, yaml.ScalarNode):
            return self._scalar(node, path)
        if id(node) in self.open:
            raise self.refuse("refused: self-referencing alias (an alias inside the value "
                              "its anchor names)", node, path)
        if node.tag not in ("tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"):
            raise self.refuse(f"YAML tag {node.tag} is not supported here", node, path)
        self.open.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return [self.build(item, path + (i,)) for i, item in enumerate(node.value)]
            return self._mapping(node, path)
        finally:
            self.open.discard(id(node))

    def _mapping(self, node: yaml.MappingNode, path: Path_) -> dict:
        out: dict = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise self.refuse("keys must be plain strings", key_node, path)
            if key_node.tag == "tag:yaml.org,2002:merge" or key_node.value == "<<":
                raise self.refuse("YAML merge keys (<<) are not supported; use extends:", key_node, path)
            key = self._scalar(key_node, path)
            if not isinstance(key, str):
                key = str(key)
            if key == "<<":
                raise self.refuse("YAML merge keys (<<) are not supported; use extends:", key_node, path)
            sub = path + (key,)
            if key in out:
                raise self.refuse("duplicate key", key_node, sub)
            self.origins[sub] = (self.name, key_node.start_mark.line + 1)
            out[key] = self.build(value_node, sub)
        return out

    def _scalar(self, node: yaml.ScalarNode, path: Path_):
        try:
            value = self.loader.construct_object(node)
        except (ValueError, OverflowError, TypeError) as exc:  # e.g. an integer of 5,000 digits
            raise self.refuse(f"cannot read this value: {_first_line(exc)}", node, path) from None
        if isinstance(value, str):
            self.text += len(value)
            if self.text > MAX_TEXT:
                raise self.refuse(f"refused: more than {MAX_TEXT:,} characters of text once aliases are "
                                  "expanded", node, path)
        return value


def _first_line(exc: Exception) -> str:
    text = str(exc).split(";")[0].splitlines()
    return text[0][:120] if text else type(exc).__name__


_SIMPLE_KEY = re.compile(r"[A-Za-z0-9_$][A-Za-z0-9_$-]*")


def format_path(path: Path_) -> str:
    """("gate", "levels", 0, "concurrency") -> "gate.levels[0].concurrency"; a key that is not a
    plain word is shown quoted and escaped: server.env["A\\nB"]."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _SIMPLE_KEY.fullmatch(part):
            out += ("." if out else "") + part
        else:
            out += "[" + json.dumps(part[:60] + ("..." if len(part) > 60 else "")) + "]"
    return out if len(out) <= 120 else out[:50] + "..." + out[-60:]
