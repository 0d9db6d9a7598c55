"""The release store on the host (/var/lib/dsv4deploy/releases/NNNN/) and the deploy lock next
to it, as one object: every read and write of a record, a release's folder, its kept files and
profile, pruning, and the lock go through `ReleaseStore`, so the paths and the commands that
touch them live in one place. What a record says and how its status moves is pure
(dsv4deploy/release/records.py); the steps that decide when to call these are in tasks/.

Every method is one remote command unless its docstring says otherwise: each one costs a
round trip on a real link. A run uses one store per host from its read to its end (tasks/
pass it to each step): while it holds the lock, the store keeps the run's copy of the records,
so a step that needs them sends no command for them.
"""

from __future__ import annotations

import atexit
import json
import os
import shlex
import socket

from pyinfra import logger
from pyinfra.api import BaseStateCallback, DeployError

from dsv4deploy.profile import boundary, replicas
from dsv4deploy.release import records as releases
from dsv4deploy.profile.errors import make_target, rerun_with
from dsv4deploy.render.layout import ETC, HOMES, MODELS, OPT, RELEASES, Layout, venv_of_home
from dsv4deploy.release.records import Release
from dsv4deploy.release.rollout import Target
from dsv4deploy.host import installer
from dsv4deploy.host.accounts import login_problem
from dsv4deploy.host.facts import Releases
from dsv4deploy.host.io import json_write_command, read_json, sh
from dsv4deploy.host.state import LOCK, PIP_FREEZE, HostState


ALSO_FAILED = "__dsv4deploy_also_failed"
PRUNE_MARK = "__dsv4deploy_prune"


class RollbackError(Exception):
    """The rollback itself failed; the history says so and nothing claims to be serving.
    SWITCHED: it failed after the restored files were put in place (what ran before is gone)."""

    def __init__(self, message: str, switched: bool = False):
        super().__init__(message)
        self.switched = switched


