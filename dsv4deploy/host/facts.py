"""pyinfra facts the rollout reads from the GPU host before it changes anything.

Each fact is one cheap command whose output the pure core interprets; none of them change
the host. A deploy reads them all in one command (host/snapshot.py); each is tested alone
with fixtures of its output (tests/test_host_facts.py).
"""

from __future__ import annotations

import json
import re
import shlex
import stat
from pathlib import Path

from pyinfra.api import FactBase, QuoteString, StringCommand

from dsv4deploy.gateway import model as gateway
from dsv4deploy.sglang import patching
from dsv4deploy.release import records as releases
from dsv4deploy.weights import check as weights_check
from dsv4deploy.host import HOST_PYTHON
from dsv4deploy.preflight.gpus import QUERY_ARGS

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
    """systemd's view of a unit: ActiveState, SubState, MainPID, NRestarts, Result, LoadState,
    UnitFileState (enabled or not)."""

    default = dict

    def command(self, service: str):
        return StringCommand("systemctl", "show", "-p", "ActiveState", "-p", "SubState", "-p", "MainPID",
                             "-p", "NRestarts", "-p", "Result", "-p", "LoadState", "-p", "ExecMainStatus",
                             "-p", "UnitFileState", QuoteString(f"{service}.service"))

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


class GatewayWorkers(FactBase):
    """The workers a replica set's smg gateway lists (GET /workers): [{url, status, healthy}], or
    None when it does not answer. The API key goes to curl on stdin, read from its file by the
    shell's own printf: never an argument."""

    def command(self, url: str, key_file: str | None = None, fallback_key_file: str | None = None):
        """KEY_FILE: the control-plane key's; FALLBACK_KEY_FILE: the key to use while KEY_FILE is
        absent (a gateway started before the control-plane key existed takes the inference key)."""
        q = shlex.quote
        if not key_file:
            return f"curl -s -m 5 {q(url + '/workers')} || true"
        pick = f"f={q(key_file)}; " + (f"[ -s \"$f\" ] || f={q(fallback_key_file)}; " if fallback_key_file else "")
        return (f"{pick}{{ [ -s \"$f\" ] && printf 'Authorization: Bearer %s\\n' \"$(cat \"$f\")\"; }} | "
                f"curl -s -m 5 -H @- {q(url + '/workers')} || true")

    def process(self, output):
        try:
            workers = gateway.parse_workers("\n".join(output).encode())
        except gateway.GatewayError:
            return None
        return [{"url": w.url, "status": w.status, "healthy": w.healthy} for w in workers]


def pid_and_files_command(unit: str, files: list[str]) -> str:
    """Print UNIT's MainPID and one sha256 of FILES together (GatewayStale's marker line)."""
    q = shlex.quote
    return (f"printf '%s %s\\n' \"$(systemctl show -p MainPID --value {q(unit)})\" "
            f"\"$(cat {' '.join(q(f) for f in files)} 2>/dev/null | sha256sum | cut -d' ' -f1)\"")


class GatewayStale(FactBase):
    """Whether a replica set's running gateway was started from other gateway files than those in
    place now (its unit, its launcher): a run cut off between writing them and the gateway's
    restart, or a restore that put older ones back. The deploy writes MARKER when it (re)starts
    the gateway: its MainPID then and the files' sha256. No marker (the host booted: systemd
    started it from the files in place), or another MainPID (systemd or a person restarted it
    since), says nothing: False."""

    default = bool

    def command(self, unit: str, files: list[str], marker: str):
        return f"cat {shlex.quote(marker)} 2>/dev/null || exit 0; {pid_and_files_command(unit, files)}"

    def process(self, output):
        lines = [line.split() for line in output if line.strip()]
        if len(lines) != 2 or any(len(parts) != 2 for parts in lines):
            return False
        (pid_then, files_then), (pid_now, files_now) = lines
        return pid_then == pid_now and pid_now != "0" and files_then != files_now


