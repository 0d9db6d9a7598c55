"""Semantic checks of a schema-valid profile: what JSON Schema cannot say.

Errors fail (exit 2, nothing on the host is touched); warnings are listed. The GPU-memory
budget (memory.py) is part of the report so `dsv4deploy validate` can show it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from dsv4deploy.profile import catalog, network, replicas
from dsv4deploy.profile.boundary import shown
from dsv4deploy.profile.errors import Problem
from dsv4deploy.profile import calibration as host_calibration
from dsv4deploy.profile.memory import Budget, BudgetInputError, Measured, budget
from dsv4deploy.sglang.patches import (MASK_SECRETS_PATCH, PR25820_PATCH, PR25820_SINCE, PR25820_UPSTREAM,
                                       profile_entry)
from dsv4deploy.sglang.flags import HOME_ENV, MANAGED_ENV, MANAGED_FLAGS, UNREAD_FLAGS, flag_owner
from dsv4deploy.render.layout import FETCH_USER, GATE_USER
from dsv4deploy.render.nccl import NO_CONF_FILE, nccl_environment, nccl_integer
from dsv4deploy.profile.load import Profile
from dsv4deploy.sglang.versions import facts, known_versions

PLACEHOLDER_REVISION = "0" * 40
NO_SM120_KERNELS = {"auto", "flashinfer_trtllm_routed", "flashinfer_trtllm", "deep_gemm",
                    "flashinfer_cutedsl", "flashinfer_megamoe", "megamoe"}

# --- secrets: a profile is copied into the unit, the manifest, argv.json and release records ---
SECRET_ENV = re.compile(r".*_TOKEN|.*_KEY|.*_APIKEY|.*SECRET.*|.*PASSWORD.*|.*PASSWD.*|.*CREDENTIAL.*|"
                        r"HF_TOKEN|HUGGING_FACE_HUB_TOKEN")
SECRET_FLAG = re.compile(r"(^|-)(key|apikey|secret|password|passwd|credentials?)(-|$)|"
                         r"(^|-)(auth|access|api|hf|bearer|refresh|session)-token(-|$)")
SECRET_VALUE = re.compile(r"\bhf_[A-Za-z0-9]{30,}|\bsk-[A-Za-z0-9_-]{20,}|\bAKIA[0-9A-Z]{16}\b|"
                          r"\bgh[pousr]_[A-Za-z0-9]{30,}|\bglpat-[A-Za-z0-9_-]{20,}|\bxox[abprs]-[A-Za-z0-9-]{10,}|"
                          r"-----BEGIN [A-Z ]*PRIVATE KEY-----")
API_KEY_HOWTO = ("set server.api_key: true (the key is generated on the host and given to SGLang through a "
                 "systemd credential)")
HF_TOKEN_HOWTO = "give the HF token on the control node: DSV4_HF_TOKEN_FILE=path or DSV4_HF_TOKEN"
SECRET_WHY = "a secret does not belong in a profile (it is copied into the unit, manifest, argv.json and release records)"

# --- the service must not be, or collide with, something the host already has ------------------
SYSTEM_USERS = {
    "root", "toor", "daemon", "bin", "sys", "sync", "games", "man", "lp", "mail", "news", "uucp", "proxy",
    "www-data", "backup", "list", "irc", "gnats", "nobody", "nogroup", "sshd", "messagebus", "syslog",
    "adm", "sudo", "wheel", "staff", "operator", "halt", "shutdown", "ftp", "dbus", "polkitd", "avahi",
    "dnsmasq", "uuidd", "tss", "tcpdump", "usbmux", "rtkit", "ntp", "chrony", "postfix", "lxd", "landscape",
    "pollinate", "fwupd-refresh", "_apt", "_chrony", "_rpc", "ubuntu", "debian", "admin", "ec2-user",
    "centos", "fedora", "cloud-user", "nvidia-persistenced",
}
SYSTEM_UNITS = {
    "ssh", "sshd", "dbus", "dbus-broker", "cron", "crond", "atd", "anacron", "getty", "serial-getty",
    "console-getty", "container-getty", "autovt", "networking", "network", "network-online", "rsyslog",
    "syslog", "journald", "udev", "logind", "polkit", "docker", "containerd", "snapd", "ufw", "apparmor",
    "auditd", "chrony", "chronyd", "ntp", "ntpd", "cloud-init", "cloud-config", "cloud-final",
    "nvidia-persistenced", "nvidia-fabricmanager", "nvidia-dcgm", "dcgm", "kubelet", "user",
    "user-runtime-dir", "emergency", "rescue", "reboot", "poweroff", "halt", "kexec", "default",
    "multi-user", "graphical", "basic", "sysinit", "shutdown", "sockets", "timers", "paths", "slices",
    "local-fs", "remote-fs", "swap", "init", "kmod", "kmod-static-nodes", "dm-event", "lvm2-monitor",
    "multipathd", "iscsid", "rpcbind", "unattended-upgrades", "apt-daily", "apt-daily-upgrade",
    "motd-news", "fwupd", "packagekit", "accounts-daemon", "irqbalance", "thermald", "libvirtd",
    "firewalld", "sssd", "nscd", "nginx", "apache2", "httpd", "postgresql", "mysql", "redis-server",
    "releases",  # /var/lib/dsv4deploy/releases is the release store: a service there would share it
    # the deploy's own folders beside the service's under /etc/dsv4deploy and /var/lib/dsv4deploy: a
    # service named so would own root's HF_HOME (hf-home) or share the secrets' folder (secrets)
    "secrets", "hf-home", "deploy.lock", "reboot-required", "secrets.env", "tools", "venvs", "gate",
    "homes",  # /var/lib/dsv4deploy/homes holds every service's per-venv homes (render/layout.py HOMES)
}
SYSTEM_UNIT_PREFIXES = ("systemd-", "dbus-", "getty", "user@", "sys-", "dev-", "run-")


@dataclass
class Report:
    profile: Profile
    problems: list[Problem] = field(default_factory=list)
    budget: Budget | None = None

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "warning"]

    @property
    def ok(self) -> bool:
        return not self.errors


def validate(profile: Profile, calibration: dict | None = None) -> Report:
    """CALIBRATION: the host's (profile/calibration.py), which moves the memory boundary for the
    profile's layout to what that host measured."""
    report = Report(profile)
    add = report.problems.append
    data = profile.data
    server, hw = data["server"], data["hardware"]
    gpu = catalog.gpu(hw["gpu"])
    model = catalog.model(data["model"]["repo"])
    version = facts(data["sglang"]["version"])

    if version is None:
        add(profile.problem(("sglang", "version"),
                            f"no flag data for SGLang {data['sglang']['version']}; "
                            f"known versions: {', '.join(known_versions())}"))
    if model is None:
        add(profile.problem(("model", "repo"),
                            f"not in the model catalog; known: {', '.join(catalog.model_repos())}"))
        return report
    if data["model"]["revision"] == PLACEHOLDER_REVISION:
        add(profile.problem(("model", "revision"), "placeholder revision: pin the checkpoint commit you validated",
                            "warning"))

    if "num_continuous_decode_steps" in server:
        add(profile.problem(("server", "num_continuous_decode_steps"),
                            f"--num-continuous-decode-steps is {UNREAD_FLAGS['--num-continuous-decode-steps']}: "
                            "remove the key (it changes nothing at any value)", "warning"))
    _parallelism(profile, server, hw, model, add)
    _context(profile, server, model, add)
    _kernels(profile, server, gpu, version, add)
    _nccl(profile, data, add)
    if version is not None:
        _extra_args(profile, server, version, add)
    _secrets(profile, add)
    _indexes(profile, data["sglang"], add)
    _service(profile, data["service"], add)
    replicas.check(profile, add)
    network.check(profile, add)
    _env(profile, server, add)
    if data["driver"]["branch"] < gpu.min_driver_branch:
        add(profile.problem(("driver", "branch"), f"{gpu.name} (compute capability {gpu.compute_cap}) needs "
                            f"driver branch >= {gpu.min_driver_branch}, got {data['driver']['branch']}"))
    if version is not None and server.get("api_key"):
        _api_key_masked(profile, version, add)
    _hardening(profile, data["service"], add)
    _watch(profile, data, add)
    if version is not None and data["driver"]["branch"] < version.min_driver_branch:
        add(profile.problem(("driver", "branch"), f"SGLang {version.version} is built for CUDA 13, whose runtime "
                            f"needs driver branch >= {version.min_driver_branch}, got {data['driver']['branch']}"))
    if not any("min_output_throughput" in lvl for lvl in data["gate"]["levels"]):
        add(profile.problem(("gate", "levels"), "no level has min_output_throughput: the smoke gate "
                            "checks only failed requests", "warning"))

    try:
        b = budget(server, gpu, model, data.get("calibration"))
        found = host_calibration.measured_need(calibration, host_calibration.layout(data, b),
                                               b.graph_gib + b.activations_gib + b.nccl_gib)
        if found:
            b = budget(server, gpu, model, data.get("calibration"), measured=Measured(*found))
    except BudgetInputError as exc:
        add(profile.problem(exc.path, str(exc)))
        return report
    report.budget = b
    _memory(profile, b, add)
    return report


