"""The rollout's operations, decided from the host's state read once (host/state.py).

Each is a pyinfra operation (a generator of commands) that compares what the profile asks
with what the snapshot says and yields nothing when they agree: a re-deploy that changes
nothing sends no command for them. Their commands are idempotent, so a snapshot that went
stale within the run (a directory an earlier step made) costs a repeated `mkdir -p`, never
a wrong result. Tested with arguments and snapshots in, commands out (tests/test_host_ops.py).
"""

from __future__ import annotations

import hashlib
import json
import shlex
from io import BytesIO

from pyinfra import host, logger
from pyinfra.api import DeployError, FunctionCommand, StringCommand, operation

from dsv4deploy.sglang import patching
from dsv4deploy.host import installer, io
from dsv4deploy.host.io import PrivateUpload

q = shlex.quote


def _same(state: dict | None, mode: str, user: str, group: str) -> bool:
    return bool(state) and (state["mode"], state["user"], state["group"]) == (mode.lstrip("0") or "0", user, group)


@operation()
def packages(names: list[str], installed: dict[str, bool]):
    """Debian packages present (apt-get install of the missing ones, after one update)."""
    missing = [n for n in names if not installed.get(n)]
    if not missing:
        host.noop(f"{', '.join(names)} installed")
        return
    yield StringCommand(f"apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "
                        f"--no-install-recommends {' '.join(q(n) for n in missing)}")


@operation()
def system_account(user: str, home: str, accounts: dict, comment: str, shell: str = "/usr/sbin/nologin"):
    """A system group and user of the same name, no login, no home made, COMMENT (the mark of an
    account the deploy made: host/accounts.py; preflight has refused any other existing one)."""
    have_user = (accounts.get("users") or {}).get(user)
    have_group = user in (accounts.get("groups") or {})
    if have_user and have_group and (have_user["home"], have_user["shell"], have_user.get("comment")) == \
            (home, shell, comment):
        host.noop(f"user {user} present")
        return
    if not have_group:
        yield StringCommand(f"getent group {q(user)} >/dev/null || groupadd --system {q(user)}")
    if not have_user:
        yield StringCommand(f"getent passwd {q(user)} >/dev/null || useradd --system --gid {q(user)} "
                            f"--comment {q(comment)} --home-dir {q(home)} --no-create-home --shell {q(shell)} {q(user)}")
    else:
        yield StringCommand(f"usermod --comment {q(comment)} --home {q(home)} --shell {q(shell)} {q(user)}")


@operation()
def directory(path: str, state: dict | None, user: str = "root", group: str = "root", mode: str = "755"):
    """A directory with this owner and mode."""
    command = _directory_command(path, state, user, group, mode)
    if not command:
        host.noop(f"{path} present")
        return
    yield StringCommand(command)


@operation()
def directories(items: list[tuple[str, str, str, str, dict | None]]):
    """Directories (path, user, group, mode, state), parents first: those that are missing or
    differ are made or fixed in one command (a fresh host: one round trip, not one per folder)."""
    commands = [c for c in (_directory_command(p, state, user, group, mode) for p, user, group, mode, state in items) if c]
    if not commands:
        host.noop(f"{', '.join(item[0] for item in items)} present")
        return
    yield StringCommand(" && ".join(commands))


def _directory_command(path: str, state: dict | None, user: str, group: str, mode: str) -> str | None:
    if state and state["type"] == "dir" and _same(state, mode, user, group):
        return None
    return f"mkdir -p {q(path)} && chown {q(user)}:{q(group)} {q(path)} && chmod {mode} {q(path)}"


def make_parent(dest: str) -> str:
    """mkdir -p of DEST's folder, readable by all (a venv's folder made for its lock file must let the
    service user reach its python); folders that hold secrets are made 0700 by their own step."""
    return f"umask 022; mkdir -p {q(dest.rsplit('/', 1)[0] or '/')}"


INLINE_MAX = 32 << 10   # a text file this small travels inside its one command (not a secret)


def inline_write(dest: str, text: str, user: str = "root", group: str = "root", mode: str = "644") -> str:
    """One command that writes TEXT to DEST atomically (temp file, owner, mode, rename). For files
    that hold no secret: the content is in the command line, which `ps` on the host can show."""
    tmp = f"{dest}.dsv4deploy-tmp"
    return (f"{make_parent(dest)} && umask 077 && printf '%s' {q(text)} > {q(tmp)} && "
            f"chown {q(user)}:{q(group)} {q(tmp)} && chmod {mode} {q(tmp)} && mv -f {q(tmp)} {q(dest)}")


