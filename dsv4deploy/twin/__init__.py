"""The SGLang twin server: a stand-in for ``python -m sglang.launch_server`` that behaves like
SGLang 0.5.23 from the outside (argv, startup phases, HTTP API, logs) at CT200's measured speed.

Entry point: ``python -m dsv4deploy.twin.server <same argv as sglang.launch_server>``.
Modules: ``args`` (argv), ``perf`` (performance model + calibration), ``memory`` (its own GPU
memory model), ``faults`` (knob file), ``server`` (aiohttp app and startup sequence).
The twin never imports the rest of dsv4deploy (the validator must not test itself).
"""

DEFAULT_SGLANG_VERSION = "0.5.23"
