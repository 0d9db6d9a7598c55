"""`dsv4deploy pin PROFILE`: resolve the model repo's commit on the hub and write it into the
profile file in place, one value changed, every comment and byte around it kept.

Where it writes (the least surprising place: only the profile you name changes what it deploys):

- the named profile sets ``model.revision`` itself: that value is replaced;
- it inherits it from a base (``extends:``): a ``revision:`` line is added to the named profile
  (under its ``model:`` block, or a new ``model:`` block before its first section), so the
  other profiles of that base keep theirs; ``--into-base`` replaces the base's value instead
  (every profile inheriting it then deploys the new commit; they are listed).

The commit comes from ``HfApi().model_info(repo, revision=BRANCH)`` at ``HF_ENDPOINT`` (default
https://huggingface.co), with the token the deploy itself uses (``DSV4_HF_TOKEN_FILE`` or
``DSV4_HF_TOKEN``; a token saved by ``hf auth login`` is deliberately not used, so a gated repo
fails here and not halfway through a deploy). The edited profile is validated in a scratch copy
of the profiles folder before the file is replaced (atomically, mode kept); when it would not
be valid nothing is written. Exit codes: 0 pinned or already pinned, 1 the hub could not be
asked (unreachable, server error), 2 bad input (profile, repo, branch, token; file:line: key).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from dsv4deploy.profile.errors import EXIT_BAD_INPUT, EXIT_FAILED, Problem, ProfileError
from dsv4deploy.weights.hftoken import HF_TOKEN_FILE_VAR, HF_TOKEN_VAR, HfTokenError, hf_token_from_env
from dsv4deploy.cli.settings import Settings
from dsv4deploy.profile.load import DEFAULTS_FILE, Profile, display_path, list_profiles, load_profile, load_raw
from dsv4deploy.profile.yamlpos import load_yaml, read_text

DEFAULT_ENDPOINT = "https://huggingface.co"
REVISION = ("model", "revision")
TIMEOUT_S = 20.0


class PinError(Exception):
    """A refusal: the message (one or more lines) and the exit code."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class PinResult:
    file: str           # display path of the file written (or that would be)
    line: int
    old: str
    new: str
    changed: bool
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        if not self.changed:
            return f"{self.file}:{self.line}: model.revision: {self.new} (already pinned)"
        return f"{self.file}:{self.line}: model.revision: {self.old} -> {self.new}"


