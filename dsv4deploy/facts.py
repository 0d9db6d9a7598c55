"""pyinfra facts the rollout reads from the GPU host before it changes anything.

Each fact is one cheap command whose output the pure core interprets; none of them change
the host.
"""

from __future__ import annotations

import json

from pyinfra.api import FactBase, QuoteString, StringCommand

from .preflight.gpus import QUERY_ARGS

class NvidiaSmi(FactBase):
    """Raw `nvidia-smi --query-gpu` CSV (the preflight's query, with MIG mode), or None when
    nvidia-smi is absent (no driver). A failing nvidia-smi returns its message for the parser."""

    def command(self):
        query = " ".join(QUERY_ARGS)
        return (f"if command -v nvidia-smi >/dev/null 2>&1; then {query} 2>&1 || true; "
                f"else echo NVIDIA_SMI_MISSING; fi")

    def process(self, output):
        lines = [line for line in output if line.strip()]
        return None if lines == ["NVIDIA_SMI_MISSING"] else "\n".join(lines)


class PortOwners(FactBase):
    """PIDs of processes listening on a TCP port (any address): [(address, pid or None)]."""

    default = list

    def command(self, port: int):
        return StringCommand("ss", "-Htlnp", QuoteString(f"sport = :{int(port)}"), "|| true")

    def process(self, output):
        owners = []
        for line in output:
            parts = line.split()
            if len(parts) < 4:
                continue
            pid = None
            if "pid=" in line:
                try:
                    pid = int(line.split("pid=", 1)[1].split(",", 1)[0])
                except ValueError:
                    pid = None
            owners.append((parts[3], pid))
        return owners


class UnitInfo(FactBase):
    """systemd's view of a unit: ActiveState, SubState, MainPID, NRestarts, Result, LoadState."""

    def command(self, service: str):
        return StringCommand("systemctl", "show", "-p", "ActiveState", "-p", "SubState", "-p", "MainPID",
                             "-p", "NRestarts", "-p", "Result", "-p", "LoadState", "-p", "ExecMainStatus",
                             QuoteString(f"{service}.service"))

    def process(self, output):
        info = dict(line.split("=", 1) for line in output if "=" in line)
        for key in ("MainPID", "NRestarts", "ExecMainStatus"):
            if key in info and info[key].isdigit():
                info[key] = int(info[key])
        return info


class JsonFile(FactBase):
    """A JSON document on the host, or None when the file is missing."""

    def command(self, path: str):
        return StringCommand("cat", QuoteString(path), "2>/dev/null", "||", "true")

    def process(self, output):
        text = "\n".join(output).strip()
        return json.loads(text) if text else None


class Releases(FactBase):
    """Every release record under the store: a list of status documents, oldest first."""

    default = list

    def command(self, releases_dir: str):
        return (f"for f in {releases_dir}/[0-9]*/status.json; do "
                f"[ -f \"$f\" ] && {{ tr -d '\\n' < \"$f\"; echo; }}; done; true")

    def process(self, output):
        docs = [json.loads(line) for line in output if line.strip()]
        return sorted(docs, key=lambda d: d["release"])


class FreeDiskMib(FactBase):
    """Free MiB on the filesystem that holds `path` (or its nearest existing parent)."""

    def command(self, path: str):
        return (f"p={path}; while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done; "
                f"df -Pm \"$p\" | awk 'NR==2 {{print $4}}'")

    def process(self, output):
        return int(output[0]) if output and output[0].strip().isdigit() else 0


class HostBasics(FactBase):
    """OS id/version and the system python's version."""

    def command(self):
        return (". /etc/os-release; echo \"os=$ID $VERSION_ID\"; "
                "echo \"python=$(python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])' 2>/dev/null)\"")

    def process(self, output):
        return dict(line.split("=", 1) for line in output if "=" in line)