class Releases(FactBase):
    """Every release record under the store: a list of status documents, oldest first. Strict
    (host/snapshot.py): a damaged record stops the run instead of reading as no record."""

    default = list
    strict = True

    def command(self, releases_dir: str):
        # one awk for every record, each on one line (a process per record cost 1.5 ms each on the twin)
        # (an empty record prints nothing through awk: the shell names it, with no process of its own)
        return f"{_every_record(releases_dir)}; {_RECORDS_AWK} || {_AWK_FAILED}"

    def process(self, output):
        # one line per record that holds anything: a blank line is a record of blank lines
        docs = []
        for line in output:
            if line.startswith("empty "):
                raise ValueError(f"a release record on the host is empty or not a file: {line[6:126]}: repair or remove that "
                                 "release's folder, then run again")
            if line.startswith(UNREADABLE):
                raise ValueError(f"the release records on the host could not all be read ({line[len(UNREADABLE):126]}): "
                                 "a folder under the releases holds something that is not a file; repair it, then run again")
            try:
                doc = json.loads(line)
                if not isinstance(doc["release"], int) or isinstance(doc["release"], bool):
                    raise TypeError("release is not a number")
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"a release record on the host (a releases/NNNN/status.json) is damaged: "
                                 f"{line[:120]!r}: repair that file, then run again") from None
            docs.append(doc)
        return sorted(docs, key=lambda d: d["release"])


_RECORDS_AWK = "awk 'FNR == 1 && NR > 1 { print \"\" } { printf \"%s\", $0 } END { if (NR) print \"\" }' \"$@\""
UNREADABLE = "unreadable: "
# awk stops at a file it cannot read (a folder where a record or profile.json should be), having
# printed part of the records: that must stop the run, not read as fewer records
_AWK_FAILED = f"echo \"{UNREADABLE}awk exited $?\""


def _every_record(releases_dir: str) -> str:
    """Shell: every status.json under RELEASES_DIR as "$@" (exit 0: none), each damaged one named."""
    return (f"set -- {releases_dir}/[0-9]*/status.json; {{ [ -e \"$1\" ] || [ -L \"$1\" ]; }} || exit 0; "
            "for f; do { [ -f \"$f\" ] && [ -s \"$f\" ]; } || echo \"empty $f\"; done")


RECENT = 2 * releases.KEEP


class RecentReleases(Releases):
    """The records a deploy decides from, not the whole history: the newest RECENT by number
    (the next number, what pruning keeps), every release whose files are still kept (what a
    rollback can restore), and every one deployed, pending or unverified, however old (what
    serves, what a cut-off run left). What it leaves out was pruned and ended: its files are gone
    and nothing a deploy decides reads it. A host's history grows by a record per change, which
    the read would print in full every run (0.3 MB after 500 on the twin); `make history` reads
    every record (Releases)."""

    def command(self, releases_dir: str):
        # one awk reads every record once and prints, each on one line, those it keeps: a record
        # is held until its file ends (a status line may come last), then printed or dropped
        return (f"{_every_record(releases_dir)}; "
                f"newest=$(ls -1 {shlex.quote(releases_dir)} | grep -xE '[0-9]+' | sort -n | tail -n {RECENT}); "
                "awk -v newest=\"$newest\" '"
                "function done() { if (FILENAME0 != \"\" && (want || active)) print buf } "
                "BEGIN { n = split(newest, a, \"\\n\"); for (i = 1; i <= n; i++) keep[a[i]] = 1 } "
                "FNR == 1 { done(); FILENAME0 = FILENAME; buf = \"\"; active = 0; dir = FILENAME; "
                "sub(/\\/status\\.json$/, \"\", dir); base = dir; sub(/.*\\//, \"\", base); "
                "want = (base in keep) || ((getline line < (dir \"/profile.json\")) > 0); close(dir \"/profile.json\") } "
                "/\"status\": *\"(deployed|pending|unverified)\"/ { active = 1 } "
                "{ buf = buf $0 } "
                f"END {{ done() }}' \"$@\" || {_AWK_FAILED}")


