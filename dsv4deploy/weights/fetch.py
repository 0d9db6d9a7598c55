# dsv4deploy host program: runs on the GPU host with its own python3; standard library only.
"""Fetch what a checkpoint folder lacks from the hub, resuming a partial file where it stopped.

    python3 weights_fetch.py DIR ENDPOINT REPO COMMIT [--hf HF] < EXPECTED.json

Why not ``hf download`` alone: huggingface_hub (1.33, the host's lock; 2.4 too) writes each file to
a per-process ``*.<uuid>.incomplete`` and deletes it when the process fails, so a run that was cut
starts every partial shard from byte 0 (it resumes with Range only inside one process). Here a
file being fetched is ``DIR/.cache/dsv4deploy/partial/<path>.part``, kept across runs: the next
run asks for ``Range: bytes=<size of the .part>-`` and appends.

Route per file (the hub's own answer decides): the HEAD of ``/{repo}/resolve/{commit}/{path}``
(its 302 carries the metadata, as huggingface_hub reads it). A file the hub offers through **Xet**
(``X-Xet-Hash``) is left to ``hf download`` with hf-xet (``--hf``: the venv's ``hf``), the hub's
fastest route; every other file is fetched here over HTTP from the 302's Location (the CDN: the
token is sent to the hub's own host only). Files already present with the expected size are
left alone (their bytes are checked by weights_check.py, the deploy's next step). The token is
read from the file ``HF_TOKEN_PATH`` names, else from the systemd credential ``hf-token`` (the
deploy runs this as an unprivileged transient unit: host/sandbox.py), never argv; ``hf download``
gets the same file as its HF_TOKEN_PATH. Prints one progress line per file on
stderr, ``{"fetched", "resumed", "xet", "failed"}`` on stdout; exits 0 when nothing failed.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

PARTIAL = ".cache/dsv4deploy/partial"
HF_PARTIAL = ".cache/huggingface/download"     # hf download's own *.<uuid>.incomplete files
TOKEN_CREDENTIAL = "hf-token"
CHUNK = 1 << 20
TRIES = 5
USER_AGENT = "dsv4deploy-weights-fetch/1"    # names this program in the hub's and its CDN's logs


def _unsafe(path: str) -> bool:
    p = Path(path)
    return (not path or p.is_absolute() or ".." in p.parts or any(ord(c) < 32 for c in path))


def _request(url: str, method: str, headers: dict, proxy: str | None = None, timeout: float = 60.0):
    """One request, through PROXY (an http:// proxy URL: CONNECT for https, absolute URI for http)."""
    u = urllib.parse.urlsplit(url)
    target = u.path + (f"?{u.query}" if u.query else "")
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    if proxy:
        pu = urllib.parse.urlsplit(proxy)
        conn = cls(pu.hostname, pu.port or 80, timeout=timeout)
        if u.scheme == "https":
            conn.set_tunnel(u.hostname, u.port or 443)
        else:
            target = url
    else:
        conn = cls(u.hostname, u.port, timeout=timeout)
    conn.request(method, target, headers={"User-Agent": USER_AGENT, **headers})
    return conn, conn.getresponse()


def token_path(environ) -> str | None:
    """The token's file: HF_TOKEN_PATH, else the credential systemd handed this unit, else None."""
    if environ.get("HF_TOKEN_PATH"):
        return environ["HF_TOKEN_PATH"]
    credential = Path(environ.get("CREDENTIALS_DIRECTORY") or "/nonexistent") / TOKEN_CREDENTIAL
    return str(credential) if environ.get("CREDENTIALS_DIRECTORY") and credential.is_file() else None


def drop_dead_partials(folder: Path) -> None:
    """hf download's partial files are per process and never reused by a later run (huggingface_hub
    1.33): a killed run's are dead weight on the disk."""
    for dead in (folder / HF_PARTIAL).rglob("*.incomplete"):
        if dead.is_file() and not dead.is_symlink():
            dead.unlink()


def _token(path: str | None) -> str | None:
    """The token in the file PATH names (HF_TOKEN_PATH, as huggingface_hub reads it), or None."""
    try:
        return (Path(path).read_text().strip() or None) if path else None
    except OSError:
        return None


class Fetcher:
    """One repo at one commit, fetched into one folder."""

    def __init__(self, folder: Path, endpoint: str, repo: str, commit: str, token: str | None,
                 proxies: dict | None = None):
        self.folder, self.endpoint, self.repo, self.commit = folder, endpoint.rstrip("/"), repo, commit
        self.token = token
        self.proxies = proxies or {}     # urllib.request.getproxies(): the host's http(s)_proxy, no_proxy
        self.hub_host = urllib.parse.urlsplit(self.endpoint).hostname

    def _proxy(self, url: str) -> str | None:
        u = urllib.parse.urlsplit(url)
        bypass = self.proxies.get("no", "")
        if bypass and urllib.request.proxy_bypass_environment(u.netloc, {"no": bypass}):
            return None
        return self.proxies.get(u.scheme)

    def _headers(self, url: str) -> dict:
        same = urllib.parse.urlsplit(url).hostname == self.hub_host
        return {"Authorization": f"Bearer {self.token}"} if self.token and same else {}

    def locate(self, path: str) -> tuple[str, bool]:
        """(the URL the bytes come from, whether the hub offers the file through Xet)."""
        url = f"{self.endpoint}/{self.repo}/resolve/{self.commit}/{urllib.parse.quote(path)}"
        for _ in range(5):          # redirects on the hub's own host (a renamed repo) are followed
            conn, resp = _request(url, "HEAD", self._headers(url), self._proxy(url))
            resp.read()
            conn.close()
            if resp.status in (301, 302, 303, 307, 308):
                target = urllib.parse.urljoin(url, resp.getheader("Location") or "")
                if resp.getheader("X-Xet-Hash"):
                    return target, True
                if urllib.parse.urlsplit(target).hostname != self.hub_host:
                    return target, False
                url = target
                continue
            if resp.status >= 400:
                raise OSError(f"HEAD {path}: HTTP {resp.status} {resp.getheader('X-Error-Message') or resp.reason}")
            return url, bool(resp.getheader("X-Xet-Hash"))
        raise OSError(f"HEAD {path}: too many redirects")

    def fetch(self, path: str, url: str, size: int) -> int:
        """Bring PATH to SIZE bytes from URL, appending to its .part; returns the bytes it resumed from."""
        part = self.folder / PARTIAL / (path + ".part")
        part.parent.mkdir(parents=True, exist_ok=True)
        resumed = part.stat().st_size if part.exists() else 0
        if resumed > size:
            part.unlink()
            resumed = 0
        tries = TRIES
        while True:
            have = part.stat().st_size if part.exists() else 0
            if have == size:
                break
            try:
                headers = {**self._headers(url), **({"Range": f"bytes={have}-"} if have else {})}
                conn, resp = _request(url, "GET", headers, self._proxy(url))
                if resp.status not in (200, 206):
                    raise OSError(f"GET {path}: HTTP {resp.status}")
                with open(part, "ab" if resp.status == 206 else "wb") as out:
                    while chunk := resp.read(CHUNK):
                        out.write(chunk)
                        tries = TRIES        # bytes came: the count of tries starts again
                conn.close()
                if (part.stat().st_size if part.exists() else 0) < size:
                    raise ConnectionError(f"GET {path}: the connection ended early")
            except (OSError, http.client.HTTPException) as exc:
                tries -= 1
                if tries <= 0:
                    raise OSError(f"{path}: {exc}") from None
                print(f"weights_fetch: {path}: {exc}; resuming", file=sys.stderr)
                time.sleep(1)
        dest = self.folder / path
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, dest)
        return resumed