def _file_commands(dest: str, content: bytes, state: dict | None, user: str, group: str, mode: str,
                   secret: bool = False) -> list:
    """What `file` sends for one file: nothing (up to date), one command (owner and mode only, or a
    small text file that is not SECRET written inline) or a private temp file, its upload, the move."""
    if state and state["type"] == "file" and state["sha256"] == hashlib.sha256(content).hexdigest():
        return [] if _same(state, mode, user, group) else [f"chown {q(user)}:{q(group)} {q(dest)} && chmod {mode} {q(dest)}"]
    if not secret and len(content) <= INLINE_MAX and b"\0" not in content:
        try:
            return [inline_write(dest, content.decode(), user, group, mode)]
        except UnicodeDecodeError:
            pass
    return upload_commands(BytesIO(content), dest, user, group, mode)


def upload_commands(src, dest: str, user: str, group: str, mode: str) -> list:
    """SRC (bytes in memory, or a local path: streamed by SFTP, never read whole) to DEST: an empty
    temp file beside it made with umask 077, the upload into it through the private staging path
    (io.PrivateUpload, never pyinfra's /tmp/pyinfra-<sha1>), then owner, mode and the move."""
    tmp = f"{dest}.dsv4deploy-tmp"
    return [f"{make_parent(dest)} && umask 077 && : > {q(tmp)}", PrivateUpload(src, tmp),
            f"chown {q(user)}:{q(group)} {q(tmp)} && chmod {mode} {q(tmp)} && mv -f {q(tmp)} {q(dest)}"]


def _yield(commands: list):
    for c in commands:
        yield c if isinstance(c, PrivateUpload) else StringCommand(c)


@operation()
def file(dest: str, content: bytes, state: dict | None, user: str = "root", group: str = "root",
         mode: str = "644", secret: bool = False):
    """A file with exactly CONTENT, owner and mode, written when its sha256 differs through a temp
    file made with umask 077, then moved into place. A small text file that is not SECRET goes in
    one command; anything else is uploaded (never on a command line)."""
    commands = _file_commands(dest, content, state, user, group, mode, secret)
    if not commands:
        host.noop(f"{dest} up to date")
        return
    yield from _yield(commands)


@operation()
def files(items: list[tuple[str, bytes, dict | None]], user: str = "root", group: str = "root", mode: str = "644",
          before: str = "", after: str = "", done=None):
    """Several files that hold no secret (a unit and the files it reads), each as `file` writes
    it; those that take one command each all go in one: one round trip, however many change
    (more only past COMMAND_MAX). BEFORE and AFTER ride in that command, first and last (the
    switch: a release's pending record, then daemon-reload and the restart: restart_command),
    each only if what precedes it succeeded; a file too large for it is uploaded between.
    DONE(state, host): called once every command of the operation succeeded (the run learns its
    pending record is written)."""
    each = [_file_commands(dest, content, state, user, group, mode) for dest, content, state in items]
    if not (any(each) or before or after):
        host.noop(f"{', '.join(d for d, _, _ in items)} up to date")
        return
    single = [c[0] for c in each if len(c) == 1]
    uploaded = [commands for commands in each if len(commands) > 1]
    first = ([before] if before else []) + single + ([after] if after and not uploaded else [])
    for command in _chained(first):
        yield StringCommand(command)
    for commands in uploaded:
        yield from _yield(commands)
    if after and uploaded:
        yield StringCommand(after)
    if done is not None:
        yield FunctionCommand(done, (), {})


@operation(is_idempotent=False)
def tree(folder: str, dest: str, sizes: dict[str, int], user: str, group: str, mode: str = "644"):
    """The files FOLDER/<rel> of this machine (SIZES: rel -> size) in DEST/<rel> on the host: each
    one the host lacks as a regular file of that size is uploaded as `file` uploads (streamed, through
    the private staging path). What the host holds is read when the operation runs, not planned: an
    earlier step of the run removes the copies whose content was wrong (a verify), and those must
    come again. Nothing is deleted; folders are made as needed."""
    yield FunctionCommand(_upload_tree, (folder, dest, sizes, (user, group, mode)), {})


def tree_sizes_command(dest: str) -> str:
    """The size and path (under DEST) of every regular file in DEST, one per line (none: no DEST)."""
    return f"find {q(dest)} -type f -printf '%s\\t%P\\n' 2>/dev/null || true"


def tree_missing(sizes: dict[str, int], listing: str) -> list[str]:
    """The files of SIZES that LISTING (tree_sizes_command's output) lacks at their size, in order."""
    have = {}
    for line in listing.splitlines():
        size, _, rel = line.partition("\t")
        if size.isdigit():
            have[rel] = int(size)
    return [rel for rel in sorted(sizes) if have.get(rel) != sizes[rel]]


