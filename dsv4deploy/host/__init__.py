"""Everything that touches the GPU host: facts (what it says), the snapshot that reads them in
one command, the state a deploy decides from, the operations derived from it, the small
direct effects (host/io.py), the release store with the deploy lock (host/release_store.py)
and the rollback that restores a release (host/rollback.py). `tasks/` holds the `@deploy`
steps that use them."""

# Programs that are copied to the GPU host and run there with its own python3: each starts with
# the line HOST_PROGRAM_MARK and imports only the standard library (tests/test_host_programs.py).
HOST_PROGRAMS = ("gate/client.py", "preflight/nccl_probe.py", "weights/check.py", "weights/fetch.py",
                 "host/uvpip.py", "sglang/launch_parser.py", "watch/decide.py",
                 "watch/agent.py", "watch/act.py")
HOST_PROGRAM_MARK = "# dsv4deploy host program: runs on the GPU host with its own python3; standard library only."

# How the deploy starts python on the host (as root, the service user or the gate's user):
# isolated (-I), so that what it imports is what the unit's python imports, not the login's
# environment (a PYTHONPATH in /etc/environment, PYTHONSTARTUP), user site or working directory
# (`python -c`, `python -` and `python -m` put that first on sys.path, ahead of the standard
# library). The host's python3 for a stdlib-only program also skips site packages (-S); a venv's
# python keeps its own.
HOST_PYTHON = "python3 -I -S"
ISOLATED = "-I"