def missing(folder: Path, files: dict) -> list[str]:
    """The files not present with their expected size (a wrong-sized one is removed)."""
    out = []
    for path, meta in sorted(files.items()):
        if _unsafe(path):
            raise ValueError(f"{path!r}: not a relative path inside the checkpoint")
        p = folder / path
        if p.is_file() and p.stat().st_size == meta["size"]:
            continue
        if p.is_file():
            p.unlink()
        out.append(path)
    return out


def run(fetcher: Fetcher, expected: dict, hf: str | None) -> dict:
    """Fetch what FETCHER's folder lacks of EXPECTED ({commit, files}); HF takes the Xet files."""
    files = expected.get("files") if isinstance(expected.get("files"), dict) else expected
    folder, endpoint, repo, commit = fetcher.folder, fetcher.endpoint, fetcher.repo, fetcher.commit
    result: dict = {"fetched": [], "resumed": {}, "xet": [], "failed": {}}
    todo = missing(folder, files)
    for n, path in enumerate(todo, 1):
        size = files[path]["size"]
        try:
            url, xet = fetcher.locate(path)
            if xet and hf:
                result["xet"].append(path)
                continue
            t0 = time.monotonic()
            resumed = fetcher.fetch(path, url, size)
        except (OSError, http.client.HTTPException) as exc:
            result["failed"][path] = str(exc)
            print(f"weights_fetch: {n}/{len(todo)} {path}: FAILED: {exc}", file=sys.stderr)
            continue
        result["fetched"].append(path)
        if resumed:
            result["resumed"][path] = resumed
        print(f"weights_fetch: {n}/{len(todo)} {path}: {size} bytes in {time.monotonic() - t0:.1f} s"
              + (f" (resumed at byte {resumed})" if resumed else ""), file=sys.stderr)
    lfs = [p for p in todo if files[p].get("sha256")]
    if result["xet"]:
        print(f"weights_fetch: {len(result['xet'])} file(s) through Xet (hf download)", file=sys.stderr)
        cmd = [hf, "download", repo, *result["xet"], "--revision", commit, "--local-dir", str(folder), "--quiet"]
        if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
            result["failed"].update({p: "hf download failed" for p in result["xet"] if not (folder / p).is_file()})
    elif lfs and not result["failed"]:
        print(f"weights_fetch: {endpoint} offers no Xet for these files: plain HTTP with Range resume",
              file=sys.stderr)
    return result


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="weights_fetch", description=__doc__.splitlines()[0])
    parser.add_argument("local_dir")
    parser.add_argument("endpoint")
    parser.add_argument("repo")
    parser.add_argument("commit")
    parser.add_argument("--hf", help="the venv's hf, for the files the hub offers through Xet")
    args = parser.parse_args(argv)
    try:
        expected = json.loads(sys.stdin.read())
        folder = Path(args.local_dir)
        folder.mkdir(parents=True, exist_ok=True)
        drop_dead_partials(folder)
        tokens = token_path(os.environ)
        if tokens:
            os.environ["HF_TOKEN_PATH"] = tokens        # hf download's, for the Xet files
        fetcher = Fetcher(folder, args.endpoint, args.repo, args.commit, _token(tokens), urllib.request.getproxies())
        result = run(fetcher, expected, args.hf)
    except (ValueError, AttributeError, KeyError, TypeError) as exc:
        print(f"weights_fetch: expected JSON on stdin: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
