"""Host paths: a venv's name says what it holds, so two different venvs never share a path."""

from __future__ import annotations

import re

from dsv4deploy.render.layout import venv_id


def test_plain_pypi_venvs_keep_their_patch_set_name():
    assert venv_id({"patches": []}) == "nopatch"
    one = venv_id({"patches": [{"sha256": "a" * 64}]})
    assert len(one) == 12 and one != "nopatch"


def test_extras_index_urls_and_the_lock_change_the_name():
    base = {"patches": [{"sha256": "a" * 64}]}
    names = {venv_id(base), venv_id({**base, "extras": ["blackwell"]}),
             venv_id({**base, "index_url": "https://pypi.example/simple"}),
             venv_id({**base, "extra_index_urls": ["https://download.pytorch.org/whl/cu130"]}),
             venv_id(base, lock_sha256="b" * 64), venv_id(base, lock_sha256="c" * 64),
             venv_id({**base, "indexes": [{"name": "pytorch", "url": "https://x.example/simple", "packages": ["torch"]}]}),
             venv_id({**base, "indexes": [{"name": "pytorch", "url": "https://x.example/simple",
                                           "packages": ["torch", "triton"]}]})}
    assert len(names) == 8
    assert venv_id({**base, "extras": ["x", "y"]}) == venv_id({**base, "extras": ["y", "x"]})


def _lock_pins(text: str, python: str) -> dict[str, str]:
    """name -> version of a hashed lock (`name==version ; marker \\` then `--hash=...` lines) as
    one Python on Linux x86_64 installs it: continuation lines joined, markers evaluated."""
    from packaging.requirements import Requirement

    env = {"python_version": python, "python_full_version": python + ".0", "sys_platform": "linux",
           "platform_machine": "x86_64", "platform_python_implementation": "CPython", "implementation_name": "cpython"}
    pins: dict[str, str] = {}
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        req = Requirement(line.split(" --hash=", 1)[0])
        if req.marker is None or req.marker.evaluate(env):
            (spec,) = req.specifier
            assert spec.operator == "==" and req.name not in pins, line
            pins[req.name] = spec.version
    return pins


def test_the_0523_lock_pins_what_sglang_pins():
    """The lock holds the venv's whole closure, sglang itself included, one `name==version` per
    package for each Python the hosts run, agreeing with the wheel's own pins (torch and
    flashinfer for CUDA 13); it names the venv."""
    from checkout import load_profile
    from dsv4deploy.render.layout import Layout
    from dsv4deploy.sglang.versions import lock_file, lock_sha256

    for python in ("3.11", "3.12"):
        pins = _lock_pins(lock_file("0.5.23").read_text(), python)
        assert len(pins) > 100 and pins["sglang"] == "0.5.23", python
        assert pins["torch"] == "2.14.1" and pins["flashinfer-python"] == "0.7.2" and "sglang-kernel" in pins
        assert pins["cuda-toolkit"].startswith("13.")
    data = load_profile("nvfp4-ctx8k").data
    assert Layout.of(data).patchset == venv_id(data["sglang"], lock_sha256("0.5.23"))