class DiskRoom(FactBase):
    """Each path's file system (stat's device number and mount point, of its nearest existing
    parent) and the bytes free there, and the bytes already under PRESENT (du: complete and
    partial files alike): {"rooms": {path: {"device", "mount", "free_bytes"}}, "present_bytes": int}.
    A path whose `df` printed no number is left out (preflight says so, not "a full disk")."""

    default = dict

    def command(self, paths: list[str], present: str):
        q = shlex.quote
        rooms = "; ".join(f"p={q(p)}; while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done; "
                          f"printf 'room\\t%s\\t%s\\t%s\\n' {q(p)} \"$(df -kP \"$p\" | awk 'NR==2 {{print $4}}')\" "
                          "\"$(stat -c '%d %m' \"$p\")\"" for p in paths)
        return (f"{rooms}; [ -d {q(present)} ] && printf 'present\\t%s\\n' \"$(du -sb {q(present)} | cut -f1)\"; "
                "true")

    def process(self, output):
        found: dict = {"rooms": {}, "present_bytes": 0}
        for line in output:
            fields = line.split("\t")
            device, _, mount = fields[-1].partition(" ")
            if fields[0] == "room" and len(fields) == 4 and fields[2].isdigit() and device.isdigit() and mount:
                found["rooms"][fields[1]] = {"free_bytes": int(fields[2]) * 1024, "device": device, "mount": mount}
            elif fields[0] == "present" and len(fields) == 2 and fields[1].isdigit():
                found["present_bytes"] = int(fields[1])
        return found


class HostBasics(FactBase):
    """OS id/version and the system python's version."""

    def command(self):
        # `python3 -V` answers without starting the interpreter's runtime (1 ms against 10-20)
        return ". /etc/os-release; echo \"os=$ID $VERSION_ID\"; echo \"python=$(python3 -V 2>/dev/null)\""

    def process(self, output):
        found = dict(line.split("=", 1) for line in output if "=" in line)
        if "python" in found:       # "Python 3.11.2" -> "3.11"
            version = found["python"].removeprefix("Python ").strip()
            found["python"] = ".".join(version.split(".")[:2])
        return found


class FileStates(FactBase):
    """Mode, owner, group, type and sha256 (regular files) of paths that exist:
    {path: {"mode": "644", "user": "root", "group": "root", "type": "file"|"dir"|..., "sha256": hex|None}}."""

    default = dict

    def command(self, paths: list[str]):
        # a `*` in a path is a glob (e.g. the venv's lib/python3*/site-packages): the shell
        # expands it, and the entry is keyed by the path it found. One stat and one sha256sum for
        # all the paths, not three programs per path: the read's other facts share the host's CPUs.
        quoted = " ".join("*".join(shlex.quote(part) if part else "" for part in p.split("*")) for p in paths)
        return (f"set --; for p in {quoted}; do {{ [ -e \"$p\" ] || [ -L \"$p\" ]; }} && set -- \"$@\" \"$p\"; done; "
                "[ $# -gt 0 ] || exit 0; stat --printf '%f\\t%a %U %G\\t%n\\n' -- \"$@\" 2>/dev/null; "
                "for p; do shift; [ -f \"$p\" ] && [ ! -L \"$p\" ] && set -- \"$@\" \"$p\"; done; "
                "[ $# -gt 0 ] && sha256sum -- \"$@\" 2>/dev/null; true")

    def process(self, output):
        # stat's lines: raw mode (hex), "mode user group", path, between tabs; sha256sum's: the
        # digest, two spaces, the path (a name sha256sum had to escape starts with a backslash: its
        # digest is left out, so the file reads as differing and is written again)
        found, digests = {}, {}
        for line in output:
            stat_line = _STAT_LINE.fullmatch(line)      # not "has a tab": sha256sum leaves a tab in a name as is
            if stat_line:
                raw, mode, user, group, path = stat_line.groups()
                found[path] = {"type": _file_type(int(raw, 16)), "mode": mode, "user": user, "group": group,
                               "sha256": None}
            else:
                digest, sep, path = line.partition("  ")
                if sep and len(digest) == 64 and not digest.startswith("\\"):
                    digests[path] = digest
        for path, entry in found.items():
            if entry["type"] == "file":
                entry["sha256"] = digests.get(path)
        return found


_STAT_LINE = re.compile(r"([0-9a-f]+)\t([0-7]+) (\S+) (\S+)\t(.*)", re.S)