def _watch(profile, data, add) -> None:
    """The watch's settings must be able to decide: a probe that fits the context, a cooldown
    longer than the failures it follows; seconds-long intervals are for the twin."""
    w = data.get("watch") or {}
    if not w.get("enabled", True):
        return
    probe = w.get("probe") or {}
    ctx = data["server"].get("context_length")
    if ctx is not None and probe.get("input_len", 0) + probe.get("output_len", 0) > ctx:
        add(profile.problem(("watch", "probe"), f"the probe's {probe['input_len']} + {probe['output_len']} tokens "
                            f"exceed context_length {ctx}"))
    interval, limit = w.get("interval_s", 60), w.get("failure_limit", 3)
    if w.get("restart_cooldown_s", 3600) <= interval * limit:
        add(profile.problem(("watch", "restart_cooldown_s"), f"{w['restart_cooldown_s']} s is not longer than "
                            f"failure_limit x interval_s ({limit} x {interval} s): a restart that did not help "
                            "would be followed by another instead of being marked degraded"))
    if interval < 10:
        add(profile.problem(("watch", "interval_s"), f"{interval} s between measurements: the probe then costs "
                            "the GPUs a share of their time (seconds are meant for the twin)", "warning"))


def _parallelism(profile, server, hw, model, add) -> None:
    tp, nnodes = server["tp_size"], server["nnodes"]
    if model.attention_heads % tp:
        add(profile.problem(("server", "tp_size"),
                            f"tensor parallelism {tp} does not divide the model's {model.attention_heads} attention heads"))
    if tp % nnodes:
        add(profile.problem(("server", "nnodes"), f"tp_size {tp} is not a multiple of nnodes {nnodes}"))
    elif tp // nnodes > hw["gpus_per_host"]:
        add(profile.problem(("server", "tp_size"),
                            f"needs {tp // nnodes} GPUs per host (tp_size {tp} / nnodes {nnodes}), "
                            f"the host has {hw['gpus_per_host']}"))
    if nnodes > 1:
        add(profile.problem(("server", "nnodes"), "multi-node rendering (--node-rank, --dist-init-addr per "
                            "host) is not supported yet"))


