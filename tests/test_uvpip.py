"""The control node's installer (dsv4deploy/host/uvpip.py): pip's configuration, as `pip config list`
prints it, carried to uv, so that a machine set up for pip (a mirror, a wheel folder, a
corporate CA) installs the control venv from the same places."""

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dsv4deploy.host import uvpip

REPO = Path(__file__).resolve().parent.parent

LISTING = """:env:.cert='/etc/ssl/certs/ca-certificates.crt'
:env:.default-timeout='180'
:env:.find-links='/opt/wheels'
global.cert='/etc/ssl/certs/other.crt'
global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'
global.find-links='/srv/old-wheels'
global.index-url='https://mirror.example/simple'
install.index-url='https://install-mirror.example/simple'
"""


def test_the_highest_precedence_section_wins_and_values_split():
    got = uvpip.pip_settings(LISTING)
    assert got["find-links"] == ["/opt/wheels"]                 # PIP_FIND_LINKS over global
    assert got["cert"] == ["/etc/ssl/certs/ca-certificates.crt"]
    assert got["index-url"] == ["https://install-mirror.example/simple"]   # install.* over global.*
    assert got["extra-index-url"] == ["file:///opt/pypi/simple", "file:///opt/pypi-more/simple"]
    assert "default-timeout" not in got


def test_uv_gets_the_same_indexes_best_match_and_the_cert_by_environment():
    args, env = uvpip.uv_arguments(uvpip.pip_settings(LISTING))
    assert args == ["--index-url", "https://install-mirror.example/simple",
                    "--extra-index-url", "file:///opt/pypi/simple", "--extra-index-url", "file:///opt/pypi-more/simple",
                    "--find-links", "/opt/wheels", "--index-strategy", "unsafe-best-match"]
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt"}


def test_an_index_the_command_gives_wins_over_the_configurations():
    args, _ = uvpip.uv_arguments(uvpip.pip_settings(LISTING), ["--index-url", "https://profile.example/simple",
                                                                "--index-strategy", "first-index"])
    assert "--index-url" not in args and "--index-strategy" not in args and "--extra-index-url" in args


def test_no_pip_configuration_is_uv_defaults_with_the_systems_certificates_as_pip():
    assert uvpip.uv_arguments(uvpip.pip_settings("")) == (["--system-certs"], {})
    # a line pip never prints (no quotes, a stray value) is ignored, not guessed at
    assert uvpip.pip_settings("global.index-url=https://x\nnonsense\n") == {}


def test_a_proxy_in_pip_conf_reaches_uv_as_https_proxy():
    _, env = uvpip.uv_arguments(uvpip.pip_settings("global.proxy='http://proxy.local:3128'\n"))
    assert env == {"HTTPS_PROXY": "http://proxy.local:3128"}


def test_the_command_line_refuses_what_it_does_not_know():
    out = subprocess.run([sys.executable, "-m", "dsv4deploy.host.uvpip", "instal"], capture_output=True, text=True)
    assert out.returncode == 2 and "usage:" in out.stderr and "Traceback" not in out.stderr


def test_a_bootstrap_that_cannot_reach_an_index_fails_with_a_message_not_a_traceback(tmp_path):
    env = {"DSV4_UV_HOME": str(tmp_path / "uv"), "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_NO_INDEX": "",
           "PIP_FIND_LINKS": "", "PIP_EXTRA_INDEX_URL": "", "PIP_RETRIES": "0", "PIP_TIMEOUT": "1",
           "PIP_CONFIG_FILE": "/dev/null", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "dsv4deploy.host.uvpip", "path"], capture_output=True, text=True,
                         env=env, cwd=Path(__file__).resolve().parent.parent, timeout=120)
    assert out.returncode == 1 and "could not bootstrap uv" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "uv" / "bin" / "uv").exists()