def _file_type(raw_mode: int) -> str:
    for test, name in ((stat.S_ISLNK, "link"), (stat.S_ISDIR, "dir"), (stat.S_ISREG, "file")):
        if test(raw_mode):
            return name
    return "other"


class DebPackages(FactBase):
    """Which of the named Debian packages are installed: {name: True|False}."""

    default = dict

    def command(self, names: list[str]):
        return ("dpkg-query -W -f='${Package}\\t${db:Status-Abbrev}\\n' "
                + " ".join(shlex.quote(n) for n in names) + " 2>/dev/null; true")

    def process(self, output):
        found = {}
        for line in output:
            name, _, status = line.partition("\t")
            found[name.split(":")[0]] = status.startswith("ii")
        return found


class Accounts(FactBase):
    """The named users and groups that exist, who the deploy logs in as and where system uids end:
    {"users": {name: {"uid", "gid", "comment", "home", "shell"}}, "groups": {name: gid},
    "ssh_user": the login (SUDO_USER under sudo), "sys_uid_max": login.defs' SYS_UID_MAX or None,
    "uid": who the read ran as (0 under sudo), "sudo_usable": whether `sudo -n true` works (asked when not root)}.
    host/accounts.py judges whether the deploy may make or keep each account."""

    default = dict

    def command(self, users: list[str], groups: list[str]):
        u = " ".join(shlex.quote(n) for n in users)
        g = " ".join(shlex.quote(n) for n in groups)
        return (f"getent passwd {u} | sed 's/^/user:/'; getent group {g} | sed 's/^/group:/'; "
                "printf 'ssh_user:%s\\n' \"${SUDO_USER:-$(id -un)}\"; printf 'uid:%s\\n' \"$(id -u)\"; "
                "[ \"$(id -u)\" = 0 ] || "
                "printf 'sudo:%s\\n' \"$(sudo -n true </dev/null >/dev/null 2>&1 && echo yes || echo no)\"; "
                "sed -n 's/^[[:space:]]*SYS_UID_MAX[[:space:]]\\{1,\\}\\([0-9]\\{1,\\}\\).*/sys_uid_max:\\1/p' "
                "/etc/login.defs 2>/dev/null; true")

    def process(self, output):
        found: dict = {"users": {}, "groups": {}, "sys_uid_max": None}
        for line in output:
            kind, _, entry = line.partition(":")
            fields = entry.split(":")
            if kind == "user" and len(fields) >= 7:
                found["users"][fields[0]] = {"uid": int(fields[2]), "gid": int(fields[3]), "comment": fields[4],
                                             "home": fields[5], "shell": fields[6]}
            elif kind == "group" and len(fields) >= 3:
                found["groups"][fields[0]] = int(fields[2])
            elif kind == "ssh_user" and entry:
                found["ssh_user"] = entry
            elif kind == "sys_uid_max" and entry.isdigit():
                found["sys_uid_max"] = int(entry)
            elif kind == "uid" and entry.isdigit():
                found["uid"] = int(entry)
            elif kind == "sudo":
                found["sudo_usable"] = entry == "yes"
        return found


class ApiKeyState(FactBase):
    """Whether the inference key file exists, whether SGLang's --config credential holds it (and
    the admin key of ADMIN_FILE, when given), and which of the OTHER key files exist. Prints only
    yes/no: no key leaves the host."""

    default = dict

    def command(self, key_file: str, config_file: str, admin_file: str | None = None, others=()):
        from dsv4deploy.host.ops import sglang_config_command

        k, c = shlex.quote(key_file), shlex.quote(config_file)
        present = "".join(f"[ -s {shlex.quote(f)} ] && echo {shlex.quote('file:' + f)}=yes; " for f in others)
        return (f"k=$(cat {k} 2>/dev/null); "
                f"[ -n \"$k\" ] && echo key=yes || echo key=no; "
                f"[ -n \"$k\" ] && [ \"$(cat {c} 2>/dev/null)\" = \"$({sglang_config_command(key_file, admin_file)})\" ] "
                f"&& echo config=yes || echo config=no; {present}true")

    def process(self, output):
        found = dict(line.split("=", 1) for line in output if "=" in line)
        return {"key": found.get("key") == "yes", "config": found.get("config") == "yes",
                "present": sorted(k[5:] for k, v in found.items() if k.startswith("file:") and v == "yes")}


