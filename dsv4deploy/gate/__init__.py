"""The smoke-benchmark gate: spec from the profile, two runners (SGLang's bench_serving and a
built-in stdlib client) with one result format, a pure verdict, and reports.

    from dsv4deploy.gate import GateHost, GateServer, GateSpec, run_gate, write_report
    spec = GateSpec.from_profile(profile.data)
    outcome = run_gate(spec, GateHost(execute, upload=...), GateServer(base_url, model_path, venv_python))
    write_report(outcome, "reports/0007", previous="reports/0006/gate.json")
"""

from dsv4deploy.gate.inputs import GateHost, GateOptions, GateServer
from dsv4deploy.gate.result import GateResult, LevelResult, Stats
from dsv4deploy.gate.runner import GateOutcome, local_execute, local_upload, run_gate
from dsv4deploy.gate.spec import GateSpec, LevelSpec
from dsv4deploy.gate.verdict import GateVerdict, judge

__all__ = ["GateHost", "GateOptions", "GateServer", "GateSpec", "LevelSpec", "GateResult", "LevelResult", "Stats", "GateVerdict", "judge",
           "GateOutcome", "run_gate", "local_execute", "local_upload", "write_report", "compare"]


def write_report(*args, **kwargs):
    from dsv4deploy.gate.report import write_report as _w  # matplotlib is imported only when a report is written

    return _w(*args, **kwargs)


def compare(*args, **kwargs):
    from dsv4deploy.gate.report import compare as _c

    return _c(*args, **kwargs)