def _context(profile, server, model, add) -> None:
    ctx = server.get("context_length")
    if ctx is not None and ctx > model.max_context:
        add(profile.problem(("server", "context_length"),
                            f"{ctx} exceeds the model's maximum context {model.max_context}"))
    effective = ctx or model.max_context
    for i, level in enumerate(profile.data["gate"]["levels"]):
        need = level.get("input_len", 256) + level.get("output_len", 256)
        if need > effective:
            add(profile.problem(("gate", "levels", i),
                                f"a request of {need} tokens (input + output) exceeds context_length {effective}"))


def _kernels(profile, server, gpu, version, add) -> None:
    backend = server["moe_runner_backend"]
    if gpu.compute_cap.startswith("12.") and backend in NO_SM120_KERNELS:
        add(profile.problem(("server", "moe_runner_backend"),
                            f"{backend!r} has no kernels for {gpu.name} (sm_{gpu.compute_cap.replace('.', '')}); "
                            "name one that does, e.g. marlin or flashinfer_mxfp4"))
    if version and version.moe_runner_backends and backend not in version.moe_runner_backends:
        add(profile.problem(("server", "moe_runner_backend"),
                            f"SGLang {version.version} does not offer {backend!r}"))
    if version:
        _pr25820(profile, version, add)


def _pr25820(profile, version, add) -> None:
    """PR #25820 (NVFP4 MoE for DeepSeek-V4) is in every wheel from PR25820_SINCE on; an older
    release serves an NVFP4 checkpoint only with the backport made for it, and a release that has
    the PR must not get it again (its diff no longer applies there)."""
    listed = {p.get("sha256") for p in profile.data["sglang"].get("patches") or []}
    ours = {PR25820_UPSTREAM["sha256"], PR25820_PATCH["sha256"]}
    if version.nvfp4_dsv4_moe:
        if listed & ours:
            add(profile.problem(("sglang", "patches"), f"SGLang {version.version} already includes PR #25820 "
                                f"(every release from {PR25820_SINCE} on): remove its patch"))
        return
    if "NVFP4" not in profile.data["model"]["repo"].upper():
        return
    backport = version.nvfp4_dsv4_moe_patch
    if backport is None:
        add(profile.problem(("sglang", "version"), f"SGLang {version.version} predates PR #25820 (NVFP4 MoE for "
                            f"DeepSeek-V4, in every release from {PR25820_SINCE} on) and dsv4deploy ships no "
                            f"backport for it: pin {PR25820_SINCE} or newer, or {PR25820_PATCH['sglang_version']} "
                            "with its backport"))
    elif backport not in listed:
        entry = profile_entry(PR25820_PATCH) if backport == PR25820_PATCH["sha256"] else None
        hint = (f"; add to sglang.patches: {{name: {entry['name']}, file: {entry['file']}, "
                f"sha256: {entry['sha256']}, strip: {entry['strip']}}}" if entry else "")
        add(profile.problem(("sglang", "patches"), f"SGLang {version.version} predates PR #25820 (NVFP4 MoE for "
                            f"DeepSeek-V4): it needs the backport with sha256 {backport}{hint}, or pin "
                            f"{PR25820_SINCE} or newer"))


