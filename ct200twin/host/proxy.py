"""The HTTP proxy an isolated twin reaches the outside through (stdlib only).

A fleet twin's network namespace has no route out (``netns.py``) and this machine has no NAT
(no iptables/nft), so apt, pip and curl in the twin go through this proxy, which listens only on
this machine's end of the twin's veth:

    python -m ct200twin.host.proxy --listen 10.213.0.1:3128 --deny 10.213.0.0/16

It answers ``CONNECT host:port`` (https: a byte tunnel, TLS stays end to end) and plain http
requests in absolute form (``GET http://deb.debian.org/... HTTP/1.1``: forwarded with
``Connection: close``). Only ports 80 and 443 (``--port`` adds more), and never to a loopback,
link-local, multicast or unspecified address or to a ``--deny`` network (the fleet's own pool),
whatever a name resolves to: a twin cannot reach this machine's loopback (the default twin's
server on 127.0.0.1:30000, or anything else there) through it. The destination is resolved once and
that address is the one connected to. ``--upstream http://HOST:PORT`` chains to this machine's own
proxy (``sim up`` passes its https_proxy/http_proxy when set). One line per request on stderr.

Started by ``sim up --fleet``, one per twin, in its own session; its PID and start time are kept
in ``hosts/NAME-N/proxy.json``, and ``sim down`` stops it by them (``proxyctl.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import signal
import socket
import socketserver
import sys
import threading
import time
from typing import Iterable
from urllib.parse import urlsplit

PORT = 3128                    # proxyctl.PORT
MAX_HEAD = 64 * 1024
CONNECT_TIMEOUT_S = 15.0
IDLE_TIMEOUT_S = 300.0
ALLOWED_PORTS = (80, 443)
MODULE = "ct200twin.host.proxy"


class _Silent(Exception):
    """A connection that sent nothing (a probe that the proxy listens): no answer, no log line."""


class Refused(Exception):
    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status


def _forbidden_ip(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, deny: Iterable) -> bool:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return (ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_unspecified or ip.is_reserved
            or any(ip.version == n.version and ip in n for n in deny))


def split_host_port(text: str, default_port: int | None) -> tuple[str, int]:
    """'host:port', '[v6]:port' or a bare host (with DEFAULT_PORT) -> (host, port)."""
    host, port = text, None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise Refused(400, f"bad host {text!r}")
        host, rest = text[1:end], text[end + 1:]
        if rest:
            if not rest.startswith(":"):
                raise Refused(400, f"bad host {text!r}")
            port = rest[1:]
    elif text.count(":") == 1:
        host, port = text.split(":")
    if port is None:
        if default_port is None:
            raise Refused(400, f"no port in {text!r}")
        return host, default_port
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise Refused(400, f"bad port in {text!r}")
    return host, int(port)


class Policy:
    def __init__(self, ports: Iterable[int], deny: Iterable[str], upstream: str | None = None):
        self.ports = set(ports)
        self.deny = [ipaddress.ip_network(n, strict=False) for n in deny]
        self.upstream = split_host_port(urlsplit(upstream).netloc, 80) if upstream else None

    def destination(self, host: str, port: int) -> tuple[str, int]:
        """Where to connect for HOST:PORT: an address that passes the rules (Refused otherwise).
        Through an upstream proxy, the upstream (the name is checked as far as it can be here)."""
        if port not in self.ports:
            raise Refused(403, f"port {port} is not allowed (only {', '.join(map(str, sorted(self.ports)))})")
        if not host or host.lower().rstrip(".") in ("localhost", "localhost.localdomain") or \
                host.lower().endswith(".localhost"):
            raise Refused(403, f"{host or 'an empty host'}: this machine's loopback is not reachable from a twin")
        literal = None
        with contextlib.suppress(ValueError):
            literal = ipaddress.ip_address(host)
        if literal is not None and _forbidden_ip(literal, self.deny):
            raise Refused(403, f"{host}: loopback, link-local and the fleet's own addresses are not reachable")
        if self.upstream:
            return self.upstream
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise Refused(502, f"cannot resolve {host}: {exc.strerror or exc}") from None
        addrs = [info[4][0] for info in infos]
        bad = [a for a in addrs if _forbidden_ip(ipaddress.ip_address(a.split("%")[0]), self.deny)]
        if bad:
            raise Refused(403, f"{host} resolves to {bad[0]}: loopback, link-local and the fleet's own "
                               "addresses are not reachable")
        v4 = [a for a in addrs if ":" not in a]
        return (v4 or addrs)[0], port


def _relay(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until both sides are done."""
    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    other = threading.Thread(target=pump, args=(b, a), daemon=True)
    other.start()
    pump(a, b)
    other.join()


