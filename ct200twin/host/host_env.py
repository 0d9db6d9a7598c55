"""This machine's environment, carried into a twin's root at every boot so that apt and pip work
there as they work here: the CA bundle, DNS, apt sources (this machine's when it runs the same
Debian release) and proxies, the pip configuration, the proxy variables of SSH sessions.

Not this machine's local package folders: a find-links folder or a file:// index named by pip's
configuration (or PIP_* variables) is left out, so a twin installs what the registries serve, as
CT200 does, and a wheel that only this machine holds can never make a twin deploy pass.
DSV4_SIM_PIP_LOCAL=1 carries them in (bind-mounted read-only: ``bind_mounts``), e.g. offline.
"""

from __future__ import annotations

import configparser
import contextlib
import os
import re
from pathlib import Path
from typing import Iterable

from ct200twin.host.files import _guard, _mkdir, _write
from ct200twin.host.rootfs import SUITE, _mirror


def _host_ca_bundle() -> Path | None:
    for cand in (os.environ.get("SSL_CERT_FILE"), os.environ.get("REQUESTS_CA_BUNDLE"),
                 "/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"):
        if cand and Path(cand).is_file():
            return Path(cand)
    return None


def _host_os_codename() -> str:
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return ""
    m = re.search(r"^VERSION_CODENAME=\"?([^\"\n]*)", text, re.M)
    ids = re.search(r"^ID=\"?([^\"\n]*)", text, re.M)
    return f"{ids.group(1) if ids else ''}:{m.group(1) if m else ''}"


LOCAL_SOURCES = os.environ.get("DSV4_SIM_PIP_LOCAL") == "1"
_PIP_TWIN_PATHS = ("/etc/pip.conf", "/etc/xdg/pip/pip.conf", "/root/.pip/pip.conf", "/root/.config/pip/pip.conf",
                   "/etc/dsv4deploy-twin/pip.conf")
_SOURCE_KEYS = ("find-links", "find_links", "index-url", "index_url", "extra-index-url", "extra_index_url")
_SOURCE_ENV = ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")


def _is_local(token: str) -> bool:
    return token.startswith(("file:", "/"))


def _without_local_sources(value: str) -> str:
    """A find-links / index value with this machine's folders left out (unless DSV4_SIM_PIP_LOCAL=1)."""
    return value if LOCAL_SOURCES else " ".join(t for t in value.split() if not _is_local(t))


def _pip_config_files() -> list[tuple[Path, str]]:
    """(host file, path in the twin) for the pip configuration that applies here (none when
    PIP_CONFIG_FILE is os.devnull: pip then reads no file either)."""
    if os.environ.get("PIP_CONFIG_FILE") == os.devnull:
        return []
    home = Path.home()
    pairs = [(Path("/etc/pip.conf"), "/etc/pip.conf"),
             (Path("/etc/xdg/pip/pip.conf"), "/etc/xdg/pip/pip.conf"),
             (home / ".pip/pip.conf", "/root/.pip/pip.conf"),
             (home / ".config/pip/pip.conf", "/root/.config/pip/pip.conf")]
    env = os.environ.get("PIP_CONFIG_FILE")
    if env and Path(env).is_file():
        pairs.append((Path(env), "/etc/dsv4deploy-twin/pip.conf"))
    return [(h, t) for h, t in pairs if h.is_file()]


_PIP_PATH_KEYS = ("find-links", "find_links", "index-url", "index_url", "extra-index-url",
                  "extra_index_url", "constraint", "requirement", "cert", "client-cert")
_PIP_PATH_ENV = ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT", "PIP_CERT")


def _local_paths(values: Iterable[str]) -> list[Path]:
    out = []
    for value in values:
        for tok in value.split():
            if tok.startswith("file://"):
                tok = tok[len("file://"):]
            if tok.startswith("/"):
                out.append(Path(tok))
    return out


def _pip_local_paths() -> list[Path]:
    """Local files/dirs the pip configuration points at (certificates, constraints; find-links and
    file:// indexes only with DSV4_SIM_PIP_LOCAL=1)."""
    values = [_without_local_sources(os.environ[k]) if k in _SOURCE_ENV else os.environ[k]
              for k in _PIP_PATH_ENV if os.environ.get(k)]
    for host_file, _ in _pip_config_files():
        cp = configparser.ConfigParser(interpolation=None, strict=False)
        with contextlib.suppress(configparser.Error, OSError):
            cp.read(host_file)
            for section in cp.sections():
                for key in _PIP_PATH_KEYS:
                    if cp.has_option(section, key):
                        value = cp.get(section, key)
                        values.append(_without_local_sources(value) if key in _SOURCE_KEYS else value)
    return [p for p in _local_paths(values) if p.exists()]


