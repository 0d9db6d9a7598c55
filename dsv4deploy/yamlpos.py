"""YAML loading that remembers where every key came from.

Error messages must name the file and line of the offending key, so the loader returns,
next to the plain data, a map from key path (a tuple) to (file, line).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from .errors import Problem, ProfileError

Path_ = tuple  # key path: ("server", "tp_size") or ("gate", "levels", 0)
Origins = dict  # Path_ -> (file, line)


def load_yaml(path: Path, display: str | None = None) -> tuple[dict, Origins]:
    """Parse one YAML mapping; raise ProfileError (with line) when it is not well formed."""
    name = display or str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError([Problem(f"cannot read: {exc.strerror}", file=name)]) from None
    except UnicodeDecodeError:
        raise ProfileError([Problem("not UTF-8 text", file=name)]) from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise ProfileError([Problem("empty file: expected a mapping of profile keys", file=name, line=1)])
        origins: Origins = {}
        data = _build(loader, node, (), name, origins)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        what = exc.problem or exc.context or "syntax error"
        raise ProfileError([Problem(f"malformed YAML: {what}", file=name, line=line)]) from None
    except yaml.YAMLError as exc:  # pragma: no cover - every pyyaml error above is marked
        raise ProfileError([Problem(f"malformed YAML: {exc}", file=name)]) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise ProfileError([Problem("expected a mapping of profile keys at the top level",
                                    file=name, line=node.start_mark.line + 1)])
    return data, origins


def _build(loader: yaml.SafeLoader, node: yaml.Node, path: Path_, name: str, origins: Origins):
    origins.setdefault(path, (name, node.start_mark.line + 1))
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise ProfileError([Problem("keys must be plain strings", file=name,
                                            line=key_node.start_mark.line + 1)])
            key = loader.construct_object(key_node)
            if not isinstance(key, str):
                key = str(key)
            if key == "<<":
                raise ProfileError([Problem("YAML merge keys (<<) are not supported; use extends:",
                                            file=name, line=key_node.start_mark.line + 1)])
            sub = path + (key,)
            if key in out:
                raise ProfileError([Problem("duplicate key", path=".".join(map(str, sub)), file=name,
                                            line=key_node.start_mark.line + 1)])
            origins[sub] = (name, key_node.start_mark.line + 1)
            out[key] = _build(loader, value_node, sub, name, origins)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_build(loader, item, path + (i,), name, origins) for i, item in enumerate(node.value)]
    return loader.construct_object(node)


def format_path(path: Path_) -> str:
    """("gate", "levels", 0, "concurrency") -> "gate.levels[0].concurrency"."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out