def _upload_tree(state, host, folder: str, dest: str, sizes: dict[str, int], owner: tuple[str, str, str]) -> bool:
    """Upload what the host lacks (tree); OWNER is (user, group, mode) of every file it writes."""
    ok, listing = io.sh(host, tree_sizes_command(dest))
    if not ok:
        logger.error(f"{host.print_prefix}cannot list {dest} on the host")
        return False
    missing = tree_missing(sizes, listing)
    for n, rel in enumerate(missing, 1):
        for command in upload_commands(f"{folder}/{rel}", f"{dest}/{rel}", *owner):
            try:
                done = (io.put(host, command.src, command.dest) if isinstance(command, PrivateUpload)
                        else io.run(host, command)[0])
            except (OSError, DeployError) as exc:     # a source file gone, SFTP cut, no staging folder
                done, why = False, f": {exc}"
            else:
                why = ""
            if not done:
                logger.error(f"{host.print_prefix}cannot upload {folder}/{rel} to {dest}/{rel}{why}")
                return False
        logger.info(f"{host.print_prefix}uploaded {n}/{len(missing)}: {rel} ({sizes[rel]:,} bytes)")
    return True


COMMAND_MAX = 96 << 10   # Linux takes one argument (the `sh -c` string sshd hands the shell) up to 128 KiB


def _chained(commands: list[str]) -> list[str]:
    """COMMANDS joined with `&&` (each grouped), as few as COMMAND_MAX allows, in order: pyinfra
    stops at a command that fails, so a later one runs only if every earlier one succeeded."""
    out: list[str] = []
    for c in (f"{{ {c}; }}" for c in commands):
        if out and len(out[-1]) + len(c) + 4 <= COMMAND_MAX:
            out[-1] = f"{out[-1]} && {c}"
        else:
            out.append(c)
    return out


@operation()
def bundle(archive: bytes, dest: str, marker_state: dict | None):
    """A tree of files shipped as one tar archive with one hash: unpacked afresh into DEST when
    the hash in DEST/.bundle-sha256 differs (files the archive no longer has go with it)."""
    digest = hashlib.sha256(archive).hexdigest()
    marker = f"{dest}/.bundle-sha256"
    if marker_state and marker_state.get("sha256") == hashlib.sha256(f"{digest}\n".encode()).hexdigest():
        host.noop(f"{dest} holds bundle {digest[:12]}")
        return
    tmp = f"{dest}.tar.gz.dsv4deploy-tmp"
    yield StringCommand(f"umask 022; mkdir -p {q(dest.rsplit('/', 1)[0])} && : > {q(tmp)}")
    yield PrivateUpload(BytesIO(archive), tmp)
    yield StringCommand(f"umask 022; rm -rf {q(dest)}.new && mkdir -p {q(dest)}.new && "
                        f"tar -xzf {q(tmp)} -C {q(dest)}.new --no-same-owner && "
                        f"printf '%s\\n' {digest} > {q(dest)}.new/.bundle-sha256 && rm -rf {q(dest)} && "
                        f"mv {q(dest)}.new {q(dest)} && rm -f {q(tmp)}")


@operation()
def patch_applied(directory: str, patch_file: str, applied: bool, strip: int = 1, sha256: str | None = None):
    """Apply a patch once, all or nothing (dsv4deploy.sglang.patching.apply_command): sha256 check,
    forward dry-run, apply, reverse dry-run. Already in: no change. A patch that does not apply
    fails the operation before any file is written."""
    if applied:
        host.noop(f"{patch_file} already applied")
        return
    yield StringCommand(patching.apply_command(directory, patch_file, strip, sha256=sha256))


@operation()
def api_key(key_file: str, config_file: str, state: dict, legacy_env: str, admin_file: str | None = None):
    """Generate the inference key on the host once (it never leaves it: not in argv, the unit, the
    environment or any log) and write SGLang's --config YAML for it and for the admin key in
    ADMIN_FILE (generated_key makes it first; None: this SGLang has none), both 0600 root; the
    unit hands the YAML to the server as a systemd credential. A key from an older layout is kept."""
    if state.get("key") and state.get("config"):
        host.noop("API key present")
        return
    k, c, old = q(key_file), q(config_file), q(legacy_env)
    if not state.get("key"):
        yield StringCommand(
            f"umask 077; k=$(sed -n 's/^SGLANG_API_KEY=//p' {old} 2>/dev/null | tail -n1); "
            f"[ -n \"$k\" ] || k=$(od -An -N24 -tx1 /dev/urandom | tr -d ' \\n'); "
            f"printf '%s\\n' \"$k\" > {k}.tmp && mv {k}.tmp {k}")
    yield StringCommand(f"umask 077; {sglang_config_command(key_file, admin_file)} > {c}.tmp && mv {c}.tmp {c}")


