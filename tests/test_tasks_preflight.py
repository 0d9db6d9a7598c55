"""Preflight's judgements that need no host (tasks/preflight.py)."""

from dsv4deploy.render.layout import MODELS
from dsv4deploy.tasks.preflight import disk_problem


def test_weights_that_fit_with_five_percent_spare_pass():
    assert disk_problem(1100 * 1024, need_gib=1000) is None
    assert disk_problem(1050 * 1024, need_gib=1000) is None


def test_a_disk_too_small_says_what_is_free_and_what_is_needed():
    assert disk_problem(1000 * 1024, need_gib=1000) == \
        f"not enough disk for the weights under {MODELS}: 1000.0 GiB free, 1050.0 GiB needed"
    assert "0.0 GiB free" in disk_problem(0, need_gib=1)       # a full disk


def test_a_failed_df_is_not_reported_as_a_full_disk():
    said = disk_problem(None, need_gib=1000)
    assert said.startswith(f"could not read the free disk space under {MODELS}") and "GiB free" not in said
