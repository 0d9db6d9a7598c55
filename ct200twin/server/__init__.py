"""The SGLang twin server: a stand-in for ``python -m sglang.launch_server`` that behaves like
SGLang 0.5.23 from the outside (argv, startup phases, HTTP API, logs) at CT200's measured speed.

Entry point: ``python -m ct200twin.server.main <same argv as sglang.launch_server>``.
Modules: ``args`` (argv), ``perf`` (performance model + calibration), ``memory`` (its own GPU
memory model), ``faults`` (knob file), ``resolved`` (what a start works out from argv, the
checkpoint and nvidia-smi), ``engine`` (tokens in wall time), ``http_api`` (the endpoints),
``logs`` (SGLang's log lines), ``server`` (startup sequence and main), ``local_twin`` (a twin
subprocess for tests and benchmarks).
The twin imports nothing else from dsv4deploy but ``patches`` (whether the installed SGLang
carries the mask-secrets patch): the validator must not test itself, and the host gets only
this package, ``patches.py`` and ``data/`` (``ct200twin/host/stand_ins.py``: ``server_archive``).
"""

DEFAULT_SGLANG_VERSION = "0.5.23"