class ReleaseStore:
    """The host's releases and its deploy lock. `h` is a connected pyinfra Host (or the `host`
    proxy while pyinfra prepares); commands run with the inventory's privileges (host/io.py)."""

    def __init__(self, h, releases_dir: str = RELEASES, lock: str = LOCK, root_only: bool = True):
        self.h = h
        self.dir = releases_dir
        self.lock = lock
        self.root_only = root_only      # the lock is refused to a login that is not root (False: a test's own folder)
        # The records as this run last read or wrote them: kept only while this store holds the
        # host's deploy lock (nothing else writes records then), so a run reads them once, with
        # the lock, and each later step costs no round trip for them. Dropped with the lock.
        self._held: list[dict] | None = None
        self._owner: str | None = None      # what this run wrote into the lock it holds (owner.json)

    def folder(self, number: int) -> str:
        return releases.release_dir(self.dir, number)

    # --- records ------------------------------------------------------------------------------

    def records(self) -> list[dict]:
        """Every record, oldest first (one command). While this run holds the lock: its own copy
        (no command) of the records it read with the lock: a deploy's read, those it decides from
        (facts.py RecentReleases); take_lock, every one."""
        if self._held is None:
            return self.h.get_fact(Releases, releases_dir=self.dir)
        return [dict(r) for r in self._held]

    def _remember(self, docs: list[dict]) -> None:
        """DOCS were written: the run's copy of the records says what the host now holds."""
        if self._held is None:      # not under this run's lock: nothing to keep current
            return
        by_number = {r["release"]: r for r in self._held}
        by_number.update({d["release"]: dict(d) for d in docs})
        self._held = sorted(by_number.values(), key=lambda d: d["release"])

    def current(self) -> dict | None:
        """The release that passed last and serves (None: none has)."""
        return releases.current(self.records())

    def save(self, *docs: dict, last: bool = False) -> None:
        """Write records, all in one command; LAST: the run's last write, which gives the lock back
        in the same command (the lock's callback then sends nothing)."""
        if docs:
            self._write(self._save_command(docs), docs, last)

    def _write(self, command: str, docs, last: bool) -> str:
        """Run COMMAND, which writes DOCS; with LAST (and the lock held) it gives the lock back
        too. Its output."""
        tail = f"; {self._give_back_command()}" if last and self.holds_lock() else ""
        ok, out = sh(self.h, command + tail)
        try:
            self._saved(ok, docs)
        finally:
            if tail:
                self._lock_given_back()
        return out

    def _save_command(self, docs) -> str:
        return " && ".join(json_write_command(f"{self.folder(d['release'])}/status.json", d) for d in docs)

    def _saved(self, ok: bool, docs) -> None:
        if not ok:
            raise DeployError(f"cannot write the records of release(s) "
                              f"{', '.join(format(d['release'], '04d') for d in docs)} under {self.dir}")
        self._remember(list(docs))

    def pending(self, records: list[dict], *, files: dict[str, str], profile_doc: dict, venv: str,
                **fields) -> tuple[Release, str]:
        """The release after RECORDS as `pending`, and the command that writes it with its folder
        (release_write_command); FIELDS are releases.new_record's. No command runs: a deploy's
        switch carries it, first, and calls `begun` once it ran."""
        rec = releases.new_record(records, **fields)
        return Release(rec), release_write_command(self.folder(rec["release"]), venv, files, profile_doc, rec)

    def begun(self, release: Release) -> None:
        """RELEASE's pending record is on the host (the command `pending` made has run)."""
        self._remember([release.record])

    def mark_deployed(self, release: Release, last: bool = False) -> Release:
        """RELEASE goes live as the handle holds it (its gate, its replicas' parts) and the one that
        served before is superseded: the records, then one write of every changed record (LAST:
        which gives the lock back too, see save)."""
        docs = self._deployed_docs(release)
        self.save(*docs, last=last)
        return self._live(docs, release)

    def go_live(self, release: Release, also: str = "", survey: str | None = None, last: bool = False) -> Release:
        """mark_deployed, then prune: one command runs ALSO (keeping the gate's reports: a failure
        there is a warning, not a failed deploy), writes the records and reads what pruning needs;
        one more removes, only when something goes. The records cost one more (read once) unless
        this run holds the lock. With SURVEY (prune_survey's answer, read ahead) the removal goes
        in the records' command: one command in all; LAST: it also gives the lock back (nothing
        follows in this run)."""
        recs = self.records()
        docs = self._deployed_docs(release, recs)
        after = {r["release"]: r for r in recs} | {d["release"]: d for d in docs}
        ordered = sorted(after.values(), key=lambda d: d["release"])
        first = f"{{ {also}; }} >/dev/null 2>&1 || echo {ALSO_FAILED}; " if also else ""
        if survey is None:
            listing, dropped = self._prune_listing(ordered)
            ok, out = sh(self.h, f"{first}{self._save_command(docs)} && echo {PRUNE_MARK} && {{ {listing}; }}")
            self._saved(ok, docs)
            said, _, listed = out.partition(PRUNE_MARK + "\n")
            self._prune_from(listed, dropped)
        else:
            removal, unused = self._prune_removal(survey, releases.to_prune(ordered))
            said = self._write(f"{first}{self._save_command(docs)}{f' && {removal}' if removal else ''}", docs, last)
            self._said_pruned(unused)
        if ALSO_FAILED in said:
            print(f"[{self.h.name}] warning: could not keep the gate's reports with {release.name}")
        return self._live(docs, release)

    def _deployed_docs(self, release: Release, recs: list[dict] | None = None) -> list[dict]:
        recs = self.records() if recs is None else recs
        recs = [release.record if r["release"] == release.number else r for r in recs]
        return releases.mark_deployed(recs, release.number)

    @staticmethod
    def _live(docs: list[dict], release: Release) -> Release:
        return next((Release(d) for d in docs if d["release"] == release.number), release)

    def settle_interrupted(self, live_manifest_sha256: str | None, healthy: bool) -> list[dict]:
        """Settle the `pending` records a cut-off run left (releases.settle_interrupted); returns
        the records written."""
        docs = releases.settle_interrupted(self.records(), live_manifest_sha256, healthy)
        self.save(*docs)
        return docs

    # --- a release's folder -------------------------------------------------------------------

    def read(self, number: int, name: str) -> dict | None:
        """A JSON file of release NUMBER's folder (`profile.json`, `gate/gate.json`), or None."""
        return read_json(self.h, f"{self.folder(number)}/{name}")

    def profiles(self) -> dict[int, dict]:
        """Release number -> the profile data each kept release folder holds (pruned ones have
        none; a damaged file is left out): the report's profile diffs. One command."""
        q = shlex.quote(self.dir)
        _, out = sh(self.h, f"for f in {q}/[0-9]*/profile.json; do [ -f \"$f\" ] || continue; "
                            "n=${f%/profile.json}; printf '%s ' \"${n##*/}\"; tr -d '\\n' < \"$f\"; echo; done")
        found = {}
        for line in out.splitlines():
            number, _, text = line.partition(" ")
            doc = _json_or_none(text)
            if number.isdigit() and doc is not None and isinstance(doc.get("data"), dict):
                found[int(number)] = doc["data"]
        return found

    def target(self, rec: dict) -> Target:
        """The service release REC ran, from its kept profile, with the venvs its kept manifest
        names (Target.as_kept): a rollback needs it. One command."""
        return self.kept(rec)[0]

    def kept(self, rec: dict) -> tuple[Target, dict | None]:
        """(target, its kept manifest or None): the target, and what release REC rendered (each
        replica's argv: `status` compares the running processes with it). One command."""
        folder = self.folder(rec["release"])
        _, out = sh(self.h, f"cat {shlex.quote(folder)}/profile.json 2>/dev/null; echo; echo {KEPT_SEP}; "
                            f"cat {shlex.quote(folder)}/files{ETC}/*/manifest.json 2>/dev/null | head -c 1000000")
        profile, _, manifest = out.partition(KEPT_SEP)     # no manifest kept: nothing after it
        if not profile.strip():
            raise RollbackError(f"release {rec['release']:04d} has no profile.json: its files were pruned")
        doc = _json_or_none(profile)
        if doc is None or not isinstance(doc.get("data"), dict):
            raise RollbackError(f"release {rec['release']:04d}'s profile.json is damaged (not the JSON a release "
                                "keeps): it cannot be restored")
        kept = _json_or_none(manifest)
        # read back from the host, its values reach commands (unit names, ports, paths) as a
        # profile's do: the same boundary rule, whoever wrote them
        problems = boundary.value_problems(doc["data"]) + _kept_manifest_problems(kept)
        if problems:
            where, why = problems[0]
            raise RollbackError(f"release {rec['release']:04d}'s kept profile.json or manifest holds a value no "
                                f"profile may ({'.'.join(map(str, where))}: {why}): it cannot be restored")
        return Target.of(doc["data"]).as_kept(kept), kept

    def put_back(self, source: int, into: Release, then: str, also: tuple[dict, ...] = ()) -> tuple[bool, str]:
        """A restore's files, in one command: write INTO's record (the rollback entry) and ALSO's
        (the release that failed), give INTO its own copy of release SOURCE's files and profile
        (so it can be restored in turn), put those files back in place (`cp -a files/. /`), then
        run THEN (daemon-reload, a restart): (ok, output)."""
        src, dst = self.folder(source), self.folder(into.number)
        docs = [*also, into.record]
        ok, out = sh(self.h, f"{self._save_command(docs)} && "
                             f"cp -a {src}/files {src}/profile.json {dst}/ && cp -a {src}/files/. / && {then}")
        self._remember(docs)              # written, or about to be marked failed by the caller
        return ok, out

    def prune(self) -> None:
        """Keep the last releases' files; remove venvs (with their servers' homes, Layout.home)
        and checkpoints no kept release uses. One command reads every kept release's profile and
        what is on disk, one removes (only when something goes); the records cost one more
        unless this run holds the lock."""
        listing, dropped = self._prune_listing(self.records())
        _, out = sh(self.h, listing)
        self._prune_from(out, dropped)

    def prune_survey(self) -> str:
        """What pruning needs once this run's release goes live (go_live's SURVEY), read ahead in
        one command: a deploy reads it while its server starts, and nothing it lists changes while
        the run holds the lock. It lists the profiles of the releases kept now, a superset of
        those kept after (the release serving now may be the one that goes)."""
        return sh(self.h, self._prune_listing(self.records())[0])[1]

    def _prune_listing(self, recs: list[dict]) -> tuple[str, list[int]]:
        """The command that prints each kept release's profile (its path, a tab, one JSON document
        a line), then `---` and what is on disk; and the releases whose files go."""
        dropped = releases.to_prune(recs)
        q = shlex.quote
        kept = " ".join(q(f"{self.folder(rec['release'])}/profile.json")
                        for rec in recs if rec["release"] not in dropped)
        return (f"for f in {kept}; do [ -f \"$f\" ] && {{ printf '%s\\t' \"$f\"; tr -d '\\n' < \"$f\"; echo; "
                f"for m in \"${{f%/profile.json}}\"/files{ETC}/*/manifest.json; do [ -f \"$m\" ] && "
                f"{{ printf '{KEPT_MANIFEST}\\t%s\\t' \"$f\"; tr -d '\\n' < \"$m\"; echo; }}; done; }}; done; "
                f"echo ---; ls -d {OPT}/venvs/* {MODELS}/*/* {HOMES}/*/* {q(self.dir)}/[0-9]*/files "
                f"{q(self.dir)}/[0-9]*/profile.json 2>/dev/null; true"), dropped

    def _prune_removal(self, out: str, dropped: list[int]) -> tuple[str, list[str]]:
        """Pure: from the listing OUT, the command that removes what no kept release uses ("" when
        nothing goes) and the venvs and checkpoints among it."""
        q = shlex.quote
        docs, _, listing = out.partition("---\n")
        ours = f"{self.dir}/"
        on_disk = [p for p in listing.split() if not p.startswith(ours)]
        still_there = set(listing.split()) - set(on_disk)     # releases' files not pruned yet
        going = {f"{self.folder(n)}/profile.json" for n in dropped}
        used: set[str] = set()
        for line in docs.splitlines():        # one kept release's profile per line, then its manifest's
            if line.startswith(f"{KEPT_MANIFEST}\t"):
                _, path, doc = line.split("\t", 2)
                kept = _json_or_none(doc) if path not in going else None
                if kept:   # the venvs its kept unit starts, whatever this dsv4deploy's lock files name now
                    used |= {kept.get("venv"), (kept.get("gateway") or {}).get("venv")} - {None}
                continue
            path, tab, doc = line.partition("\t")
            if tab and path not in going:
                data = json.loads(doc)["data"]
                layout = Layout.of(data)
                used |= {layout.venv, layout.model_dir, replicas.gateway_venv(data)} - {None}
        used |= {p for p in on_disk if venv_of_home(p) in used}     # a server home goes with its venv
        gone = [p for n in dropped for p in (f"{self.folder(n)}/files", f"{self.folder(n)}/profile.json")
                if p in still_there]
        unused = releases.unused(on_disk, used)
        return (f"rm -rf {' '.join(gone)} {' '.join(q(p) for p in unused)}" if gone or unused else ""), unused

    def _prune_from(self, out: str, dropped: list[int]) -> None:
        """Remove what the listing OUT shows no kept release uses, in one command (none if nothing goes)."""
        removal, unused = self._prune_removal(out, dropped)
        if removal:
            sh(self.h, removal)
        self._said_pruned(unused)

    def _said_pruned(self, unused: list[str]) -> None:
        for path in unused:
            print(f"[{self.h.name}] pruned {path} (no kept release uses it)")

    # --- the deploy lock ----------------------------------------------------------------------

    def take_lock(self, label: str, *, break_lock=False, state=None) -> None:
        """Take the deploy lock, or refuse with the holder's PID and start (a lock whose holder is
        gone from this controller, or any with BREAK_LOCK, is taken over). With a pyinfra STATE,
        the lock is given back when its run ends (LockCallback). One command, which also reads
        the records once the lock is held: from then on this run's copy is the store's. (A
        deploy takes it with its read of the host instead: read_locked.)"""

        def records_after(first: str) -> HostState:
            ok, out = sh(self.h, f"{first} && ( {Releases().command(releases_dir=self.dir)} )")
            lines = out.splitlines()
            if not ok:                 # the lock's owner.json, or nothing when the command itself failed
                return HostState(values={"releases": []}, first=(lines, 1) if lines else None)
            try:
                return HostState(values={"releases": Releases().process(lines)}, first=(lines, 0))
            except ValueError as exc:
                raise DeployError(str(exc)) from None

        self.read_locked(label, records_after, break_lock=break_lock, state=state)

    def read_locked(self, label: str, read, *, break_lock=False, state=None):
        """READ(first) runs the host's read after the command FIRST, in one command (read_state):
        here FIRST takes the lock, so the run decides from what the host holds under its lock,
        at no round trip of its own. The read, whose `first` says whether the lock was taken;
        refused (or a stale lock taken over, then read again) as take_lock does."""
        for attempt in range(2):
            owner = self.owner_text(label)
            try:
                got = read(self.lock_command(owner))
                if got.first is None:      # the command did not run to its end: no answer of the lock
                    raise DeployError("the host's state could not be read (the read's command failed: the "
                                      "connection, sudo or the host's shell); nothing was changed. Run again")
            except BaseException:
                # the lock may have been taken before the read failed (a damaged record, a lost
                # link): give it back if it is this run's, so that no dead run holds the host
                self._give_back_after_failed_read(owner)
                raise
            lines, rc = got.first
            if rc == 0:
                self.adopt_lock(owner, got["releases"] or [], label, state)
                return got
            if refused := login_refused(lines):
                raise DeployError(f"{refused}. Nothing was changed on the host.")
            self.taken_over("\n".join(lines).strip(), label, break_lock, attempt)
        raise AssertionError("unreachable: the second attempt takes the lock or refuses")

    def _give_back_after_failed_read(self, owner: str) -> None:
        try:
            sh(self.h, self._remove_if_owner(owner))
        except Exception:  # noqa: BLE001 - the link may be gone: the stale-lock check copes on the next run
            pass

    @staticmethod
    def owner_text(label: str) -> str:
        """What a run writes into the lock it takes: this controller, its PID, when, and LABEL."""
        return json.dumps({"controller": socket.gethostname(), "pid": os.getpid(), "started": releases.now(),
                           "what": label}, sort_keys=True)

    def lock_command(self, owner: str) -> str:
        """Take the lock for OWNER (status 0), or print the holder's owner.json (status 1); a login
        that is not root (no sudo) prints LOGIN_MARK's line instead and writes nothing."""
        return (f"{LOGIN_CHECK + '; ' if self.root_only else ''}"
                f"mkdir -p {self.lock.rsplit('/', 1)[0]} && if mkdir {self.lock} 2>/dev/null; then "
                f"printf '%s\\n' {shlex.quote(owner)} > {self.lock}/owner.json; "
                f"else cat {self.lock}/owner.json 2>/dev/null; exit 1; fi")

    def adopt_lock(self, owner: str, records: list[dict], label: str, state=None) -> None:
        """The lock is this run's (OWNER), and RECORDS were read under it: from here on this run's
        copy of the records is the store's; with a pyinfra STATE, the run's end gives it back."""
        self._held = [dict(r) for r in records]
        self._owner = owner
        if state is not None:
            state.add_callback_handler(LockCallback(self, label))

    def taken_over(self, seen: str, label: str, break_lock: bool, attempt: int) -> None:
        """The lock is held by the owner SEEN (its owner.json): remove it when its run is gone from
        this controller, or with BREAK_LOCK, on the first ATTEMPT (the caller tries again); else
        refuse with the holder's PID and start."""
        holder = _json_or_none(seen) or {}
        stale = holder.get("controller") == socket.gethostname() and not _pid_alive(int(holder.get("pid", 0)))
        if (stale or break_lock) and attempt == 0:
            self._break(seen)
            return
        raise DeployError(
            f"another deploy holds the lock on this host: {lock_holder(holder)}. "
            f"If that run is gone, {rerun_with('break_lock=true', make_target(label))}.")

    def _break(self, seen: str) -> None:
        """Remove the lock only if its owner is still the one SEEN, under flock: two runs that
        both found the same dead owner cannot each remove the lock the other has just taken (the
        second finds a new owner, or none, and then races for mkdir, which one of them wins)."""
        sh(self.h, self._remove_if_owner(seen))

    def give_back_lock(self) -> None:
        command = self._give_back_command()
        self._lock_given_back()
        sh(self.h, command)

    def _give_back_command(self) -> str:
        """Remove the lock if it is still this run's (the owner it wrote), under the same flock as a
        takeover: a run whose lock was broken (break_lock=true) leaves the new holder's alone."""
        if self._owner is None:
            return f"rm -rf {shlex.quote(self.lock)}"
        return self._remove_if_owner(self._owner)

    def _remove_if_owner(self, owner_text: str) -> str:
        q = shlex.quote
        check = f'[ "$(cat {self.lock}/owner.json 2>/dev/null)" = {q(owner_text)} ] && rm -rf {self.lock}; true'
        return f"flock {q(self.lock + '.flock')} sh -c {q(check)}"

    def holds_lock(self) -> bool:
        """Whether this run took the lock and has not given it back (a LAST write may have): its
        copy of the records lives exactly as long as the lock."""
        return self._held is not None

    def _lock_given_back(self) -> None:
        self._held = self._owner = None