def _pip_config_text(host_file: Path) -> str:
    """HOST_FILE as the twin gets it: without this machine's local package folders (a key left
    empty is dropped), unless DSV4_SIM_PIP_LOCAL=1."""
    text = host_file.read_text()
    if LOCAL_SOURCES:
        return text
    cp = configparser.ConfigParser(interpolation=None, strict=False)
    try:
        cp.read_string(text)
    except configparser.Error:
        return ""                                   # pip could not read it either
    lines = [f"# {host_file} as the twin gets it: this machine's local package folders left out"]
    for section in cp.sections():
        lines.append(f"[{section}]")
        for key, value in cp.items(section, raw=True):
            kept = _without_local_sources(value) if key in _SOURCE_KEYS else value
            if kept.strip():
                lines.append(f"{key} = {kept}")
    return "\n".join(lines) + "\n"


_PROXY_ENV = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
              "ftp_proxy", "all_proxy", "ALL_PROXY")
_CARRY_ENV = _PROXY_ENV + ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONSTRAINT",
                           "PIP_TRUSTED_HOST", "PIP_DEFAULT_TIMEOUT", "PIP_CERT", "PIP_CONFIG_FILE")


def bind_mounts() -> list[Path]:
    """Host directories made visible read-only in every twin (local package mirrors)."""
    dirs: list[Path] = []
    for p in _pip_local_paths():
        if not p.is_dir():
            continue
        # a PEP 503 tree (.../simple) links to ../../files: share the whole tree
        d = p.parent if p.name == "simple" else p
        if d not in dirs and d != Path("/"):
            dirs.append(d)
    return dirs


def _sync_host_environment(root: Path) -> None:
    """Carry this machine's CA bundle, DNS, apt/pip proxies and mirrors into a twin root."""
    bundle = _host_ca_bundle()
    if bundle:
        data = bundle.read_bytes()
        _write(root / "etc/ssl/certs/ca-certificates.crt", data, 0o644)
        # survives update-ca-certificates inside the twin
        _write(root / "usr/local/share/ca-certificates/dsv4deploy-host-bundle.crt", data, 0o644)
    resolv = Path("/etc/resolv.conf")
    if resolv.exists():
        _write(root / "etc/resolv.conf", resolv.read_bytes(), 0o644)

    # apt: the host's sources when it is the same release, else Debian's own
    apt = root / "etc/apt"
    host_is_same = _host_os_codename() == f"debian:{SUITE}"
    host_sources = []
    if host_is_same:
        if Path("/etc/apt/sources.list").is_file() and Path("/etc/apt/sources.list").read_text().strip():
            host_sources.append(Path("/etc/apt/sources.list"))
        host_sources += sorted(p for p in Path("/etc/apt/sources.list.d").glob("*")
                               if p.suffix in (".list", ".sources") and p.is_file())
    managed = _mkdir(apt / "sources.list.d")
    for old in managed.glob("*"):
        old.unlink()
    if host_sources:
        _guard(apt / "sources.list").unlink(missing_ok=True)
        for src in host_sources:
            name = "host-sources.list" if src.name == "sources.list" else src.name
            text = src.read_text()
            _write(managed / name, text, 0o644)
            for ring in re.findall(r"[Ss]igned-[Bb]y[:=]\s*(/\S+?)\]?(?:\s|$)", text):
                hp = Path(ring)
                if hp.is_file() and not (root / ring.lstrip("/")).exists():
                    _write(root / ring.lstrip("/"), hp.read_bytes(), 0o644)
        for d in ("trusted.gpg.d", "keyrings"):
            for key in Path("/etc/apt", d).glob("*"):
                if key.is_file():
                    _write(apt / d / key.name, key.read_bytes(), 0o644)
    else:
        _guard(apt / "sources.list").unlink(missing_ok=True)
        mirror = _mirror()
        _write(managed / "debian.sources",
               f"Types: deb\nURIs: {mirror}\nSuites: {SUITE} {SUITE}-updates\nComponents: main\n"
               f"Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
               f"Types: deb\nURIs: http://deb.debian.org/debian-security\nSuites: {SUITE}-security\n"
               f"Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n", 0o644)
    conf = _mkdir(apt / "apt.conf.d")
    for old in conf.glob("50dsv4deploy-host-*"):
        old.unlink()
    for f in sorted(Path("/etc/apt/apt.conf.d").glob("*")):
        with contextlib.suppress(OSError, UnicodeDecodeError):
            text = f.read_text()
            if f.is_file() and "Acquire::" in text:
                _write(conf / f"50dsv4deploy-host-{f.name}", text, 0o644)
    proxy_lines = []
    for scheme in ("http", "https"):
        val = os.environ.get(f"{scheme}_proxy") or os.environ.get(f"{scheme.upper()}_PROXY")
        if val:
            proxy_lines.append(f'Acquire::{scheme}::Proxy "{val}";')
    _guard(conf / "50dsv4deploy-host-proxy").unlink(missing_ok=True)
    if proxy_lines:
        _write(conf / "50dsv4deploy-host-proxy", "\n".join(proxy_lines) + "\n", 0o644)

    # pip: config files and the local files they name (directories are bind-mounted)
    carried_files = _pip_config_files()
    for stale in set(_PIP_TWIN_PATHS) - {t for _, t in carried_files}:      # carried at an earlier boot
        _guard(root / stale.lstrip("/")).unlink(missing_ok=True)
    for host_file, twin_path in carried_files:
        _write(root / twin_path.lstrip("/"), _pip_config_text(host_file), 0o644)
    for p in _pip_local_paths():
        if p.is_file():
            _write(root / str(p).lstrip("/"), p.read_bytes(), 0o644)
    for d in bind_mounts():
        _mkdir(root / str(d).lstrip("/"))

    # environment of SSH sessions (pam_env)
    carried = {k: _without_local_sources(os.environ[k]) if k in _SOURCE_ENV else os.environ[k]
               for k in _CARRY_ENV if os.environ.get(k)}
    env_lines = [f'{k}="{v}"' for k, v in carried.items() if v.strip() and v != os.devnull]
    if os.environ.get("PIP_CONFIG_FILE") and Path(os.environ["PIP_CONFIG_FILE"]).is_file():
        env_lines = [ln for ln in env_lines if not ln.startswith("PIP_CONFIG_FILE=")]
        env_lines.append('PIP_CONFIG_FILE="/etc/dsv4deploy-twin/pip.conf"')
    _write(root / "etc/environment", "".join(ln + "\n" for ln in env_lines), 0o644)