def _api_key_masked(profile, version, add) -> None:
    """SGLang logs `server_args=ServerArgs(... api_key=...)` at startup and shows the key in
    /server_info: an API key is only safe with the shipped mask patch for that release."""
    mask = version.secrets_mask_patch
    if mask is None:
        add(profile.problem(("server", "api_key"), f"SGLang {version.version} writes the API key into the journal "
                            "(server_args log line) and /server_info, and dsv4deploy ships no mask patch for it: "
                            f"use SGLang {MASK_SECRETS_PATCH['sglang_version']} with its mask patch"))
    elif not any(p.get("sha256") == mask for p in profile.data["sglang"].get("patches") or []):
        entry = profile_entry()
        add(profile.problem(("sglang", "patches"), f"server.api_key needs the mask patch, or SGLang {version.version} "
                            "writes the key into the journal and /server_info; add to sglang.patches: "
                            f"{{name: {entry['name']}, file: {entry['file']}, sha256: {entry['sha256']}}}"))


def _indexes(profile, sglang, add) -> None:
    """An index besides index_url names the packages that come from it, and only those do
    (host/uvpip.py --pinned-index): an unnamed extra index lets a name resolve to whichever index
    offers the newest version, an attacker's upload included."""
    if sglang.get("extra_index_urls"):
        add(profile.problem(("sglang", "extra_index_urls"), "an extra index must name the packages that come "
                            "from it: write sglang.indexes: [{name: pytorch, url: https://..., packages: [torch, "
                            "...]}] instead (those packages then come from that index only, no other package does)"))
    names: set[str] = set()
    owner: dict[str, str] = {}
    for i, index in enumerate(sglang.get("indexes") or []):
        if index["name"] in names:
            add(profile.problem(("sglang", "indexes", i, "name"), f"index name {index['name']} is given twice"))
        names.add(index["name"])
        for j, package in enumerate(index["packages"]):
            key = re.sub(r"[-_.]+", "-", package).lower()
            if key in owner:
                add(profile.problem(("sglang", "indexes", i, "packages", j), f"{package} is already named for "
                                    f"index {owner[key]}: a package comes from one index"))
            owner.setdefault(key, index["name"])


