"""dsv4deploy: declarative, gated deployment of DeepSeek-V4-Flash on SGLang."""

import atexit
import gc
from importlib.resources import files

__version__ = "0.1.0"

PACKAGE_DATA = files(__name__) / "data"

# At exit the interpreter's last collection walks every object the run made (pyinfra, gevent,
# paramiko and, after a gate, matplotlib): 0.15 s of each deploy's wall time on the twin
# (bench/deploy_overhead.py). Nothing here needs it: every file is closed where it is written,
# and stdout is flushed regardless. So the objects alive at exit are frozen out of it.
atexit.register(gc.freeze)
