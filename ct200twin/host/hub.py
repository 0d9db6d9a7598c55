"""A local Hugging Face Hub for the twin: the HTTP API as huggingface_hub (1.33, the real host's
lock; 2.4 on the control node) uses it to pin a revision and to download a checkpoint, serving
folders of this machine.

``python -m ct200twin hub --port P --root DIR [--token-file F]`` or, in tests,
``with serve_hub(root) as hub: ... hub.url ...``.  Every folder ``org--name`` below the root
(the layout of ``.sim/checkpoints``, see :mod:`.checkpoint`) is the model repo ``org/name`` at
one commit: a 40-hex sha1 of its files' paths and sha256s, so the same content always has the
same commit.  The branch ``main`` names that commit.  ``*.safetensors`` are LFS files (their
ETag is the sha256, as on the real hub); files and folders starting with ``.`` are not served.

Endpoints (what the client calls, checked against huggingface_hub 1.33.0's and 2.4.0's source):

``GET  /api/models/{repo}[/revision/{rev}][?blobs=true]``  model_info / repo_info: ``sha``,
      ``siblings`` (with ``blobs``: ``size``, ``blobId``, ``lfs {sha256, size, pointerSize}``)
``GET  /api/models/{repo}/tree/{rev}[/{path}][?recursive=true]``  list_repo_tree (snapshot_download,
      ``hf download`` of a whole repo, ``hf cache verify``): one page, no ``Link`` header
``POST /api/models/{repo}/paths-info/{rev}``  get_paths_info (form field ``paths``, repeated)
``GET  /api/models/{repo}/refs``  list_repo_refs
``GET  /api/agent-harnesses``  an empty registry: 2.4's client fetches it from HF_ENDPOINT once a day
      (cached under HF_HOME) to tag its user agent; public, like on the real hub
``HEAD|GET /{repo}/resolve/{rev}/{path}``  get_hf_file_metadata and http_get: ``X-Repo-Commit``,
      ``ETag``; a small file is answered there (``Content-Length``, ``Accept-Ranges: bytes``);
      an LFS file (``*.safetensors``) is a **302** to ``http://CDN_HOST:PORT/_cdn/...``: this same
      server under another host name (``localhost`` by default), as the real hub redirects to its CDN, the 302 carrying ``X-Linked-Etag`` (the sha256) and
      ``X-Linked-Size`` (the client reads its metadata from the 302, not following it)
``HEAD|GET /_cdn/{repo}/{commit}/{path}?sig=...``  the "CDN": a signed URL (HMAC of the path with
      the hub's own key, so no token is needed, as on the real CDN), ``ETag`` the sha256;
      ``Range: bytes=N-`` (or ``N-M``, ``-N``) answers 206 with ``Content-Range``: how a cut
      download resumes. A bad signature is 403.

No Xet: the real hub serves its LFS files through Xet too (``X-Xet-Hash`` on the 302), which
``hf download`` with hf-xet prefers; this hub sends no Xet headers, so every client here takes the
plain HTTP route and says so (:data:`NO_XET`).

Errors carry the headers the client maps to its exceptions: ``X-Error-Code: RepoNotFound``
(404), ``RevisionNotFound`` (404), ``EntryNotFound`` (404, with ``X-Repo-Commit``). Started with a
token, every request needs ``Authorization: Bearer <token>``: none is 401 ``GatedRepo``
(GatedRepoError), a wrong one 401 "Invalid credentials in Authorization header" (HfHubHTTPError
with status 401), as the real hub answers.

Faults for tests (:class:`HubFaults`; also ``PUT /_sim/faults`` with JSON, ``GET /_sim/faults``):
``cut``     {path: N}: a GET whose body reaches file offset N stops there and the connection is
            closed (the client sees fewer bytes than Content-Length); ``cut_times`` (1) GETs
            per file are cut, later ones are served whole.
``corrupt`` {path: offset}: every GET serves that byte inverted (metadata stays right).
``stall``   {path: N}: the first GET reaching file offset N sends nothing more and holds the
            connection for up to 30 s (a hung transfer: a test kills the client meanwhile).
``fail``    {path: N}: the next N GETs of the file answer 500.
``rate``    bytes per second per response (0: unlimited), so a test can kill a client mid-way.
``GET /_sim/requests`` lists the requests answered (method, path, range, status, bytes sent, cut, client,
User-Agent, start and end time), appended once the answer is written (a client gone by then never read it);
``DELETE /_sim/requests`` clears the list.  ``/_sim/*`` needs no token.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import select
import socket
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator
from urllib.parse import parse_qs, quote, unquote, urlsplit

from ct200twin.host.hub_repo import CHUNK, LFS_SUFFIXES, HubFile, HubRepo, repo_id_of, scan_repo, visible

MAX_LOG = 10_000
NO_XET = ("sim hub: serves LFS files over plain HTTP only (302 to its /_cdn/, Range resume); no Xet: "
          "the real hub's Xet route (hf download with hf-xet, the real host's default) is not exercised here")


# ------------------------------------------------------------------------------------ faults
@dataclass
class HubFaults:
    cut: dict[str, int] = field(default_factory=dict)
    cut_times: int = 1
    corrupt: dict[str, int] = field(default_factory=dict)
    stall: dict[str, int] = field(default_factory=dict)
    fail: dict[str, int] = field(default_factory=dict)
    rate: float = 0.0

    @classmethod
    def from_dict(cls, doc: dict) -> "HubFaults":
        if not isinstance(doc, dict):
            raise ValueError("faults: expected a JSON object")
        unknown = set(doc) - {f for f in cls.__dataclass_fields__}
        if unknown:
            raise ValueError(f"faults: unknown keys {sorted(unknown)}; known: {sorted(cls.__dataclass_fields__)}")
        out = cls(**doc)
        for name in ("cut", "corrupt", "stall", "fail"):
            value = getattr(out, name)
            if not isinstance(value, dict) or not all(
                    isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
                    for k, v in value.items()):
                raise ValueError(f"faults: {name} must map file paths to integers >= 0")
        if not isinstance(out.cut_times, int) or out.cut_times < 0:
            raise ValueError("faults: cut_times must be an integer >= 0")
        if not isinstance(out.rate, (int, float)) or out.rate < 0:
            raise ValueError("faults: rate must be a number >= 0")
        return out


# ------------------------------------------------------------------------------------ server
_RESOLVE_PREFIX = ("api", "models", "datasets", "spaces", "_sim", "_cdn")
_RANGE_RE = re.compile(r"bytes=(\d*)-(\d*)")


class _Response(Exception):
    """An HTTP error answer: status, X-Error-Code, message, extra headers."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}