def _hardening(profile, service, add) -> None:
    """`hardening: off` (systemd-analyze exposure 9.2) only with a reason written next to it:
    turning the sandbox off is a decision someone states, not a default someone inherits."""
    level, reason = service.get("hardening", "strict"), service.get("hardening_off_reason")
    if level == "off" and not (reason or "").strip():
        add(profile.problem(("service", "hardening"), "hardening: off runs the server's model code with full "
                            "access to the host as its user: say why in service.hardening_off_reason, or use "
                            "strict or standard"))
    elif level == "off":
        add(profile.problem(("service", "hardening"), f"the unit runs without a sandbox ({reason}): the server "
                            "runs model code with full access to the host as its user; use strict or standard",
                            "warning"))
    elif reason is not None:
        add(profile.problem(("service", "hardening_off_reason"), f"hardening is {level}, not off: this reason "
                            "explains nothing; remove it", "warning"))


def _nccl(profile, data, add) -> None:
    """P2P off (the value NCCL reads from the rendered nccl.env, whatever its spelling: 1, "1",
    "01", "0x1") needs SGLang's custom all-reduce off too: it uses P2P itself (a hang at start).
    NCCL_CONF_FILE stays /dev/null (render/nccl.py NO_CONF_FILE): a file would set NCCL's others."""
    overrides = data["nccl"].get("overrides") or {}
    if "NCCL_CONF_FILE" in overrides:
        add(profile.problem(("nccl", "overrides", "NCCL_CONF_FILE"), "NCCL_CONF_FILE is set by the rendered "
                            f"nccl.env ({NO_CONF_FILE['NCCL_CONF_FILE']}: no NCCL settings from a file that model "
                            "code could write); put the variables in nccl.overrides instead"))
    if data["server"]["disable_custom_all_reduce"]:
        return
    p2p = nccl_environment(data["nccl"]["preset"], overrides).get("NCCL_P2P_DISABLE", "")
    if nccl_integer(p2p) != 1:
        return
    if "NCCL_P2P_DISABLE" in overrides:
        add(profile.problem(("nccl", "overrides", "NCCL_P2P_DISABLE"),
                            f"P2P off (NCCL_P2P_DISABLE={p2p}) needs server.disable_custom_all_reduce: true"))
    else:
        add(profile.problem(("server", "disable_custom_all_reduce"),
                            f"the {data['nccl']['preset']} NCCL preset needs disable_custom_all_reduce: true "
                            "(SGLang's custom all-reduce uses P2P itself)"))


_NEGATIVE_NUMBER = re.compile(r"-[0-9]+|-[0-9]*\.[0-9]+")
_COUNTS = {"0": (0, 0), "1": (1, 1), "?": (0, 1), "*": (0, 1 << 30), "+": (1, 1 << 30)}


def _is_option(word: str) -> bool:
    """What SGLang's argparse reads as an option rather than a value."""
    return word.startswith("-") and word != "-" and not _NEGATIVE_NUMBER.fullmatch(word)


