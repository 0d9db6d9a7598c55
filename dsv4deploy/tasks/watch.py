"""The watch's step of a deploy and a rollback: once a release serves, install or update the
watch for it (its account, programs, settings with this release's gate figures and GPUs, units)
and start its timer; with `watch: {enabled: false}`, remove it. One command reads what is there,
one more writes only what differs (a re-deploy that changes nothing sends no write). The watch
never acts while this run holds the deploy lock: every interval until then is inconclusive.
"""

from __future__ import annotations

import json
import shlex

from pyinfra import host
from pyinfra.operations import python

from dsv4deploy.host.io import sh
from dsv4deploy.host.ops import inline_write
from dsv4deploy.host.release_store import ReleaseStore
from dsv4deploy.watch import decide, units as w

q = shlex.quote
GPU_QUERY = "nvidia-smi --query-gpu=index,uuid,pcie.link.gen.max,pcie.link.width.current --format=csv,noheader,nounits"
ACCOUNT = (f"getent passwd {w.USER} >/dev/null || useradd --system --user-group --no-create-home "
           f"--home-dir / --shell /usr/sbin/nologin --comment 'dsv4deploy watch' {w.USER}")


def settings_line(data: dict) -> str:
    """The watch's settings in one line, for the plan."""
    c = decide.settings(data.get("watch"))
    if not c["enabled"]:
        return "watch: disabled (removed from the host)"
    return (f"watch: every {c['interval_s']} s, acts after {c['failure_limit']} failed intervals; probe "
            f"{c['probe']['requests']}x{c['probe']['output_len']} tokens, slower than the gate by "
            f"{c['slower_than_gate']:.0%} fails; regression: {c['on_regression']}; metrics in {c['textfile_dir']}")


def parse_gpus(out: str, wanted: set[int]) -> list[dict]:
    gpus = []
    for line in out.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) == 4 and cols[0].isdigit() and int(cols[0]) in wanted:
            link = [int(c) if c.isdigit() else None for c in cols[2:4]]
            gpus.append({"index": int(cols[0]), "uuid": cols[1], "pcie": link if None not in link else None})
    return gpus


def desired(data: dict, layout, profile: str, release: int, gpus: list[dict], gate: dict | None) -> dict[str, bytes]:
    files = dict(w.programs())
    files[w.CONFIG] = w.config(data, layout, profile=profile, release=release, gpus=gpus, gate_report=gate).encode()
    files.update({p: t.encode() for p, t in w.units(data, layout).items()})
    return files


_MARK = "@@dsv4-watch@@"


def arm(store: ReleaseStore, data: dict | None = None, *, label: str = "watch", settled: bool = False) -> None:
    """After the run's last release step: the watch for what serves now (store.current()). DATA:
    the profile this run deploys, whose watch settings the plan shows. SETTLED: this run changes
    no release (a re-deploy with nothing to do), so the host is read now and the step is left out
    when the watch there is already this one (a no-op re-deploy reports no change)."""
    watch_block = None
    if data is not None:
        print(f"[{host.name}] {settings_line(data)}")
        watch_block = data.get("watch") or {}

    def run(state, host):  # noqa: pyinfra passes (state, host) by these names
        todo = _todo(store, watch_block, host)
        if todo is None:
            return True
        if todo == "disarm":
            sh(host, disarm_command())
            print(f"[{host.name}] watch: disabled and removed")
            return True
        rec, files, differ, textfile_dir = todo
        ok, out = sh(host, arm_command(files, differ, textfile_dir))
        if not ok:
            print(f"[{host.name}] warning: could not install the watch: {out.strip()[-300:]}")
            return False
        print(f"[{host.name}] watch: armed for release {rec['release']:04d} ({', '.join(p.rsplit('/', 1)[1] for p in differ) or 'enabled'})")
        return True

    if settled and _todo(store, watch_block, store.h) is None:
        return
    run.__name__ = f"watch_{label}"
    python.call(name="watch the live release: install or update it, start its timer", function=run)