LOGIN_MARK = "dsv4deploy-login-not-root"
# Before the lock's first write: a login that is not root says who it is and whether `sudo -n`
# works for it, and stops (the lock's mkdir under /var/lib would fail as "another deploy holds it").
LOGIN_CHECK = (f"[ \"$(id -u)\" = 0 ] || {{ printf '{LOGIN_MARK} %s %s %s\\n' \"$(id -un)\" \"$(id -u)\" "
               "\"$(sudo -n true </dev/null >/dev/null 2>&1 && echo yes || echo no)\"; exit 1; }")


def login_refused(lines: list[str]) -> str | None:
    """Pure: accounts.login_problem for the LOGIN_CHECK line among LINES, None when there is none."""
    for line in lines:
        words = line.split()
        if len(words) == 4 and words[0] == LOGIN_MARK and words[2].isdigit():
            return login_problem(words[1], int(words[2]), sudo=False, sudo_usable=words[3] == "yes")
    return None


KEPT_SEP = "@@dsv4deploy-kept-manifest@@"
KEPT_MANIFEST = "M"        # a prune listing's line: M, the kept profile's path, its release's manifest


_KEPT_PATCHSET = boundary.Rule("a venv name: letters, digits, '.', '_' and '-'", 64, r"[A-Za-z0-9._-]+")
_KEPT_VENV = boundary.Rule("a venv path: '/', letters, digits, '.', '_' and '-'", 200, r"/[A-Za-z0-9._/-]*")


