"""The two places this project changes what a dependency does while a deploy runs, in one
module, each pinned to what it was compared with (tests/test_dependency_patches.py fails naming
the function when a pyinfra or paramiko upgrade changes what they replace). Measured with
bench/dependency_patches.py (bench/results/dependency-patches-2026-12-05.md).

- pyinfra's operation order without inspect.stack() (install_operation_order; dsv4deploy/tasks/
  __init__.py installs it). In a CLI run pyinfra orders operations by the line numbers of the
  call stack that added each (pyinfra/api/util.py `get_operation_order_from_stack`), read
  through inspect.stack(), which builds every frame's source context and looks its file's module
  up in sys.modules, then reads every frame again with getframeinfo(): about 50 ms of CPU for a
  deploy's 15-16 operations, paid again for every host of a fleet. Only the frames' files and
  line numbers are used, and the frames hold both. Installed only for the pyinfra and Python
  versions it was compared with (PYINFRA_TESTED_ON); any other keeps pyinfra's own.
- paramiko's open_session on a deploy's SSH transport (sessions_ahead; the deploy files call it
  first): each command's channel is opened while the command before it runs, so a command costs
  one round trip, not two.
"""

from __future__ import annotations

import sys
import threading

from dsv4deploy.host.io import no_delay, ssh_transport

PYINFRA_TESTED_ON = (("3.10.0", (3, 11)),)     # (pyinfra, Python): order_from_stack compared with pyinfra's
PARAMIKO_TESTED_ON = ("4.0.0",)                 # SessionsAhead stands in for these Transport.open_session


# --- pyinfra: the operations' order ---------------------------------------------------------------

def order_from_stack(state) -> list[int]:
    """What pyinfra's get_operation_order_from_stack returns, from the frames themselves: the
    line numbers of the stack from the (first) frame of the deploy file being run, outermost
    first, skipping pyinfra's own frames."""
    import pyinfra
    from pyinfra.api.util import PYINFRA_INSTALL_DIR

    frames = []
    frame = sys._getframe(1)
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    frames.reverse()
    start = 0
    if state.current_deploy_filename:
        # the first frame of the deploy file; none: pyinfra's loop ends on its own frame (skipped)
        start = next((i for i, f in enumerate(frames) if f.f_code.co_filename == state.current_deploy_filename),
                     len(frames))
    lines = [state.current_op_file_number] if pyinfra.is_cli else []
    lines += [f.f_lineno for f in frames[start:] if not f.f_code.co_filename.startswith(PYINFRA_INSTALL_DIR)]
    return lines


def install_operation_order() -> bool:
    """Use order_from_stack for this run when pyinfra's and Python's versions are a pair it was
    compared on (pyinfra.api.operation calls get_operation_order_from_stack by its module-level
    name: the test checks that it still does)."""
    import importlib

    import pyinfra

    operation = importlib.import_module("pyinfra.api.operation")   # pyinfra.api.operation is the decorator
    if (pyinfra.__version__, sys.version_info[:2]) not in PYINFRA_TESTED_ON:
        return False
    operation.get_operation_order_from_stack = order_from_stack
    return True


# --- paramiko: session channels one ahead ----------------------------------------------------------

class SessionsAhead:
    """A paramiko transport's session channels, one opened ahead of the command that takes it.

    Every command pyinfra runs opens a channel first (paramiko's exec_command): a round trip
    before the command itself is sent, 30 ms on a link 30 ms away. Here the next channel is
    asked for as soon as one is taken, while the command runs, so the next command's channel is
    open when it is sent: one round trip per command. The first is asked for at once: sshd sets
    up a connection's session (PAM, logind, motd: 52 ms on the twin) when its first channel
    opens, and that now overlaps the deploy's loading instead of delaying the host's read. A
    spare that did not open, or closed, is replaced by a channel opened then; a call with its
    own window or packet size is opened as paramiko does. The spare opens with paramiko's own
    timeout, and a caller waits for it as long as its own timeout says (None: as paramiko
    would). One spare at most: never near sshd's MaxSessions (10); one nobody takes is closed
    with the connection."""

    def __init__(self, transport):
        self._open = transport.open_session       # paramiko's own
        self._spare: tuple[threading.Event, list] | None = None
        self._ask()

    def _ask(self) -> None:
        if self._spare is not None:         # one is on its way already
            return
        done, box = threading.Event(), []

        def opener() -> None:
            try:
                box.append(self._open())
            except Exception:  # noqa: BLE001 - a spare that did not open: the command opens its own
                pass
            finally:
                done.set()

        self._spare = (done, box)
        # under pyinfra's gevent, start() runs the opener until it waits for the host's answer:
        # the request is on its way before this returns
        threading.Thread(target=opener, name="ssh-session-ahead", daemon=True).start()

    def open_session(self, window_size=None, max_packet_size=None, timeout=None):
        if window_size is not None or max_packet_size is not None:      # its own sizes: as asked
            return self._open(window_size=window_size, max_packet_size=max_packet_size, timeout=timeout)
        spare, self._spare = self._spare, None
        channel = None
        if spare is not None:
            done, box = spare
            done.wait(timeout)
            channel = box[0] if box and box[0].active and not box[0].closed else None
        try:
            return channel or self._open(timeout=timeout)
        finally:
            self._ask()


def sessions_ahead(h) -> None:
    """Open H's SSH session channels one ahead of its commands (SessionsAhead) from now on; the
    deploy files call it first. Once per connection; not an SSH connection (a fake, a local
    one), or a paramiko it was not compared with (PARAMIKO_TESTED_ON): nothing."""
    import paramiko

    no_delay(h)
    transport = ssh_transport(h)
    if transport is None or getattr(transport, "dsv4deploy_sessions_ahead", None) is not None:
        return
    if paramiko.__version__ not in PARAMIKO_TESTED_ON:
        return
    ahead = SessionsAhead(transport)
    transport.dsv4deploy_sessions_ahead = ahead
    transport.open_session = ahead.open_session
