"""ct200twin/host/link.py: the relay that gives the twin a real link's round trips
(bench/deploy_overhead.py --rtt-ms)."""

import socket
import threading
import time

import pytest

from ct200twin.host.link import DelayRelay


@pytest.fixture
def echo_server():
    """A loopback server that echoes each connection's bytes and shuts its side at EOF."""
    srv = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(65536):
                    conn.sendall(data)
                conn.shutdown(socket.SHUT_WR)

    threading.Thread(target=serve, daemon=True).start()
    yield srv.getsockname()
    srv.close()


def _round_trip(sock: socket.socket, payload: bytes) -> tuple[bytes, float]:
    start = time.monotonic()
    sock.sendall(payload)
    got = b""
    while len(got) < len(payload):
        got += sock.recv(65536)
    return got, time.monotonic() - start


def test_every_round_trip_pays_the_delay_and_bytes_arrive_whole_and_in_order(echo_server):
    with DelayRelay(("127.0.0.1", 0), echo_server, rtt_s=0.08) as relay:
        with socket.create_connection(("127.0.0.1", relay.port)) as sock:
            for i in range(3):                     # each exchange waits for the delay again
                got, took = _round_trip(sock, b"ping %d" % i)
                assert got == b"ping %d" % i and took >= 0.08
            big = bytes(range(256)) * 4096         # 1 MiB in many chunks: order kept, nothing lost
            sock.sendall(big)
            sock.shutdown(socket.SHUT_WR)          # EOF crosses too, after the data
            got = b""
            while data := sock.recv(65536):
                got += data
            assert got == big
        assert relay.connections == 1


def test_the_relay_stays_on_loopback():
    with pytest.raises(ValueError, match="not a loopback address"):
        DelayRelay(("0.0.0.0", 0), ("127.0.0.1", 22), rtt_s=0.03)
    with pytest.raises(ValueError, match="not a loopback address"):
        DelayRelay(("127.0.0.1", 0), ("192.0.2.1", 22), rtt_s=0.03)
    with pytest.raises(ValueError, match="outside"):
        DelayRelay(("127.0.0.1", 0), ("127.0.0.1", 22), rtt_s=-1)


def test_a_target_that_refuses_closes_the_client_instead_of_hanging_it():
    closed = socket.create_server(("127.0.0.1", 0))
    dead = closed.getsockname()
    closed.close()                                 # nothing listens there now
    with DelayRelay(("127.0.0.1", 0), dead, rtt_s=0.0) as relay:
        with socket.create_connection(("127.0.0.1", relay.port)) as sock:
            sock.settimeout(5)
            assert sock.recv(10) == b""            # closed, not hung


def test_stopping_with_a_connection_open_logs_no_error(echo_server, caplog):
    """The bench stops its relay while pyinfra's connection may still be open: that is the end of
    the link, not an error asyncio should print a traceback for."""
    relay = DelayRelay(("127.0.0.1", 0), echo_server, rtt_s=0.002).start()
    sock = socket.create_connection(("127.0.0.1", relay.port))
    try:
        assert _round_trip(sock, b"x")[0] == b"x"
        with caplog.at_level("ERROR", logger="asyncio"):
            relay.stop()
            time.sleep(0.2)
        assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text
    finally:
        sock.close()