class PatchesApplied(FactBase):
    """For each patch file: is it on the host and does its reverse dry-run succeed in the venv's
    site-packages? {patch_file: True|False}. (dsv4deploy.sglang.patching.state_command)"""

    default = dict

    def command(self, venv: str, patches: list[tuple[str, int]]):
        checks = "; ".join(f"printf '%s\\t' {shlex.quote(f)}; "
                           f"( {patching.state_command('$site', f, s)} ) || echo {patching.MISSING}"
                           .replace(shlex.quote('$site'), '"$site"') for f, s in patches)
        return (f"site=$(ls -d {shlex.quote(venv)}/lib/python3*/site-packages 2>/dev/null | head -n1); "
                f"[ -n \"$site\" ] || site=/nonexistent; {checks}")

    def process(self, output):
        found = {}
        for line in output:
            path, _, state = line.partition("\t")
            found[path] = patching.parse_state([state])
        return found


# --- checkpoints -------------------------------------------------------------------------------
# Runs on the host with its system python3: prints {"complete": bool, "problems": [...]}.
CHECK = r'''
import json, os, sys
d, expected = sys.argv[1], json.loads(sys.argv[2] or "{}")
out = {"complete": False, "problems": []}
index = os.path.join(d, "model.safetensors.index.json")
marker = os.path.join(d, ".dsv4deploy-complete.json")
if not os.path.isfile(index):
    out["problems"].append("model.safetensors.index.json missing")
else:
    try:
        shards = sorted(set(json.load(open(index))["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        shards = []
        out["problems"].append(f"model.safetensors.index.json is damaged ({type(exc).__name__}): download it again")
    want = dict(expected)
    if not want and os.path.isfile(marker):
        try:
            want = dict(json.load(open(marker)).get("sizes", {}))
        except (OSError, ValueError, TypeError, AttributeError):
            want = {}
    for s in shards:
        p = os.path.join(d, s)
        if not os.path.isfile(p):
            out["problems"].append(f"{s} missing")
        elif s in want and os.path.getsize(p) != want[s]:
            out["problems"].append(f"{s} has {os.path.getsize(p)} bytes, expected {want[s]}")
        elif os.path.getsize(p) == 0:
            out["problems"].append(f"{s} is empty")
    out["shards"] = {s: os.path.getsize(os.path.join(d, s)) for s in shards if os.path.isfile(os.path.join(d, s))}
    out["complete"] = not out["problems"]
    out["marker"] = os.path.isfile(marker)
print(json.dumps(out))
'''


class Checkpoint(FactBase):
    """Completeness of a checkpoint folder on the host."""

    def command(self, path: str, expected: str = ""):
        return StringCommand(HOST_PYTHON, "-c", shlex.quote(CHECK), shlex.quote(path),
                             shlex.quote(expected or "{}"))

    def process(self, output):
        return _verdict(output)


def _verdict(output) -> dict:
    """A checker's verdict: its last line's JSON, or (python3 itself failed) its last lines as problems."""
    try:
        return json.loads(output[-1])
    except (IndexError, ValueError):
        return {"complete": False, "problems": list(output)[-3:]}


CHECKER = Path(weights_check.__file__).read_text()


def checker_command(path: str, expected: str, *flags: str) -> str:
    q = shlex.quote
    return f"printf '%s' {q(expected)} | {HOST_PYTHON} -c {q(CHECKER)} {q(path)} - {' '.join(flags)}".rstrip()


class VerifiedCheckpoint(FactBase):
    """weights_check.py's verdict on the host's folder by size and marker only: it hashes nothing
    (the read has a time cap; a file the marker does not vouch for is `unverified`, for the
    weights step's verify, which hashes it)."""

    def command(self, path: str, expected: str):
        return f"{checker_command(path, expected, '--no-hash')} 2>&1 || true"

    def process(self, output):
        return _verdict(output)
