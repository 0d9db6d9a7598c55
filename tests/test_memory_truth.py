"""One memory truth: over the grid users tune, every profile the validator's budget accepts starts
on the twin's memory model, and every one it refuses that the twin would start lies within the
stated safety band (memory_facts.SAFETY_MARGIN_GIB). Pure functions only: no twin boots."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ct200twin.server import memory as twin
from dsv4deploy.profile import memory_facts as facts
from dsv4deploy.profile import catalog
from dsv4deploy.profile.memory import budget

RTX = catalog.gpu("rtx-pro-6000-blackwell")
FLASH = catalog.model("nvidia/DeepSeek-V4-Flash-NVFP4")
FRACTIONS = [round(0.60 + 0.01 * i, 2) for i in range(36)]          # 0.60 .. 0.95
# The schema allows 1..4096: every size up to 64, then every size SGLang's capture list names
# (the graph count only changes there) and the schema's maximum.
BATCH_SIZES = sorted(set(range(1, 65)) | set(facts.decode_capture_batch_sizes(4096)))


def _twin_starts(tp: int, fraction: float, bs: int, nccl: bool) -> bool:
    try:
        plan = twin.plan_memory(twin.MemoryInputs(gpu_mem_mib=RTX.memory_mib, tp=tp, mem_fraction_static=fraction,
                                                  cuda_graph_max_bs_decode=bs, disable_custom_all_reduce=nccl,
                                                  max_running_requests=64))
    except twin.KVCacheError:
        return False
    return plan.fits


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_the_validator_accepts_only_what_the_twin_starts(tp):
    band = facts.SAFETY_MARGIN_GIB
    accepted = in_band = 0
    for nccl in (False, True):
        for bs in BATCH_SIZES:
            for fraction in FRACTIONS:
                b = budget({"tp_size": tp, "mem_fraction_static": fraction, "cuda_graph_max_bs_decode": bs,
                            "disable_custom_all_reduce": nccl, "context_length": 8192,
                            "max_running_requests": 64}, RTX, FLASH)
                ok = b.kv_pool_gib > 0 and b.fits
                starts = _twin_starts(tp, fraction, bs, nccl)
                where = f"TP{tp} {fraction} bs{bs} {'nccl' if nccl else 'custom'}"
                if ok:
                    accepted += 1
                    assert starts, f"{where}: the validator accepts what the twin crashes"
                elif starts:
                    in_band += 1
                    assert b.reserve_gib - band - 1e-9 <= b.headroom_gib < b.reserve_gib, (
                        f"{where}: refused {b.reserve_gib - b.headroom_gib:.2f} GiB short, outside the "
                        f"{band} GiB safety band")
    if tp >= 2:
        assert accepted and in_band      # the grid reaches both sides of the boundary


def test_the_campaign_points_hold_on_both_models():
    def check(tp, fraction, nccl=False):
        b = budget({"tp_size": tp, "mem_fraction_static": fraction, "cuda_graph_max_bs_decode": 32,
                    "disable_custom_all_reduce": nccl}, RTX, FLASH)
        return b.fits, _twin_starts(tp, fraction, 32, nccl)

    assert check(4, 0.85) == (False, False)        # the campaign's OOM at capture
    assert check(4, 0.70) == (True, True)          # it ran
    assert check(2, 0.92) == (True, True)          # SGLang's verified RTX PRO 6000 cell
    assert check(8, 0.75, nccl=True) == (True, True)   # the shipped nvfp4-tp8-nop2p


def test_the_twin_imports_only_the_products_memory_facts():
    tree = ast.parse(Path(twin.__file__).read_text())
    product = {node.module for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dsv4deploy")}
    assert product == {"dsv4deploy.profile.memory_facts"}
    facts_tree = ast.parse(Path(facts.__file__).read_text())
    imported = {node.module for node in ast.walk(facts_tree) if isinstance(node, ast.ImportFrom)}
    imported |= {a.name for node in ast.walk(facts_tree) if isinstance(node, ast.Import) for a in node.names}
    assert imported <= {"__future__", "dataclasses"}    # stdlib only: the twin ships this file alone
