"""pyinfra's operation order, read without inspect.stack().

In a CLI run pyinfra orders operations by the line numbers of the call stack that added each
(pyinfra/api/util.py `get_operation_order_from_stack`). It reads them through inspect.stack(),
which builds every frame's source context and looks its file's module up in sys.modules, then
reads every frame again with getframeinfo(): 2.2 ms per operation here, 40 ms of a deploy's 18
operations, paid again for every host of a fleet. Only the frames' files and line numbers are
used, and the frames hold both: `install()` puts in a function that reads them there, for the
pyinfra versions whose function it was compared with (TESTED_ON: tests/test_op_order.py runs
both on the same stacks, and every twin deploy runs its operations in this order). A pyinfra or a
Python not listed (frames and line numbers are Python's) keeps pyinfra's own.
"""

from __future__ import annotations

import sys

TESTED_ON = (("3.10.0", (3, 11)),)     # (pyinfra, Python)


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


def install() -> bool:
    """Use order_from_stack for this run when pyinfra's and Python's versions are a pair it was
    compared on."""
    import importlib

    import pyinfra

    operation = importlib.import_module("pyinfra.api.operation")   # pyinfra.api.operation is the decorator
    if (pyinfra.__version__, sys.version_info[:2]) not in TESTED_ON:
        return False
    operation.get_operation_order_from_stack = order_from_stack
    return True