# ---------------------------------------------------------------------------- the hub's answer
def endpoint_from_env(env=os.environ) -> str:
    return (env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def _bad(message: str, path: str = "", file: str = "<command line>", line: int | None = None) -> PinError:
    return PinError(str(Problem(message, path=path, file=file, line=line)), EXIT_BAD_INPUT)


def resolve_commit(repo: str, branch: str, *, endpoint: str, token: str | None,
                   token_source: str = "", repo_where: tuple[str, int | None] = ("<profile>", None)) -> str:
    """The commit `branch` names in `repo` at `endpoint`; PinError (exit 1 or 2) with a message."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise _bad(f"{endpoint!r} is not an http(s) URL", path="HF_ENDPOINT", file="<environment>")
    try:
        import httpx2
        from huggingface_hub import HfApi
        from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, OfflineModeIsEnabled,
                                            RepositoryNotFoundError, RevisionNotFoundError)
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise PinError(f"huggingface_hub is not installed ({exc}); pip install -e .", EXIT_FAILED) from None

    rfile, rline = repo_where
    need_token = (f"set {HF_TOKEN_FILE_VAR} (a file holding the token) or {HF_TOKEN_VAR}"
                  if not token else f"check the token from {token_source}")
    try:
        info = HfApi(endpoint=endpoint, token=token or False).model_info(repo, revision=branch, timeout=TIMEOUT_S)
    except RevisionNotFoundError:
        raise _bad(f"{repo} has no branch, tag or commit {branch!r} at {endpoint}", path="--branch") from None
    except GatedRepoError:
        raise _bad(f"{repo} at {endpoint} is gated: the hub wants a token with access to it; {need_token}",
                   path="model.repo", file=rfile, line=rline) from None
    except RepositoryNotFoundError as exc:
        status = exc.response.status_code if exc.response is not None else "?"
        raise _bad(f"no repo {repo} at {endpoint} (HTTP {status}; a private repo also answers so without a "
                   f"token with access: {need_token})", path="model.repo", file=rfile, line=rline) from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        said = (exc.response.headers.get("X-Error-Message") if exc.response is not None else None) or ""
        if status in (401, 403):
            who = token_source or "the environment"
            raise _bad(f"{endpoint} refused the HF token from {who} (HTTP {status}{': ' + said if said else ''})"
                       if token else f"{endpoint} wants a token for {repo} (HTTP {status}); {need_token}",
                       path=token_source or "token", file="<environment>") from None
        raise PinError(f"dsv4deploy pin: {endpoint} answered HTTP {status} for {repo}@{branch}"
                       f"{': ' + said if said else ''}; try again later", EXIT_FAILED) from None
    except OfflineModeIsEnabled:
        raise PinError("dsv4deploy pin: HF_HUB_OFFLINE is set: pinning needs the hub; unset it", EXIT_FAILED) from None
    except (httpx2.HTTPError, OSError) as exc:
        raise PinError(f"dsv4deploy pin: cannot reach {endpoint}: {type(exc).__name__}: {exc or 'no answer'}",
                       EXIT_FAILED) from None
    except ValueError as exc:  # e.g. a body that is not the hub's JSON
        raise PinError(f"dsv4deploy pin: {endpoint} does not answer like a Hugging Face hub ({exc})",
                       EXIT_FAILED) from None
    sha = getattr(info, "sha", None)
    if not isinstance(sha, str) or not sha:
        raise PinError(f"dsv4deploy pin: {endpoint} answered no commit sha for {repo}@{branch}", EXIT_FAILED)
    return sha


# ------------------------------------------------------------------------------ the text edit
def _node_for(mapping: yaml.MappingNode, key: str) -> tuple[yaml.Node, yaml.Node] | None:
    for k, v in mapping.value:
        if isinstance(k, yaml.ScalarNode) and k.value == key:
            return k, v
    return None


def _quoted(value: str, style: str | None) -> str:
    return f"'{value}'" if style == "'" else f'"{value}"'


def _newline(text: str) -> str:
    return "\r\n" if "\r\n" in text else "\n"


def _line_start(text: str, line: int) -> int:
    """Character offset of 0-based `line` (len(text) past the end)."""
    pos = 0
    for _ in range(line):
        nxt = text.find("\n", pos)
        if nxt < 0:
            return len(text)
        pos = nxt + 1
    return pos


def _insert_lines(text: str, line: int, lines: list[str]) -> tuple[str, int]:
    """Insert whole lines before 0-based `line`; returns the text and the 1-based line of the first."""
    nl = _newline(text)
    at = _line_start(text, line)
    prefix = nl if at == len(text) and text and not text.endswith("\n") else ""
    new = text[:at] + prefix + "".join(s + nl for s in lines) + text[at:]
    return new, text[:at].count("\n") + (1 if prefix else 0) + 1


def _root(text: str, display: str) -> yaml.MappingNode:
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    if not isinstance(node, yaml.MappingNode):
        raise _bad("expected a mapping at the top level", file=display, line=1)
    return node


def replace_value(text: str, display: str, sha: str) -> tuple[str, int]:
    """`model.revision`'s value replaced (its quote style kept; a plain value becomes "double
    quoted"); returns the new text and the 1-based line of the key."""
    root = _root(text, display)
    model = _node_for(root, "model")
    found = _node_for(model[1], "revision") if model and isinstance(model[1], yaml.MappingNode) else None
    if found is None:
        raise _bad("model.revision is not where the loader said", path="model.revision", file=display)
    key, value = found
    after_key = text[key.end_mark.index:value.start_mark.index] if value.start_mark.index >= key.end_mark.index else ""
    if not isinstance(value, yaml.ScalarNode) or "*" in after_key or value.start_mark.index < key.end_mark.index:
        raise _bad("model.revision is not a plain value here (an alias?): write the commit by hand",
                   path="model.revision", file=display, line=key.start_mark.line + 1)
    start, end = value.start_mark.index, value.end_mark.index
    return text[:start] + _quoted(sha, value.style) + text[end:], key.start_mark.line + 1


def insert_value(text: str, display: str, sha: str) -> tuple[str, int]:
    """A `revision:` line added to the file's own `model:` block, or a new `model:` block."""
    root = _root(text, display)
    if root.flow_style:
        raise _bad("the profile is written as one flow mapping ({...}); add model.revision by hand",
                   file=display, line=root.start_mark.line + 1)
    model = _node_for(root, "model")
    if model is not None:
        key, block = model
        if not isinstance(block, yaml.MappingNode) or block.flow_style or not block.value:
            raise _bad("model is not a block mapping here (flow style {...}?): add `revision:` by hand",
                       path="model", file=display, line=key.start_mark.line + 1)
        first_key = block.value[0][0]
        indent = " " * first_key.start_mark.column
        repo = _node_for(block, "repo")
        if repo is not None:
            end = repo[1].end_mark
            line = end.line if end.column == 0 else end.line + 1
        else:
            line = first_key.start_mark.line
        return _insert_lines(text, line, [f'{indent}revision: "{sha}"'])
    skip = {"extends", "description", "$schema"}
    lines = text.split("\n")
    target = None
    for k, _v in root.value:
        if isinstance(k, yaml.ScalarNode) and k.value not in skip:
            target = k.start_mark.line
            while target > 0 and lines[target - 1].lstrip().startswith("#"):
                target -= 1  # the comment block above a section belongs to it
            break
    if target is None:
        target = len(lines) - 1 if text.endswith("\n") else len(lines)
    text2, first = _insert_lines(text, target, ["model:", f'  revision: "{sha}"'])
    return text2, first + 1


# ----------------------------------------------------------------------------------- pinning
def _inheritors(directory: Path, file: str, exclude: str) -> list[str]:
    out = []
    for name in list_profiles(directory):
        if name == exclude:
            continue
        try:
            _data, origins, _files = load_raw(name, directory)
        except ProfileError:
            continue
        if origins.get(REVISION, (None,))[0] == file:
            out.append(name)
    return out


def _valid_now(profile: Profile) -> None:
    """A profile that is not valid as it stands is refused before the hub is asked."""
    from dsv4deploy.profile.validate import validate

    errors = validate(profile).errors
    if errors:
        raise PinError("\n".join([str(p) for p in errors] + [
            f"dsv4deploy pin: refused: {profile.name} is not valid as it stands; fix it first (nothing written)"]),
            EXIT_BAD_INPUT)


def _validated(name: str, directory: Path, target: Path, candidate: str) -> None:
    """Validate the profile with `candidate` as `target`'s text, in a scratch copy of the folder."""
    from dsv4deploy.profile.validate import validate

    with tempfile.TemporaryDirectory(prefix="dsv4deploy-pin-") as tmp:
        scratch = Path(tmp)
        for p in directory.glob("*.yaml"):
            if p.is_file():
                shutil.copyfile(p, scratch / p.name)
        (scratch / target.name).write_text(candidate, encoding="utf-8", newline="")
        try:
            report = validate(load_profile(name, scratch))
            problems = report.errors
        except ProfileError as exc:
            problems = exc.problems
        if problems:
            shown = display_path(directory)
            lines = [str(Problem(p.message, path=p.path, file=p.file.replace(str(scratch), shown)
                                 .replace(display_path(scratch), shown), line=p.line)) for p in problems]
            raise PinError("\n".join(lines + [f"dsv4deploy pin: refused: with that revision {name} would not be "
                                              f"valid (lines as they would be after the edit); {display_path(target)} "
                                              "is unchanged"]), EXIT_BAD_INPUT)


def _write(target: Path, text: str) -> None:
    """Replace the file atomically, keeping its mode and owner (a symlink's target is written)."""
    target = Path(os.path.realpath(target))
    st = target.stat()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".pin", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, st.st_mode & 0o7777)
        if (st.st_uid, st.st_gid) != (os.getuid(), os.getgid()):
            try:
                os.chown(tmp, st.st_uid, st.st_gid)
            except PermissionError:
                pass
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def pin(name: str, *, branch: str = "main", into_base: bool = False, endpoint: str | None = None,
        env=os.environ, directory: Path | None = None, dry_run: bool = False) -> PinResult:
    """Resolve and write; raises PinError (or ProfileError, exit 2) when it must not."""
    directory = Path(directory or Settings.from_environment(env).profiles)   # the command passes its own
    profile: Profile = load_profile(name, directory)
    _valid_now(profile)
    repo = profile.model["repo"]
    current = profile.model["revision"]
    rev_file, rev_line = profile.origins[REVISION]
    own_file = profile.files[-1]
    inherited = rev_file != own_file
    if into_base and not inherited:
        raise _bad(f"--into-base: {name} sets model.revision itself ({rev_file}:{rev_line}), which overrides "
                   "any base: pin without --into-base, or delete that line to inherit the base's")
    if into_base and rev_file == DEFAULTS_FILE:
        raise _bad("--into-base: model.revision comes from the package defaults, not from a base profile")
    try:
        token = hf_token_from_env(env)
        token_source = (HF_TOKEN_FILE_VAR if env.get(HF_TOKEN_FILE_VAR) else HF_TOKEN_VAR) if token else ""
    except HfTokenError as exc:
        raise _bad(str(exc), path=exc.source, file="<environment>") from None
    endpoint = (endpoint or endpoint_from_env(env)).rstrip("/")
    sha = resolve_commit(repo, branch, endpoint=endpoint, token=token, token_source=token_source,
                         repo_where=profile.where(("model", "repo")))

    if into_base:
        base_name = Path(rev_file).stem
        base_data, _o, _f = load_raw(base_name, directory)
        base_repo = base_data.get("model", {}).get("repo")
        if base_repo != repo:
            raise _bad(f"--into-base: {rev_file} pins {base_repo or 'no repo'}, but {name} deploys {repo}: "
                       "its commit does not belong in the base")
        target, display = directory / f"{base_name}.yaml", rev_file
    else:
        target, display = directory / f"{name}.yaml", own_file

    if current == sha:
        where_file, where_line = (rev_file, rev_line)
        result = PinResult(where_file, where_line, current, sha, changed=False)
        if inherited and not into_base:
            result.notes.append(f"inherited from {rev_file}; {display} unchanged")
        return result

    text = read_text(target, display)
    if inherited and not into_base:
        new_text, line = insert_value(text, display, sha)
    else:
        new_text, line = replace_value(text, display, sha)

    # The edit changes model.revision and nothing else the loader sees.
    before, _ = load_yaml(target, display)
    scratch = Path(tempfile.mkdtemp(prefix="dsv4deploy-pin-check-"))
    try:
        (scratch / target.name).write_text(new_text, encoding="utf-8", newline="")
        try:
            after, after_origins = load_yaml(scratch / target.name, display)
        except ProfileError as exc:
            raise PinError(f"{exc}\ndsv4deploy pin: refused: the edit would not parse; {display} is unchanged",
                           EXIT_BAD_INPUT) from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    expected = dict(before)
    expected["model"] = {**(before.get("model") or {}), "revision": sha}
    if after != expected or after_origins.get(REVISION, (None, None))[1] != line:
        raise PinError(f"{display}: dsv4deploy pin: refused: an in-place edit would change more than "
                       f"model.revision here (anchors, aliases or unusual layout); write {sha} by hand",
                       EXIT_BAD_INPUT)
    _validated(name, directory, target, new_text)

    result = PinResult(display, line, current, sha, changed=True)
    if inherited and not into_base:
        others = _inheritors(directory, rev_file, name)
        result.notes.append(f"{name} inherited model.revision from {rev_file}:{rev_line}; the new line is in "
                            f"{display}" + (f"; still inheriting the old one: {', '.join(others)} "
                                            "(pin the base for all with --into-base)" if others else ""))
    if into_base:
        others = _inheritors(directory, rev_file, name)
        if others:
            result.notes.append(f"also deploys the new commit (inherit it from {rev_file}): {', '.join(others)}")
    if not dry_run:
        _write(target, new_text)
    else:
        result.notes.append("dry run: nothing written")
    return result