def _todo(store: ReleaseStore, watch_block: dict | None, host):
    """What the watch on the host lacks, read in one command: None (nothing), "disarm", or
    (the live release's record, the watch's files, the paths that differ or an empty list when
    only its units are not enabled)."""
    rec = store.current()
    if rec is None:
        return None
    kept = store.target(rec)
    # the watch's settings are this run's profile's (they are not part of a release, so the
    # live release's kept profile may hold older ones); a rollback's are the restored one's
    data = dict(kept.data, watch=(watch_block if watch_block is not None else kept.data.get("watch")))
    layout = kept.layout
    paths = list(desired(data, layout, rec["profile"], rec["release"], [], None))
    textfile_dir = decide.settings(data.get("watch"))["textfile_dir"]
    folder = store.folder(rec.get("restores") or rec["release"])     # a rollback's gate is its original's
    read = (f"cat {folder}/gate/gate.json 2>/dev/null || cat {folder}/gate-replica-0/gate.json 2>/dev/null; "
            f"echo {_MARK}; {GPU_QUERY} 2>/dev/null; "
            f"echo {_MARK}; sha256sum {' '.join(q(p) for p in paths)} 2>/dev/null; echo {_MARK}; "
            f"getent passwd {w.USER} >/dev/null && echo account; {linked(textfile_dir)}; "
            f"systemctl is-enabled {w.SERVICE}.timer {w.ACT}.path 2>/dev/null; true")
    _, out = sh(host, read)
    parts = (out.split(_MARK) + ["", "", "", ""])[:4]
    try:
        gate = json.loads(parts[0]) if parts[0].strip() else None
    except ValueError:
        gate = None
    wanted = {i for t in w.targets(data, layout) for i in t["gpus"]}
    files = desired(data, layout, rec["profile"], rec["release"], parse_gpus(parts[1], wanted), gate)
    have = dict(reversed(line.split(None, 1)) for line in parts[2].splitlines() if len(line.split(None, 1)) == 2)
    enabled = parts[3].split().count("enabled") == 2 and "account" in parts[3] and "linked" in parts[3]
    if not decide.settings(data.get("watch"))["enabled"]:
        return "disarm" if have or "enabled" in parts[3] else None
    differ = [p for p, c in files.items() if have.get(p) != w.sha256(c)]
    return None if not differ and enabled else (rec, files, differ, textfile_dir)


def linked(textfile_dir: str) -> str:
    """Prints `linked` when node_exporter's TEXTFILE_DIR holds the link to the watch's metrics."""
    return f'[ "$(readlink {q(textfile_dir + "/" + w.PROM_NAME)})" = {w.PROM_FILE} ] && echo linked'


# Our link in the textfile folder the settings on the host name, if they name one (a profile that
# moves the folder, or disables the watch, leaves no link behind); a file of someone else's stays.
UNLINK_OLD = (f"{{ T=$(grep -o '\"textfile_dir\": *\"[^\"]*\"' {w.CONFIG} 2>/dev/null | cut -d'\"' -f4); "
              f"[ -n \"$T\" ] && [ \"$(readlink \"$T/{w.PROM_NAME}\")\" = {w.PROM_FILE} ] && "
              f"rm -f \"$T/{w.PROM_NAME}\"; true; }}")


def arm_command(files: dict[str, bytes], differ: list[str], textfile_dir: str) -> str:
    """Write the files in DIFFER (root's; programs and settings world-readable, no secret in them),
    check every program's sha256 on the host, link the metrics into node_exporter's TEXTFILE_DIR
    (made root's 0755 as Debian's node_exporter package makes it, when absent), reload, and start
    the timer and the path unit."""
    writes = [inline_write(p, files[p].decode(), mode="644") for p in differ]
    check = " && ".join(f"echo {q(w.sha256(c) + '  ' + p)} | sha256sum -c --status" for p, c in files.items())
    link = (f"install -d -m 0755 {q(textfile_dir)} && "
            f"ln -sfn {w.PROM_FILE} {q(textfile_dir + '/' + w.PROM_NAME)}")
    return " && ".join([ACCOUNT, f"mkdir -p {w.PROGRAM_DIR} && chmod 755 {w.PROGRAM_DIR}", UNLINK_OLD, *writes, check,
                        link, "systemctl daemon-reload",
                        f"systemctl enable -q {w.SERVICE}.timer {w.ACT}.path",
                        f"systemctl restart {w.SERVICE}.timer {w.ACT}.path"])


def disarm_command() -> str:
    unit_files = " ".join(q(p) for p in w.UNIT_PATHS)
    return (f"systemctl disable --now -q {w.SERVICE}.timer {w.ACT}.path 2>/dev/null; {UNLINK_OLD}; "
            f"rm -f {unit_files} {w.CONFIG}; rm -rf {w.PROGRAM_DIR}; systemctl daemon-reload")
