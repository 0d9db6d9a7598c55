"""GPU preflight: read the GPUs and probe NCCL before a restart (issue 6).

For the deploy (pure, no I/O):

    from dsv4deploy.preflight import query_args, parse_query, check_gpus, profile_expectations
    text = <stdout of query_args() run on the host>
    problems = check_gpus(parse_query(text), **profile_expectations(profile.data))

    from dsv4deploy.preflight import PROBE_SCRIPT, probe_argv, format_result
    upload PROBE_SCRIPT to the host, run probe_argv(profile.data, script=..., env_file=...)
    there, json.loads its stdout (exit 0 ok, 1 failed), show format_result(doc).

On the command line: `python -m dsv4deploy.preflight gpus|nccl --profile P` (see cli.py).
"""

from dsv4deploy.preflight.gpus import (QUERY_ARGS, QUERY_FIELDS, QUERY_FIELDS_MIG, GpuInfo, NvidiaSmiError,
                                       check_gpus, driver_branch, format_table, parse_query, profile_expectations,
                                       query_args)
from dsv4deploy.preflight.nccl_probe import (DEFAULT_SIZES, DEFAULT_TIMEOUT_S, HANG_HINT, busbw, format_result,
                                             launch, launch_groups, parse_groups, read_env_file, rank_environment)
from dsv4deploy.preflight.nccl_report import format_compare, format_groups
from dsv4deploy.preflight.cli import PROBE_SCRIPT, probe_argv, profile_nccl_env, unit_environment

__all__ = [
    "QUERY_ARGS", "QUERY_FIELDS", "QUERY_FIELDS_MIG", "GpuInfo", "NvidiaSmiError", "check_gpus",
    "driver_branch", "format_table", "parse_query", "profile_expectations", "query_args",
    "DEFAULT_SIZES", "DEFAULT_TIMEOUT_S", "HANG_HINT", "busbw", "format_compare", "format_result",
    "format_groups", "launch", "launch_groups", "parse_groups", "read_env_file", "rank_environment",
    "PROBE_SCRIPT", "probe_argv", "profile_nccl_env", "unit_environment",
]
