"""The twin installs what the registries serve: this machine's local package folders (pip's
find-links, file:// indexes) are not carried into a twin unless DSV4_SIM_PIP_LOCAL=1 asks."""

from __future__ import annotations

from ct200twin.host import host_env

CONF = ("[global]\ncert = /etc/ssl/certs/ca-certificates.crt\nfind-links = {wheels}\n"
        "extra-index-url = file://{pypi}/simple https://mirror.example/simple\n")


def setup(tmp_path, monkeypatch, local: bool):
    wheels, pypi = tmp_path / "wheels", tmp_path / "pypi"
    (pypi / "simple").mkdir(parents=True)
    wheels.mkdir()
    conf = tmp_path / "pip.conf"
    conf.write_text(CONF.format(wheels=wheels, pypi=pypi))
    monkeypatch.setattr(host_env, "LOCAL_SOURCES", local)
    monkeypatch.setattr(host_env, "_pip_config_files", lambda: [(conf, "/etc/pip.conf")])
    for var in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT", "PIP_CERT"):
        monkeypatch.delenv(var, raising=False)
    return conf, wheels, pypi


def test_a_twin_gets_no_local_wheel_folder_and_keeps_the_rest(tmp_path, monkeypatch):
    conf, wheels, pypi = setup(tmp_path, monkeypatch, local=False)
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    text = host_env._pip_config_text(conf)
    assert str(wheels) not in text and str(pypi) not in text and "find-links" not in text
    assert "cert = /etc/ssl/certs/ca-certificates.crt" in text
    assert "extra-index-url = https://mirror.example/simple" in text         # a remote mirror stays
    assert host_env.bind_mounts() == []


def test_asked_for_the_local_folders_are_carried_in(tmp_path, monkeypatch):
    conf, wheels, pypi = setup(tmp_path, monkeypatch, local=True)
    assert host_env._pip_config_text(conf) == conf.read_text()
    assert set(host_env.bind_mounts()) == {wheels, pypi}


def test_pip_told_to_read_no_file_carries_none(monkeypatch):
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    assert host_env._pip_config_files() == []