ISOLATED_NO_PROXY = "localhost,127.0.0.1,::1"


def _isolated_environment(root: Path, proxy_url: str, direct: Iterable[str] = ()) -> None:
    """An isolated twin (its own network namespace, no route out) reaches the outside only through
    its proxy on this machine's end of the veth: apt, pip and SSH sessions are pointed at it,
    over whatever this machine's own proxy settings said (the twin could not reach those).
    DIRECT: addresses and names on the twin's own network (this machine's end of the veth), reached
    without the proxy, as a host reaches its LAN (a local hub) with them in no_proxy."""
    conf = _mkdir(root / "etc/apt/apt.conf.d")
    _guard(conf / "50dsv4deploy-host-proxy").unlink(missing_ok=True)
    # 60 sorts after the host's 50dsv4deploy-host-* copies: apt keeps the last value it reads
    _write(conf / "60dsv4deploy-fleet-proxy",
           f'Acquire::http::Proxy "{proxy_url}";\nAcquire::https::Proxy "{proxy_url}";\n'
           'Acquire::http::Pipeline-Depth "0";\n', 0o644)
    # pip: the proxy in the global file (sudo and root's sessions read it whatever their environment)
    pip_conf = root / "etc/pip.conf"
    cp = configparser.ConfigParser(interpolation=None, strict=False)
    with contextlib.suppress(configparser.Error, OSError, UnicodeDecodeError):
        if pip_conf.is_file():
            cp.read_string(pip_conf.read_text())
    if not cp.has_section("global"):
        cp.add_section("global")
    cp.set("global", "proxy", proxy_url)
    lines = ["# written by dsv4deploy sim: this machine's pip.conf, and the isolated twin's proxy"]
    for section in cp.sections():
        lines.append(f"[{section}]")
        lines += [f"{k} = {v}" for k, v in cp.items(section, raw=True)]
    _write(pip_conf, "\n".join(lines) + "\n", 0o644)
    env = root / "etc/environment"
    kept = []
    with contextlib.suppress(OSError):
        kept = [ln for ln in env.read_text().splitlines()
                if ln.strip() and ln.split("=", 1)[0] not in _PROXY_ENV]
    proxies = [f'{k}="{proxy_url}"' for k in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")]
    no_proxy = ",".join([ISOLATED_NO_PROXY, *direct])
    proxies += [f'{k}="{no_proxy}"' for k in ("no_proxy", "NO_PROXY")]
    _write(env, "".join(ln + "\n" for ln in kept + proxies), 0o644)
