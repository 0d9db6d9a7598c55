"""The gateway's HTTP callable (dsv4deploy/gateway/model.py) run on the host over SSH: the gateway and
the replicas listen on the host's loopback, and no key leaves the host.

The control node never reads a key: the worker API's functions get placeholders (`KEY`, the
inference key; `CONTROL_KEY`, the gateway's control-plane key), and this callable swaps each for
a key file's content on the host, inside a python3 process whose argv holds only the request (no
key) and which reads the 0600 files itself (as root). A placeholder may name several files: the
first that holds a key is used, and on a 401 the next (a gateway started before the
control-plane key existed takes the inference key on /workers, until it restarts).
"""

from __future__ import annotations

import base64
import json
import shlex

from dsv4deploy.host import HOST_PYTHON
from dsv4deploy.host.io import sh

KEY = "@dsv4deploy-api-key@"            # the inference key in headers and bodies; replaced on the host
CONTROL_KEY = "@dsv4deploy-control-key@"  # the gateway's control-plane key

# stdlib only, fed on argv (a static program, no secret in it); prints "STATUS\nBASE64-BODY"
_PROGRAM = r"""
import base64, json, sys, urllib.error, urllib.request
req = json.loads(base64.b64decode(sys.argv[1]))
def read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ''
choices = {p: [k for k in map(read, files) if k] or [''] for p, files in req['keys'].items()}
def call(pick):
    def sub(s):
        for p, keys in choices.items():
            s = s.replace(p, keys[min(pick, len(keys) - 1)])
        return s
    body = sub(base64.b64decode(req['body']).decode()).encode() if req['body'] is not None else None
    headers = {k: sub(v) for k, v in req['headers'].items()}
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(urllib.request.Request(req['url'], data=body, headers=headers, method=req['method']),
                         timeout=req['timeout']) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(getattr(exc, 'reason', exc)).encode()
status, out = call(0)
if status == 401 and any(len(keys) > 1 for keys in choices.values()):
    status, out = call(1)
print(status)
print(base64.b64encode(out).decode())
"""


def request_command(method: str, url: str, headers: dict, body: bytes | None, timeout: float,
                    key_files: dict[str, list[str]]) -> str:
    """The one shell command that makes the request on the host (pure: tested without a host).
    KEY_FILES: placeholder -> the files its key may be read from, in order."""
    req = {"method": method, "url": url, "headers": headers, "timeout": timeout, "keys": key_files,
           "body": base64.b64encode(body).decode() if body is not None else None}
    arg = base64.b64encode(json.dumps(req, sort_keys=True).encode()).decode()
    return f"{HOST_PYTHON} -c {shlex.quote(_PROGRAM)} {arg}"


def key_files(api_key_file: str, control_key_file: str) -> dict[str, list[str]]:
    """The placeholders of a keyed gateway: the inference key, and the control-plane key (the
    inference key while a gateway started before it runs)."""
    return {KEY: [api_key_file], CONTROL_KEY: [control_key_file, api_key_file]}


def parse_answer(out: str) -> tuple[int, bytes]:
    """(status, body) from the program's output; raises OSError when nothing answered."""
    lines = out.strip().splitlines()
    if len(lines) < 2 or not lines[-2].strip().isdigit():
        raise OSError(f"no answer from the host: {out.strip()[-200:] or 'empty output'}")
    status, body = int(lines[-2]), base64.b64decode(lines[-1])
    if status == 0:
        raise OSError(body.decode("utf-8", "replace") or "connection failed")
    return status, body


def host_http(h, keys: dict[str, list[str]] | None):
    """`http(method, url, headers, body, timeout)` for gateway.py, one SSH command per call; KEYS
    as request_command's KEY_FILES (None: no key)."""

    def http(method: str, url: str, headers: dict, body: bytes | None, timeout: float) -> tuple[int, bytes]:
        _, out = sh(h, request_command(method, url, headers, body, timeout, keys or {}), timeout=timeout + 30)
        return parse_answer(out)
    return http
