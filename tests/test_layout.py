"""Host paths: a venv's name says what it holds, so two different venvs never share a path."""

from __future__ import annotations

from dsv4deploy.layout import venv_id


def test_plain_pypi_venvs_keep_their_patch_set_name():
    assert venv_id({"patches": []}) == "nopatch"
    one = venv_id({"patches": [{"sha256": "a" * 64}]})
    assert len(one) == 12 and one != "nopatch"


def test_extras_index_urls_and_the_lock_change_the_name():
    base = {"patches": [{"sha256": "a" * 64}]}
    names = {venv_id(base), venv_id({**base, "extras": ["blackwell"]}),
             venv_id({**base, "index_url": "https://pypi.example/simple"}),
             venv_id({**base, "extra_index_urls": ["https://download.pytorch.org/whl/cu130"]}),
             venv_id(base, lock_sha256="b" * 64), venv_id(base, lock_sha256="c" * 64)}
    assert len(names) == 6
    assert venv_id({**base, "extras": ["x", "y"]}) == venv_id({**base, "extras": ["y", "x"]})