def sglang_config_command(key_file: str, admin_file: str | None) -> str:
    """A printf of SGLang's --config YAML with the keys read from their files by the shell (the
    fact ApiKeyState compares the file with the same output)."""
    if admin_file is None:
        return f"printf 'api-key: \"%s\"\\n' \"$(cat {q(key_file)})\""
    return (f"printf 'api-key: \"%s\"\\nadmin-api-key: \"%s\"\\n' \"$(cat {q(key_file)})\" "
            f"\"$(cat {q(admin_file)})\"")


@operation()
def generated_key(key_file: str, present: bool):
    """A key of its own (24 random bytes, hex, one line, 0600 root), generated on the host once:
    SGLang's admin key, the gateway's control-plane key. Rotating one (removing its file, then a
    deploy) leaves every other key as it is."""
    if present:
        host.noop(f"{key_file} present")
        return
    k = q(key_file)
    yield StringCommand(f"umask 077; od -An -N24 -tx1 /dev/urandom | tr -d ' \\n' > {k}.tmp && "
                        f"echo >> {k}.tmp && mv {k}.tmp {k}")


@operation()
def unit_running(unit: str, info: dict):
    """The unit started and enabled (after a restart of a running unit this changes nothing)."""
    active = info.get("ActiveState") == "active"
    enabled = info.get("UnitFileState") == "enabled"
    if active and enabled:
        host.noop(f"{unit} active and enabled")
        return
    if not active:
        yield StringCommand(f"systemctl reset-failed {q(unit)} || true")
    yield StringCommand(f"systemctl enable {'--now ' if not active else ''}{q(unit)}")


def restart_command(unit: str, first: str = "") -> str:
    """daemon-reload, a fresh start-limit counter, restart (files' AFTER, when there is a reason).
    FIRST: a command to run before (stopping a replica set that holds the port)."""
    return (f"{first}systemctl daemon-reload && {{ systemctl reset-failed {q(unit)} || true; }} && "
            f"systemctl restart {q(unit)}")


def stop_set_units(service: str) -> str:
    """A command prefix that stops and disables a replica set of SERVICE, if one runs (the single
    server takes its port and GPUs back): the switch's (restart_command's FIRST) and a restore's."""
    return (f"systemctl disable --now $(systemctl list-units --all --plain --no-legend --type=service "
            f"'{service}@*' '{service}-gateway.service' | cut -d' ' -f1) >/dev/null 2>&1; ")


@operation()
def uv_tool(requirements: bytes, program: bytes, requirements_state: dict | None, program_state: dict | None,
            installed_state: dict | None):
    """The host's installer (host/installer.py): its pinned requirements and uvpip.py as files, and
    uv itself installed by the host's pip with --require-hashes when what is installed is not what
    the requirements pin."""
    commands = _file_commands(installer.REQUIREMENTS, requirements, requirements_state, "root", "root", "644")
    commands += _file_commands(installer.PROGRAM, program, program_state, "root", "root", "644")
    if not (installed_state and installed_state.get("sha256") == hashlib.sha256(requirements).hexdigest()):
        commands += installer.bootstrap_commands()
    if not commands:
        host.noop(f"uv in {installer.TOOL}")
        return
    yield from _yield(commands)


@operation()
def venv(path: str, marker: dict, marker_file: str, marker_state: dict | None, exists: bool,
         freeze_file: str | None = None):
    """A venv that holds exactly MARKER's installs: made and filled by uv when its marker file
    says otherwise; then its `pip freeze` (each release keeps a copy) and, last, the marker, so
    an interrupted install is redone."""
    if exists and marker_state == marker:
        host.noop(f"{path} holds what the profile pins")
        return
    if not exists:
        yield StringCommand(installer.venv_command(path))
    yield StringCommand(f"rm -f {q(marker_file)}" + (f" {q(freeze_file)}" if freeze_file else ""))
    for command in marker["installs"]:
        yield StringCommand(command)
    if freeze_file:
        yield StringCommand(f"{installer.freeze_command(path)} > {q(freeze_file)}")
    yield StringCommand(f"printf '%s\\n' {q(json.dumps(marker, sort_keys=True))} > {q(marker_file)}")