class Hub:
    """The hub's state: repos (rescanned when their files change), token, faults, request log."""

    def __init__(self, root: Path, token: str | None = None, faults: HubFaults | None = None,
                 lfs_suffixes=LFS_SUFFIXES, cdn_host: str = "localhost"):
        self.root = Path(root)
        # The "CDN" is this same server under another host name: huggingface_hub follows a redirect
        # to the same host name (and would read the metadata from the CDN's answer), not to another.
        self.cdn_host = cdn_host
        self.token = token
        self.faults = faults or HubFaults()
        self.lfs_suffixes = tuple(lfs_suffixes)
        self.requests: deque[dict] = deque(maxlen=MAX_LOG)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._inflight = 0
        self._hash_cache: dict = {}
        self._repos: dict[str, HubRepo] = {}
        self._signature: dict[str, tuple] = {}
        self._cuts_done: dict[str, int] = {}
        self._stalls_done: set[str] = set()
        self.stopping = threading.Event()
        self.server: ThreadingHTTPServer | None = None
        self._cdn_key = os.urandom(16)

    def cdn_signature(self, path: str) -> str:
        """The signature of a /_cdn/ path: only the 302 hands it out, as the real hub's signed URLs."""
        return hmac.new(self._cdn_key, path.encode(), hashlib.sha256).hexdigest()[:32]

    # -- repos
    def _folder_signature(self, folder: Path) -> tuple:
        out = []
        for p in sorted(folder.rglob("*")):
            if visible(p.relative_to(folder)) and p.is_file():
                st = p.stat()
                out.append((str(p), st.st_size, st.st_mtime_ns, st.st_ino))
        return tuple(out)

    def repos(self) -> dict[str, HubRepo]:
        """repo id -> HubRepo, rescanning a folder only when a file's size, mtime or inode changed."""
        with self._lock:
            found = {}
            if self.root.is_dir():
                for folder in sorted(self.root.iterdir()):
                    repo_id = repo_id_of(folder.name)
                    if repo_id and folder.is_dir():
                        found[repo_id] = folder
            for repo_id in list(self._repos):
                if repo_id not in found:
                    del self._repos[repo_id]
            for repo_id, folder in found.items():
                sig = self._folder_signature(folder)
                if repo_id not in self._repos or self._signature.get(repo_id) != sig:
                    self._repos[repo_id] = scan_repo(repo_id, folder, self.lfs_suffixes, self._hash_cache)
                    self._signature[repo_id] = sig
            return dict(self._repos)

    def repo(self, repo_id: str) -> HubRepo:
        found = self.repos().get(repo_id)
        if found is None:
            raise _Response(404, "Repository not found", "RepoNotFound")
        return found

    def commit_of(self, repo_id: str, revision: str) -> tuple[HubRepo, str]:
        repo = self.repo(repo_id)
        commit = repo.resolve(revision)
        if commit is None:
            raise _Response(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return repo, commit

    # -- faults (thread-safe counters)
    def set_faults(self, faults: HubFaults) -> None:
        with self._lock:
            self.faults = faults
            self._cuts_done = {}
            self._stalls_done = set()

    def _take_cut(self, path: str, start: int, end: int) -> int | None:
        """The offset where this response [start, end) is cut, if a cut is due and falls inside it."""
        with self._lock:
            at = self.faults.cut.get(path)
            if at is None or not start <= at < end or self._cuts_done.get(path, 0) >= self.faults.cut_times:
                return None
            self._cuts_done[path] = self._cuts_done.get(path, 0) + 1
            return at

    def _take_stall(self, path: str, start: int, end: int) -> int | None:
        with self._lock:
            at = self.faults.stall.get(path)
            if at is None or not start <= at < end or path in self._stalls_done:
                return None
            self._stalls_done.add(path)
            return at

    def _take_fail(self, path: str) -> bool:
        with self._lock:
            left = self.faults.fail.get(path, 0)
            if left <= 0:
                return False
            self.faults.fail[path] = left - 1
            return True

    def log(self, record: dict) -> None:
        with self._lock:
            self.requests.append(record)

    def request_log(self, settle: float = 5.0) -> list[dict]:
        """The requests answered so far, once no answer is in flight (waiting up to `settle` s):
        a record is appended when its answer ends, which a client may not wait for."""
        with self._idle:
            self._idle.wait_for(lambda: self._inflight == 0, timeout=settle)
            return list(self.requests)

    def _begin(self) -> None:
        with self._lock:
            self._inflight += 1

    def _end(self) -> None:
        with self._idle:
            self._inflight -= 1
            self._idle.notify_all()

    def clear_log(self) -> None:
        with self._lock:
            self.requests.clear()

    # -- serving
    def start(self, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
        handler = type("BoundHubHandler", (_Handler,), {"hub": self})
        self.server = _Server((host, port), handler)
        return self.server

    @property
    def url(self) -> str:
        assert self.server is not None, "not started"
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64


def _siblings(repo: HubRepo, blobs: bool) -> list[dict]:
    out = []
    for f in sorted(repo.files.values(), key=lambda f: f.path):
        item: dict = {"rfilename": f.path}
        if blobs:
            item.update(size=f.size, blobId=f.blob_id)
            if f.lfs:
                item["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": f.pointer_size}
        out.append(item)
    return out


def _tree_entry(f: HubFile) -> dict:
    entry: dict = {"type": "file", "oid": f.blob_id, "size": f.size, "path": f.path}
    if f.lfs:
        entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": f.pointer_size}
    return entry


def _tree(repo: HubRepo, prefix: str, recursive: bool) -> list[dict]:
    """Entries below `prefix` ("" = root), folders before files as the hub lists them."""
    base = prefix.strip("/")
    under = [f for f in repo.files.values() if not base or f.path.startswith(base + "/")]
    if base and not under:
        raise _Response(404, f"Path {base} not found", "EntryNotFound", {"X-Repo-Commit": repo.commit})
    folders, files = set(), []
    for f in under:
        rest = f.path[len(base) + 1:] if base else f.path
        parts = rest.split("/")
        for depth in range(1, len(parts)):
            if depth > 1 and not recursive:
                break
            folders.add("/".join(([base] if base else []) + parts[:depth]))
        if recursive or len(parts) == 1:
            files.append(f)
    out = [{"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d}
           for d in sorted(folders)]
    return out + [_tree_entry(f) for f in sorted(files, key=lambda f: f.path)]


class _Handler(BaseHTTPRequestHandler):
    hub: Hub
    protocol_version = "HTTP/1.1"
    server_version = "dsv4deploy-sim-hub/1"

    def log_message(self, format, *args):  # noqa: A002 - the request log replaces stderr lines
        return

    # -- plumbing
    def _record(self, status: int, sent: int = 0, cut: bool = False) -> None:
        self.hub.log({"method": self.command, "path": urlsplit(self.path).path, "range": self.headers.get("Range"),
                      "status": status, "sent": sent, "cut": cut, "auth": "Authorization" in self.headers,
                      "agent": self.headers.get("User-Agent"), "client": self.client_address[0],
                      "start": getattr(self, "_started", None), "time": time.time()})

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None,
              content_type: str = "application/json; charset=utf-8") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)
        self._record(status, len(body) if self.command != "HEAD" else 0)

    def _json(self, doc, status: int = 200, headers: dict | None = None) -> None:
        self._send(status, (json.dumps(doc, indent=None) + "\n").encode(), headers)

    def _error(self, err: _Response) -> None:
        headers = {"X-Error-Message": err.message, **err.headers}
        if err.code:
            headers["X-Error-Code"] = err.code
        self._json({"error": err.message}, err.status, headers)

    def _check_token(self, repo_id: str | None) -> None:
        token = self.hub.token
        if not token:
            return
        given = self.headers.get("Authorization", "")
        if not given.lower().startswith("bearer ") or not given[7:].strip():
            what = f"model {repo_id}" if repo_id else "this resource"
            raise _Response(401, f"Access to {what} is restricted. You must have access to it and be "
                                 "authenticated to access it. Please log in.", "GatedRepo")
        if not hmac.compare_digest(given[7:].strip().encode(), token.encode()):
            raise _Response(401, "Invalid credentials in Authorization header")

    def _dispatch(self) -> None:
        self._started = time.time()
        self.hub._begin()
        try:
            self._answer()
        finally:
            self.hub._end()

    def _answer(self) -> None:
        try:
            split = urlsplit(self.path)
            raw = [s for s in split.path.split("/")]
            parts = [unquote(s) for s in raw[1:]]
            query = parse_qs(split.query)
            if parts[:1] == ["_sim"]:
                return self._sim(parts[1:])
            if parts[:1] == ["_cdn"] and len(parts) >= 5:
                return self._cdn(split.path, parts[1:], query)
            if parts == ["api", "agent-harnesses"]:  # fetched once a day by every client, without a token
                return self._json({"standardEnvVars": [], "harnesses": {}})
            if parts[:2] == ["api", "models"] and len(parts) >= 4:
                repo_id = f"{parts[2]}/{parts[3]}"
                self._check_token(repo_id)
                return self._api(repo_id, parts[4:], query)
            if len(parts) >= 5 and parts[0] not in _RESOLVE_PREFIX and parts[2] == "resolve":
                repo_id = f"{parts[0]}/{parts[1]}"
                self._check_token(repo_id)
                return self._resolve(repo_id, parts[3], "/".join(parts[4:]))
            self._check_token(None)
            raise _Response(404, "Not found (the sim hub serves model repos only)")
        except _Response as err:
            self._error(err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _dispatch

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length > 1 << 20:
            raise _Response(413, "request body too large")
        return self.rfile.read(length) if length else b""

    # -- /_sim control
    def _sim(self, parts: list[str]) -> None:
        if parts == ["faults"] and self.command == "PUT":
            try:
                faults = HubFaults.from_dict(json.loads(self._body() or b"{}"))
            except (ValueError, TypeError) as exc:
                raise _Response(400, str(exc)) from None
            self.hub.set_faults(faults)
            return self._json(asdict(faults))
        if parts == ["faults"] and self.command == "GET":
            return self._json(asdict(self.hub.faults))
        if parts == ["requests"] and self.command == "GET":
            return self._json(self.hub.request_log())
        if parts == ["requests"] and self.command == "DELETE":
            self.hub.clear_log()
            return self._json([])
        if parts == ["repos"] and self.command == "GET":
            return self._json({r.repo_id: r.commit for r in self.hub.repos().values()})
        raise _Response(404, "unknown /_sim endpoint")

    # -- /api/models/{repo}/...
    def _api(self, repo_id: str, rest: list[str], query: dict) -> None:
        flag = lambda name: (query.get(name) or [""])[-1].lower() in ("1", "true")  # noqa: E731
        if self.command not in ("GET", "HEAD", "POST"):
            raise _Response(405, "method not allowed")
        if not rest or rest[0] == "revision":
            revision = rest[1] if len(rest) >= 2 else "main"
            if len(rest) > 2:  # a branch with "/" sent unencoded: refs/heads/main
                revision = "/".join(rest[1:])
            repo, commit = self.hub.commit_of(repo_id, revision)
            return self._json({
                "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24], "id": repo_id, "modelId": repo_id,
                "author": repo_id.split("/")[0], "sha": commit, "lastModified": repo.last_modified,
                "createdAt": repo.last_modified, "private": False,
                "gated": "manual" if self.hub.token else False, "disabled": False,
                "downloads": 0, "likes": 0, "tags": ["safetensors", "dsv4deploy-sim"],
                "library_name": "transformers", "siblings": _siblings(repo, flag("blobs")),
                "usedStorage": sum(f.size for f in repo.files.values())})
        if rest[0] == "tree" and len(rest) >= 2:
            repo, _commit = self.hub.commit_of(repo_id, rest[1])
            return self._json(_tree(repo, "/".join(rest[2:]), flag("recursive")))
        if rest[0] == "paths-info" and len(rest) >= 2 and self.command == "POST":
            repo, _commit = self.hub.commit_of(repo_id, rest[1])
            form = parse_qs(self._body().decode("utf-8", "replace"))
            paths = form.get("paths", [])
            out = []
            for p in paths:
                p = p.strip("/")
                if p in repo.files:
                    out.append(_tree_entry(repo.files[p]))
                elif any(f.startswith(p + "/") for f in repo.files):
                    out.append({"type": "directory", "oid": hashlib.sha1(p.encode()).hexdigest(), "size": 0,
                                "path": p})
            return self._json(out)
        if rest == ["refs"]:
            repo = self.hub.repo(repo_id)
            return self._json({"branches": [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": c}
                                            for b, c in repo.branches().items()], "tags": [], "converts": []})
        raise _Response(404, "Not found")

    # -- /{repo}/resolve/{rev}/{path}
    def _resolve(self, repo_id: str, revision: str, path: str) -> None:
        if self.command not in ("GET", "HEAD"):
            raise _Response(405, "method not allowed")
        repo, commit = self.hub.commit_of(repo_id, revision)
        f = repo.files.get(path)
        if f is None:
            raise _Response(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": commit})
        if f.lfs:   # the real hub: a 302 to its CDN carrying the LFS metadata
            cdn = "/_cdn/" + "/".join(quote(p, safe="") for p in (*repo_id.split("/"), commit, *f.path.split("/")))
            port = self.server.server_address[1]
            return self._send(302, b"", {
                "X-Repo-Commit": commit, "ETag": f'"{f.blob_id}"', "X-Linked-Etag": f'"{f.sha256}"',
                "X-Linked-Size": str(f.size), "Location": f"http://{self.hub.cdn_host}:{port}{cdn}?sig={self.hub.cdn_signature(cdn)}"},
                content_type="text/plain; charset=utf-8")
        headers = {"X-Repo-Commit": commit, "ETag": f'"{f.etag}"', "Accept-Ranges": "bytes",
                   "Content-Disposition": f'inline; filename="{Path(f.path).name}"'}
        self._serve(repo, f, headers)

    # -- /_cdn/{org}/{name}/{commit}/{path}?sig=...
    def _cdn(self, raw_path: str, parts: list[str], query: dict) -> None:
        if self.command not in ("GET", "HEAD"):
            raise _Response(405, "method not allowed")
        given = (query.get("sig") or [""])[-1]
        if not hmac.compare_digest(given.encode(), self.hub.cdn_signature(raw_path).encode()):
            raise _Response(403, "Forbidden: bad or missing signature (a /_cdn/ URL comes from a 302)")
        repo_id, commit, path = f"{parts[0]}/{parts[1]}", parts[2], "/".join(parts[3:])
        repo, _commit = self.hub.commit_of(repo_id, commit)
        f = repo.files.get(path)
        if f is None or not f.lfs:
            raise _Response(404, "Not found")
        self._serve(repo, f, {"ETag": f'"{f.sha256}"', "Accept-Ranges": "bytes",
                              "Content-Disposition": f'inline; filename="{Path(f.path).name}"'})

    def _serve(self, repo: HubRepo, f: HubFile, headers: dict) -> None:
        """A file's bytes (HEAD: its headers), whole or the Range asked, with the faults applied."""
        if self.command == "GET" and self.hub._take_fail(f.path):
            raise _Response(500, "Internal Error (sim hub fault: fail)")
        start, end = 0, f.size  # [start, end)
        status = 200
        wanted = self.headers.get("Range")
        if wanted:
            start, end = self._range(wanted, f.size)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{f.size}"
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command == "HEAD":
            return self._record(status)
        self._stream(repo.folder / f.path, f.path, start, end, status)

    @staticmethod
    def _range(value: str, size: int) -> tuple[int, int]:
        m = _RANGE_RE.fullmatch(value.strip())
        unsatisfiable = _Response(416, f"Range Not Satisfiable: {value}", None, {"Content-Range": f"bytes */{size}"})
        if not m or (not m.group(1) and not m.group(2)):
            raise unsatisfiable
        if not m.group(1):  # suffix: the last N bytes
            n = int(m.group(2))
            if n == 0:
                raise unsatisfiable
            return max(size - n, 0), size
        start = int(m.group(1))
        end = min(int(m.group(2)) + 1, size) if m.group(2) else size
        if start >= size or end <= start:
            raise unsatisfiable
        return start, end

    def _hold(self, seconds: float) -> None:
        """Send nothing until the client goes away, the hub stops or `seconds` pass."""
        deadline = time.monotonic() + seconds
        while not self.hub.stopping.is_set() and time.monotonic() < deadline:
            readable, _, _ = select.select([self.connection], [], [], 0.1)
            if readable:  # the client sends nothing while it waits for this body: EOF or reset
                try:
                    if not self.connection.recv(1, socket.MSG_PEEK):
                        raise ConnectionResetError
                except OSError:
                    raise ConnectionResetError from None

    def _stream(self, file: Path, path: str, start: int, end: int, status: int) -> None:
        faults = self.hub.faults
        corrupt_at = faults.corrupt.get(path)
        cut_at = self.hub._take_cut(path, start, end)
        stall_at = None if cut_at is not None else self.hub._take_stall(path, start, end)
        cut = cut_at is not None or stall_at is not None
        stop = cut_at if cut_at is not None else stall_at if stall_at is not None else end
        sent = 0
        began = time.monotonic()
        try:
            with open(file, "rb") as fh:
                fh.seek(start)
                pos = start
                while pos < stop:
                    chunk = fh.read(min(CHUNK if not faults.rate else max(1, int(faults.rate / 20)), stop - pos))
                    if not chunk:
                        break
                    if corrupt_at is not None and pos <= corrupt_at < pos + len(chunk):
                        i = corrupt_at - pos
                        chunk = chunk[:i] + bytes([chunk[i] ^ 0xFF]) + chunk[i + 1:]
                    self.wfile.write(chunk)
                    pos += len(chunk)
                    sent += len(chunk)
                    if faults.rate:
                        ahead = sent / faults.rate - (time.monotonic() - began)
                        if ahead > 0:
                            time.sleep(ahead)
            self.wfile.flush()
            if stall_at is not None:
                self._hold(30)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
            return self._record(status, sent, cut=True)
        if cut:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
        self._record(status, sent, cut=cut)


# ------------------------------------------------------------------------------- entry points
@contextlib.contextmanager
def serve_hub(root: Path, token: str | None = None, faults: HubFaults | None = None,
              host: str = "127.0.0.1", port: int = 0, cdn_host: str = "localhost") -> Iterator[Hub]:
    """Run a hub in a thread for the duration of the block; yields the Hub (``hub.url``); CDN_HOST
    must reach the same server from the client (localhost here; a twin's /etc/hosts name)."""
    hub = Hub(root, token=token, faults=faults, cdn_host=cdn_host)
    server = hub.start(host, port)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              name="sim-hub", daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        hub.stopping.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def read_token_file(path: str | os.PathLike) -> str:
    """The token a hub requires: the file's first line, stripped; ValueError when unusable."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the token ({exc})") from None
    token = text.strip()
    if not token or "\n" in token or not token.isprintable():
        raise ValueError(f"{path}: expected one line holding the token")
    return token