def test_pips_configuration_is_read_by_the_real_pip_not_one_the_directory_or_pythonpath_plants(tmp_path, monkeypatch):
    """On the host root runs uvpip.py in the SSH login's directory, with whatever PYTHONPATH
    /etc/environment sets: a `pip` package planted there must not answer `pip config list` (it
    would choose the index the venvs are filled from, as root)."""
    plant = tmp_path / "pip"
    plant.mkdir()
    (plant / "__init__.py").write_text("")
    (plant / "__main__.py").write_text("print(\"global.index-url='http://planted.invalid/simple'\")\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setattr(uvpip, "uv", lambda home: tmp_path / "uv")
    for var in [v for v in list(__import__("os").environ) if v.startswith("PIP_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://from-pip-env.example/simple")
    argv, _ = uvpip.install_command("/v/bin/python", ["x==1"], uvpip.UvHome(tmp_path, tmp_path), {})
    assert "http://planted.invalid/simple" not in argv
    assert argv[argv.index("--extra-index-url") + 1] == "https://from-pip-env.example/simple"   # the real pip's
    planted = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    assert "planted.invalid" in planted          # the plant works on a python that is not isolated


# --- issue 37: uv's own bootstrap is hash-checked; no http:// index or wheel folder ----------------

def test_a_planted_uv_wheel_is_refused_by_the_bootstrap(tmp_path):
    """A wheel folder (or index) that serves another file under uv's name: pip checks it against
    data/uv.requirements' sha256s and installs nothing."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / f"uv-{uvpip.UV_VERSION}-py3-none-any.whl", "w") as whl:
        whl.writestr("uv/__init__.py", "print('planted')\n")
    env = {"DSV4_UV_HOME": str(tmp_path / "uv"), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels),
           "PIP_CONFIG_FILE": "/dev/null", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "dsv4deploy.host.uvpip", "path"], capture_output=True, text=True,
                         env=env, cwd=REPO, timeout=120)
    assert out.returncode == 1 and "could not bootstrap uv" in out.stderr, out.stderr
    assert "DO NOT MATCH THE HASHES" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "uv" / "bin" / "uv").exists()


def test_the_bootstrap_pins_every_wheel_of_the_version_it_runs():
    text = uvpip.requirements_file().read_text()
    assert f"uv=={uvpip.UV_VERSION} " in text and len(re.findall(r"--hash=sha256:[0-9a-f]{64}", text)) >= 4


@pytest.mark.parametrize("listing,named", [
    ("global.index-url='http://mirror.local/simple'\n", "index-url http://mirror.local/simple"),
    ("global.extra-index-url='https://ok.example/simple HTTP://plain.example/simple'\n",
     "extra-index-url HTTP://plain.example/simple"),
    (":env:.find-links='http://wheels.local/'\n", "find-links http://wheels.local/"),
    ("global.index-url='ftp://old.example/simple'\n", "index-url ftp://old.example/simple"),
])
def test_an_index_over_http_in_pips_configuration_is_refused(listing, named):
    (found,) = uvpip.refused_locations(uvpip.pip_settings(listing))
    assert found.endswith(named) and "pip's configuration" in found


def test_https_file_urls_and_folders_are_where_packages_may_come_from():
    assert uvpip.refused_locations(uvpip.pip_settings(LISTING)) == []
    given = ["--index-url", "https://pypi.org/simple", "--find-links", "/opt/wheels", "--index",
             "torch=https://download.pytorch.org/whl/cu130", "--find-links", "file:///srv/wheels", "sglang==1"]
    assert uvpip.refused_locations({}, given) == []


def test_an_http_index_the_command_gives_is_refused_too():
    assert uvpip.refused_locations({}, ["--index", "pytorch=http://x.example/simple", "x"]) == [
        "--index pytorch=http://x.example/simple"]
    assert uvpip.refused_locations({}, ["--extra-index-url", "http://x.example/simple"]) != []


def test_an_http_index_in_pips_environment_stops_the_install_before_uv_runs(tmp_path):
    env = {"DSV4_UV_HOME": str(tmp_path / "uv"), "PIP_CONFIG_FILE": "/dev/null", "PATH": "/usr/bin:/bin",
           "PIP_EXTRA_INDEX_URL": "http://mirror.local/simple"}
    out = subprocess.run([sys.executable, "-m", "dsv4deploy.host.uvpip", "install", "--python", "/v/bin/python", "x==1"],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert "refused to install from pip's configuration" in out.stderr
    assert "PIP_EXTRA_INDEX_URL): extra-index-url http://mirror.local/simple" in out.stderr
    assert not (tmp_path / "uv").exists()           # refused before any bootstrap


# --- more than one index: each package named to the index it comes from -------------------------

def _wheel(index: Path, name: str, version: str, requires: str = "") -> None:
    """A pure wheel NAME-VERSION on the PEP 503 index folder INDEX whose module says which index it is."""
    import base64
    import hashlib
    folder = index / name
    folder.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": f"WHERE = {index.parent.name!r}\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{requires}",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [f"{k},sha256={base64.urlsafe_b64encode(hashlib.sha256(v.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(v)}" for k, v in files.items()] + [f"{info}/RECORD,,"]
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as whl:
        for k, v in {**files, f"{info}/RECORD": "\n".join(record) + "\n"}.items():
            whl.writestr(k, v)
    links = "".join(f'<a href="{w.name}">{w.name}</a>' for w in sorted(folder.glob("*.whl")))
    (folder / "index.html").write_text(f"<html><body>{links}</body></html>")
    (index / "index.html").write_text("<html><body>" + "".join(
        f'<a href="{d.name}/">{d.name}</a>' for d in sorted(index.iterdir()) if d.is_dir()) + "</body></html>")


def test_a_pinned_package_comes_from_its_index_only_and_no_other_from_there(tmp_path, monkeypatch):
    """`private` has torchish 1.0 and sharedlib 1.0; the default index has torchish 2.0 (newer: best
    match would take it), sharedlib 1.0 and app, which needs both. Pinned, torchish comes from
    `private` and sharedlib, which `private` also has but is not named for, from the default."""
    uv_bin = uvpip.uv(uvpip.UvHome.of(os.environ, REPO))
    private, public = tmp_path / "private" / "simple", tmp_path / "public" / "simple"
    _wheel(private, "torchish", "1.0")
    _wheel(private, "sharedlib", "1.0")
    _wheel(public, "torchish", "2.0")
    _wheel(public, "sharedlib", "1.0")
    _wheel(public, "app", "1.0", "Requires-Dist: torchish\nRequires-Dist: sharedlib\n")
    venv = tmp_path / "venv"
    assert subprocess.run([uv_bin, "venv", "-q", "--python", sys.executable, venv]).returncode == 0
    for var in [v for v in os.environ if v.startswith("PIP_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    home = uvpip.UvHome(uv_bin.parent.parent, tmp_path / "cache")
    argv, env = uvpip.install_command(str(venv / "bin" / "python"),
                                      ["--no-config", "--default-index", public.as_uri(),
                                       uvpip.PINNED_INDEX, f"private:torchish={private.as_uri()}", "app"], home, os.environ)
    out = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    got = subprocess.run([venv / "bin" / "python", "-c", "import torchish, sharedlib; print(torchish.WHERE, "
                          "sharedlib.WHERE)"], capture_output=True, text=True)
    assert got.stdout.split() == ["private", "public"], got.stdout + got.stderr


@pytest.mark.parametrize("value", ["pytorch=https://x.example/simple", "pytorch:torch=http://x.example/simple",
                                   ":torch=https://x.example/simple", "pytorch:torch=/srv/simple"])
def test_a_pinned_index_that_is_not_name_packages_and_https_stops_the_install(tmp_path, value):
    env = {"DSV4_UV_HOME": str(tmp_path / "uv"), "PIP_CONFIG_FILE": "/dev/null", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "dsv4deploy.host.uvpip", "install", "--python", "/v/bin/python",
                          uvpip.PINNED_INDEX, value, "x==1"], capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr and "--pinned-index" in out.stderr, out.stderr