def _kept_manifest_problems(manifest: dict | None) -> list[tuple[tuple, str]]:
    """What in a kept manifest's venv names (Target.as_kept) breaks the boundary rule."""
    if not manifest:
        return []
    found = []
    patchset = manifest.get("patchset")          # as_kept ignores one that is not text
    if isinstance(patchset, str) and (why := _KEPT_PATCHSET.check(patchset)):
        found.append((("manifest", "patchset"), why))
    gateway = manifest.get("gateway")
    venv = gateway.get("venv") if isinstance(gateway, dict) else None
    if venv is not None and (why := _KEPT_VENV.check(venv) if isinstance(venv, str) else "not text"):
        found.append((("manifest", "gateway", "venv"), why))
    return found


def _json_or_none(text: str) -> dict | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def release_write_command(folder: str, venv: str, files: dict[str, str], profile_doc: dict, rec: dict) -> str:
    """One command that writes a release's folder: the rendered files, the resolved profile, the
    venv's `pip freeze` (made once per venv fill, host/ops.py venv) and, last, its status record.
    None of it is secret (the API key and HF token never enter a profile or a rendered file)."""
    q = shlex.quote
    freeze = f"{venv}/{PIP_FREEZE}"
    parts = [f"mkdir -p {' '.join(q(f'{folder}/files{os.path.dirname(p)}') for p in files)}",
             # what the venv really holds (torch, sgl-kernel, flashinfer, ...), kept with the release
             f"{{ [ -s {q(freeze)} ] || {installer.freeze_command(venv)} > {q(freeze)} 2>&1; }}", f"cp {q(freeze)} {q(folder)}/pip-freeze.txt"]
    parts += [f"printf '%s' {q(text)} > {q(f'{folder}/files{path}')}" for path, text in files.items()]
    parts += [json_write_command(f"{folder}/profile.json", profile_doc),
              json_write_command(f"{folder}/status.json", rec)]
    return " && ".join(parts)


