"""The gateway's HTTP callable (dsv4deploy/gateway/model.py) run on the host over SSH: the gateway and
the replicas listen on the host's loopback, and the API key never leaves the host.

The control node never reads the key: the worker API's functions get `KEY`, a placeholder, and
this callable swaps it for the key file's content on the host, inside a python3 process whose
argv holds only the request (no key) and which reads the 0600 file itself (as root).
"""

from __future__ import annotations

import base64
import json
import shlex

from dsv4deploy.host import HOST_PYTHON
from dsv4deploy.host.io import sh

KEY = "@dsv4deploy-api-key@"   # stands for the key in headers and bodies; replaced on the host

# stdlib only, fed on argv (a static program, no secret in it); prints "STATUS\nBASE64-BODY"
_PROGRAM = r"""
import base64, json, sys, urllib.error, urllib.request
req = json.loads(base64.b64decode(sys.argv[1]))
key = ''
if req['key_file']:
    with open(req['key_file']) as f:
        key = f.read().strip()
sub = lambda s: s.replace(req['placeholder'], key)
body = sub(base64.b64decode(req['body']).decode()).encode() if req['body'] is not None else None
headers = {k: sub(v) for k, v in req['headers'].items()}
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    with opener.open(urllib.request.Request(req['url'], data=body, headers=headers, method=req['method']),
                     timeout=req['timeout']) as resp:
        status, out = resp.status, resp.read()
except urllib.error.HTTPError as exc:
    status, out = exc.code, exc.read()
except (urllib.error.URLError, OSError) as exc:
    status, out = 0, str(getattr(exc, 'reason', exc)).encode()
print(status)
print(base64.b64encode(out).decode())
"""


def request_command(method: str, url: str, headers: dict, body: bytes | None, timeout: float,
                    key_file: str | None) -> str:
    """The one shell command that makes the request on the host (pure: tested without a host)."""
    req = {"method": method, "url": url, "headers": headers, "timeout": timeout, "key_file": key_file,
           "placeholder": KEY, "body": base64.b64encode(body).decode() if body is not None else None}
    arg = base64.b64encode(json.dumps(req, sort_keys=True).encode()).decode()
    return f"{HOST_PYTHON} -c {shlex.quote(_PROGRAM)} {arg}"


def parse_answer(out: str) -> tuple[int, bytes]:
    """(status, body) from the program's output; raises OSError when nothing answered."""
    lines = out.strip().splitlines()
    if len(lines) < 2 or not lines[-2].strip().isdigit():
        raise OSError(f"no answer from the host: {out.strip()[-200:] or 'empty output'}")
    status, body = int(lines[-2]), base64.b64decode(lines[-1])
    if status == 0:
        raise OSError(body.decode("utf-8", "replace") or "connection failed")
    return status, body


def host_http(h, key_file: str | None):
    """`http(method, url, headers, body, timeout)` for gateway.py, one SSH command per call."""

    def http(method: str, url: str, headers: dict, body: bytes | None, timeout: float) -> tuple[int, bytes]:
        _, out = sh(h, request_command(method, url, headers, body, timeout, key_file), timeout=timeout + 30)
        return parse_answer(out)
    return http
