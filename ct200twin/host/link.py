"""A slow link to a twin: a TCP relay on loopback that delivers every byte a fixed time after it
arrived, in each direction, so that a deploy to the twin pays a real link's round trips.

The twin is reached over loopback, where a round trip costs microseconds; CT200 sits behind a
network where one costs milliseconds, and a deploy pays them per remote command (and SSH pays
several per command: a channel opened, the exec request, the exit status). The relay makes that
cost visible on the twin (`bench/deploy_overhead.py --rtt-ms 30`) without touching the kernel's
queueing disciplines (netem is not on every machine):

    with DelayRelay(("127.0.0.2", 2222), ("127.0.0.2", 22), rtt_s=0.030) as relay:
        ...  # ssh -p 2222 127.0.0.2: every round trip takes at least 30 ms more

Order is kept and nothing is coalesced across the delay: a chunk read at t is written at
t + rtt/2. Bandwidth is not limited. Loopback only: it refuses to listen or connect elsewhere.
"""

from __future__ import annotations

import asyncio
import ipaddress
import threading
import time

CHUNK = 65536


def _loopback(addr: tuple[str, int], what: str) -> None:
    if not ipaddress.ip_address(addr[0]).is_loopback:
        raise ValueError(f"{what} {addr[0]} is not a loopback address: the relay stays on this machine")


class DelayRelay:
    """Relay LISTEN -> TARGET, each direction delayed by RTT_S / 2. Use as a context manager, or
    start() and stop(); it runs its own event loop in a daemon thread."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int], rtt_s: float):
        _loopback(listen, "listen address")
        _loopback(target, "target")
        if not 0 <= rtt_s <= 10:
            raise ValueError(f"rtt_s {rtt_s} is outside 0..10 s")
        self.listen, self.target, self.one_way_s = listen, target, rtt_s / 2
        self.connections = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="delay-relay", daemon=True)
        self._server: asyncio.base_events.Server | None = None

    def start(self) -> "DelayRelay":
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, *self.listen, reuse_address=True), self._loop).result(10)
        return self

    @property
    def port(self) -> int:
        """The port it listens on (LISTEN's, or the one the system chose for port 0)."""
        return self._server.sockets[0].getsockname()[1]

    def stop(self) -> None:
        if self._server is not None:
            async def close():
                self._server.close()
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def __enter__(self) -> "DelayRelay":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        try:
            await asyncio.gather(self._pipe(client_r, server_w), self._pipe(server_r, client_w),
                                 return_exceptions=True)
        except asyncio.CancelledError:
            pass        # stop() ends an open connection: a normal end, not one asyncio should log
        finally:
            for w in (client_w, server_w):
                w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read chunks as they come; write each ONE_WAY_S after it was read (EOF too: this direction
        is shut, the other goes on), in order."""
        queue: asyncio.Queue = asyncio.Queue()

        async def deliver():
            while True:
                due, data = await queue.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    break
                writer.write(data)
                await writer.drain()

        sender = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await reader.read(CHUNK)
                await queue.put((time.monotonic() + self.one_way_s, data))
                if not data:
                    break
            await sender
        except (ConnectionError, asyncio.CancelledError):
            sender.cancel()
        finally:
            try:
                if writer.can_write_eof():
                    writer.write_eof()
            except (OSError, RuntimeError):
                pass