def _extra_args(profile, server, version, add) -> None:
    """Every word is a known --flag of the pinned release, or a value that flag takes (its
    arity from <version>.arity); single-dash options, '--' and bare positionals are refused."""
    words = server.get("extra_args") or []
    i = 0
    while i < len(words):
        word, path = words[i], ("server", "extra_args", i)
        i += 1
        if word == "--" or (_is_option(word) and not word.startswith("--")):
            add(profile.problem(path, f"{shown(word)}: only full --flags of SGLang {version.version} are allowed "
                                "here (single-dash options such as -h print the usage and exit, '--' ends the "
                                "options)"))
            continue
        if not _is_option(word):
            add(profile.problem(path, f"{shown(word)} is not the value of any flag: SGLang's launcher takes no "
                                "positional arguments (put each value right after the flag that takes it)"))
            continue
        name, eq, _ = word.partition("=")
        owner = flag_owner(word)
        takes = version.takes(name)
        if SECRET_FLAG.search(name[2:]):
            add(profile.problem(path, f"{name}: {SECRET_WHY}; for the server's API key {API_KEY_HOWTO}"))
        elif name in UNREAD_FLAGS:
            add(profile.problem(path, f"{name} is {UNREAD_FLAGS[name]}: remove it"))
        elif owner:
            add(profile.problem(path, f"{name} is managed by the profile (server.{owner} / "
                                f"{', '.join(MANAGED_FLAGS[owner])}); set it there"))
        elif name == "--help":
            add(profile.problem(path, "--help prints the usage and exits: the service would never start"))
        elif not version.accepts(name):
            near = sorted(f for f in version.flags if f.startswith(name))
            hint = f"; abbreviations are not allowed: write {near[0]}" if len(near) == 1 else ""
            add(profile.problem(path, f"SGLang {version.version} has no flag {name}{hint}"))
        if takes is None:  # unknown flag (refused above) or no arity data: skip its values
            while i < len(words) and not _is_option(words[i]):
                i += 1
            continue
        if eq:
            if takes == "0":
                add(profile.problem(path, f"{name} takes no value: write {name} alone"))
            continue
        least, most = _COUNTS.get(takes, (0, 1 << 30))
        count = 0
        while count < most and i < len(words) and not _is_option(words[i]):
            i += 1
            count += 1
        if count < least:
            add(profile.problem(path, f"{name} needs a value right after it"))


def _secrets(profile, add) -> None:
    """Secret-looking env keys and values anywhere in the profile."""
    for key in profile.data["server"].get("env") or {}:
        if SECRET_ENV.fullmatch(key):
            if key.startswith(("HF_", "HUGGING")):
                howto = HF_TOKEN_HOWTO
            elif key.endswith("API_KEY"):
                howto = f"for the server's API key {API_KEY_HOWTO}"
            else:
                howto = f"for the server's API key {API_KEY_HOWTO}; {HF_TOKEN_HOWTO}"
            add(profile.problem(("server", "env", key), f"{key}: {SECRET_WHY}; {howto}"))
    for path, value in _strings(profile.data, ()):
        if path[:2] == ("server", "env") and SECRET_ENV.fullmatch(str(path[-1])):
            continue  # already refused by its name
        if SECRET_VALUE.search(value):
            howto = HF_TOKEN_HOWTO if "hf_" in value else \
                f"for the server's API key {API_KEY_HOWTO}; {HF_TOKEN_HOWTO}"
            add(profile.problem(path, f"looks like a token or key: {SECRET_WHY}; {howto}"))


def _strings(data, path):
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _strings(value, path + (key,))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _strings(value, path + (i,))
    elif isinstance(data, str):
        yield path, data