def lock_holder(holder: dict) -> str:
    """Who holds the deploy lock, from its owner.json: "PID n on controller since t (what)"."""
    return (f"PID {holder.get('pid', '?')} on {holder.get('controller', '?')} since "
            f"{holder.get('started', '?')} ({holder.get('what', '?')})")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def last_step(state, h) -> bool:
    """Whether the operation running now on H is the run's last: nothing after it needs the lock
    (its last record may give it back: save, go_live)."""
    order = state.get_op_order()
    return bool(order) and order[-1] == h.current_op_hash


class LockCallback(BaseStateCallback):
    """Gives the lock back when the run's last operation ends, or when an operation fails: a run
    that changes nothing reports no changed operation, and a failed one leaves no lock behind."""

    def __init__(self, store: ReleaseStore, label: str = ""):
        self.store = store
        self.host = store.h
        self.label = label
        self.held = True
        atexit.register(self._release)  # a run that ends early (declined prompt, ^C) still gives it back

    def _release(self):
        if not self.held or not self.store.holds_lock():    # given back already (a LAST write)
            self.held = False
            return
        try:
            self.store.give_back_lock()
            self.held = False
        except Exception:  # noqa: BLE001 - the connection may be gone; the stale-lock check copes
            pass

    def operation_end(self, st, op_hash):
        order = st.get_op_order()
        if order and op_hash == order[-1]:
            self._release()

    def operation_host_error(self, st, h, op_hash, retry_count=0, max_retries=0):
        if h is self.host and not st.get_op_data_for_host(h, op_hash).global_arguments.get("_ignore_errors"):
            self._release()
            # what to do next, whatever the step: pyinfra's own error line says only what failed
            step = ", ".join(sorted(st.get_op_meta(op_hash).names)) or "an operation"
            logger.error(f"    [{h.name}] stopped at {step}: fix what the lines above say (disk space, network, "
                         f"the host), then run make {make_target(self.label)} again; a release this run left "
                         "half done is settled by the next run")