class Handler(socketserver.BaseRequestHandler):
    server: "Server"

    def _reply(self, status: int, text: str) -> None:
        reason = {400: "Bad Request", 403: "Forbidden", 405: "Method Not Allowed", 502: "Bad Gateway",
                  504: "Gateway Timeout"}.get(status, "Error")
        body = (text + "\n").encode()
        with contextlib.suppress(OSError):
            self.request.sendall(f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\n"
                                 f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)

    def _head(self) -> tuple[bytes, bytes]:
        buf = b""
        while b"\r\n\r\n" not in buf:
            if len(buf) > MAX_HEAD:
                raise Refused(400, "request head too large")
            data = self.request.recv(65536)
            if not data:
                if not buf:
                    raise _Silent()
                raise Refused(400, "connection closed before the request head ended")
            buf += data
        head, rest = buf.split(b"\r\n\r\n", 1)
        return head, rest

    def handle(self) -> None:
        self.request.settimeout(IDLE_TIMEOUT_S)
        line = "-"
        try:
            head, rest = self._head()
            lines = head.decode("latin-1").split("\r\n")
            line = lines[0]
            parts = line.split()
            if len(parts) != 3 or not parts[2].startswith("HTTP/"):
                raise Refused(400, f"bad request line {line[:200]!r}")
            method, target, version = parts
            if method == "CONNECT":
                self._connect(target, version)
            else:
                self._forward(method, target, version, lines[1:], rest)
            self.server.note(f"{line[:300]} ok")
        except _Silent:
            return
        except Refused as exc:
            self.server.note(f"{line[:300]} refused {exc.status}: {exc}")
            self._reply(exc.status, str(exc))
        except OSError as exc:
            self.server.note(f"{line[:300]} failed: {exc}")
            self._reply(502, f"proxy: {exc}")

    def _open(self, host: str, port: int) -> socket.socket:
        addr = self.server.policy.destination(host, port)
        try:
            up = socket.create_connection(addr, timeout=CONNECT_TIMEOUT_S)
        except socket.timeout:
            raise Refused(504, f"{host}:{port}: connect timed out") from None
        except OSError as exc:
            raise Refused(502, f"{host}:{port}: {exc.strerror or exc}") from None
        up.settimeout(IDLE_TIMEOUT_S)
        return up

    def _connect(self, target: str, version: str) -> None:
        host, port = split_host_port(target, None)
        with self._open(host, port) as up:
            if self.server.policy.upstream:
                up.sendall(f"CONNECT {target} {version}\r\nHost: {target}\r\n\r\n".encode())
                head, rest = b"", b""
                while b"\r\n\r\n" not in head:
                    data = up.recv(65536)
                    if not data or len(head) > MAX_HEAD:
                        raise Refused(502, "the upstream proxy closed the tunnel")
                    head += data
                head, rest = head.split(b"\r\n\r\n", 1)
                if head.split(b" ", 2)[1:2] != [b"200"]:
                    self.request.sendall(head + b"\r\n\r\n" + rest)
                    return
            self.request.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            _relay(self.request, up)

    def _forward(self, method: str, target: str, version: str, headers: list[str], rest: bytes) -> None:
        url = urlsplit(target)
        if url.scheme != "http" or not url.netloc:
            raise Refused(400, f"only absolute http:// URLs and CONNECT here, not {target[:200]!r}")
        host, port = split_host_port(url.netloc.rsplit("@", 1)[-1], 80)
        keep = [h for h in headers if h.split(":", 1)[0].strip().lower()
                not in ("connection", "proxy-connection", "keep-alive", "proxy-authorization")]
        path = target if self.server.policy.upstream else (url.path or "/") + (f"?{url.query}" if url.query else "")
        with self._open(host, port) as up:
            up.sendall(f"{method} {path} {version}\r\n".encode("latin-1")
                       + "".join(h + "\r\n" for h in keep).encode("latin-1") + b"Connection: close\r\n\r\n" + rest)
            _relay(self.request, up)


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], policy: Policy, log=None):
        self.policy = policy
        self._log = log or sys.stderr
        self._lock = threading.Lock()
        super().__init__(address, Handler)

    def note(self, text: str) -> None:
        with self._lock:
            print(f"{time.strftime('%H:%M:%S')} {text}", file=self._log, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.splitlines()[0])
    p.add_argument("--listen", required=True, metavar="ADDR:PORT")
    p.add_argument("--deny", action="append", default=[], metavar="NET", help="a network never connected to")
    p.add_argument("--port", action="append", type=int, default=[], help="another destination port to allow")
    p.add_argument("--upstream", metavar="URL", help="this machine's own http proxy, to chain to")
    args = p.parse_args(argv)
    try:
        host, port = split_host_port(args.listen, PORT)
        server = Server((host, port), Policy((*ALLOWED_PORTS, *args.port), args.deny, args.upstream))
    except (Refused, OSError, ValueError) as exc:
        print(f"proxy: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    server.note(f"listening on {host}:{port}")
    try:
        server.serve_forever(poll_interval=0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