def _service(profile, service, add) -> None:
    user, name = service["user"], service["name"]
    if user in SYSTEM_USERS or user.startswith("systemd-"):
        add(profile.problem(("service", "user"), f"{user!r} is a system or login account: the server runs model "
                            "code (trust_remote_code) and must run as a dedicated unprivileged user, e.g. sglang"))
    elif user == GATE_USER:
        add(profile.problem(("service", "user"), f"{user!r} is the gate's own user (it runs the load client "
                            "against the server): the server needs a user of its own, e.g. sglang"))
    elif user == FETCH_USER:
        add(profile.problem(("service", "user"), f"{user!r} owns the checkpoints (it downloads and verifies them): "
                            "the server must not be able to change them; it needs a user of its own, e.g. sglang"))
    if name in SYSTEM_UNITS or name.startswith(SYSTEM_UNIT_PREFIXES):
        add(profile.problem(("service", "name"), f"{name!r} collides with a system unit or a dsv4deploy folder: "
                            "pick a name of its own, e.g. sglang or sglang-ctx8k"))


def ssh_user_problem(profile: Profile, ssh_user: str | None) -> Problem | None:
    """service.user as the inventory's SSH user (the deploy's own login, with sudo or not): the
    deploy would set that account's shell to nologin. The denylist above is the first line; the
    host's accounts are judged again before any change (dsv4deploy/host/accounts.py)."""
    user = profile.data["service"]["user"]
    if not ssh_user or user != ssh_user:
        return None
    return profile.problem(("service", "user"), f"{user!r} is the inventory's SSH user, the account this deploy "
                           "logs in as: the deploy would set its shell to nologin; the server needs a user of its "
                           "own, e.g. sglang")


def _env(profile, server, add) -> None:
    for key in server.get("env") or {}:
        path = ("server", "env", key)
        if key in MANAGED_ENV:
            add(profile.problem(path, f"{key} is set by the rendered unit ({key}={MANAGED_ENV[key]}); remove it"))
        elif key in HOME_ENV:
            add(profile.problem(path, f"{key} is set by the rendered unit to the release's own folder (a new "
                                "venv starts with an empty home and caches); remove it"))
        elif key.startswith("NCCL_"):
            add(profile.problem(path, f"{key}: NCCL variables go in nccl.overrides (nccl.env is read after "
                                "Environment= and would silently win)"))


def _memory(profile, b: Budget, add) -> None:
    frac = ("server", "mem_fraction_static")
    if b.kv_pool_gib <= 0:
        add(profile.problem(frac, f"weights need {b.weights_gib:.1f} GiB per GPU but the static share is "
                            f"{b.static_gib:.1f} GiB ({b.fraction} x {b.capacity_gib:.1f} GiB): no room for the KV cache"))
        return
    if not b.fits:
        add(profile.problem(frac, (
            f"CUDA-graph capture would run out of GPU memory: headroom {b.headroom_gib:.1f} GiB "
            f"(capacity {b.capacity_gib:.1f} - static {b.static_gib:.1f} - CUDA context {b.cuda_context_gib:.1f}) "
            f"< reserve {b.reserve_gib:.1f} GiB (decode graphs up to bs "
            f"{profile.data['server'].get('cuda_graph_max_bs_decode')} over {b.allreduce_path} all-reduce "
            f"{b.graph_gib:.1f} + activations {b.activations_gib:.1f} + NCCL {b.nccl_gib:.1f} + margin "
            f"{b.margin_gib:.1f}); use mem_fraction_static <= {b.max_safe_text} or a smaller "
            f"cuda_graph_max_bs_decode" + (f" (max safe fraction {b.max_safe_text} on {b.reserve_source})"
                                           if b.measured else ""))))
    if b.kv_tokens < b.context_length:
        add(profile.problem(frac, f"KV pool {b.kv_pool_gib:.1f} GiB holds {b.kv_tokens:,} tokens, less than one "
                            f"full-context request ({b.context_length:,}); lower context_length or raise the fraction"))
    elif b.full_context_requests < b.max_running_requests:
        add(profile.problem(("server", "max_running_requests"),
                            f"KV pool holds {b.full_context_requests:.1f} full-context requests "
                            f"({b.kv_tokens:,} tokens / {b.context_length:,}), fewer than "
                            f"max_running_requests {b.max_running_requests}", "warning"))
