"""The faults' test profiles: the baseline with its own context length each (the twin's fault file
matches it with match_argv, so a fault hits the new release and not the one a rollback restores)
and a gate short enough to run many times."""

from __future__ import annotations

from pathlib import Path

from ct200twin.faultlab.tool import REPO

QUICK_GATE = """gate:
  levels:
    - {concurrency: 1, num_prompts: 2, input_len: 256, output_len: 32, min_output_throughput: 10}
    - {concurrency: 16, num_prompts: 16, input_len: 256, output_len: 32, min_output_throughput: 120}
    - {concurrency: 64, num_prompts: 64, input_len: 256, output_len: 32, min_output_throughput: 300}
"""
# One short level: enough to prove the server answers at speed, for faults that are not about the gate.
TINY_GATE = """gate:
  warmup_requests: 1
  levels:
    - {concurrency: 8, num_prompts: 8, input_len: 64, output_len: 16, min_output_throughput: 10}
"""
# Long enough to cut in the middle (the client runs a few seconds), short enough to run twice.
MID_GATE = """gate:
  warmup_requests: 1
  levels:
    - {concurrency: 16, num_prompts: 32, input_len: 256, output_len: 128, min_output_throughput: 100}
"""
BUDGET_GATE = """gate:
  budget_s: 10
  early_pass_margin: null
  warmup_requests: 1
  levels:
    - {concurrency: 4, num_prompts: 64, input_len: 256, output_len: 256, min_output_throughput: 10}
"""
REVISION_11 = "1" * 40      # fault 11's variant pins another revision: a new model folder to fill


def variant(context_length: int, gate: str = TINY_GATE, extra: str = "", base: str = "nvfp4-ctx8k") -> str:
    """A test profile: `base` with its own context length (which the twin's fault file can match
    with match_argv, so a fault hits this release and not the one a rollback restores)."""
    return f"extends: {base}\nserver:\n  context_length: {context_length}\n{extra}{gate}"


def write_profiles(folder: Path, variants: dict[str, str]) -> Path:
    """The shipped profiles plus `variants` ({name: yaml}) in `folder` (DSV4_PROFILES_DIR)."""
    folder.mkdir(parents=True, exist_ok=True)
    for src in (REPO / "profiles").glob("*.yaml"):
        (folder / src.name).write_text(src.read_text())
    for name, text in variants.items():
        (folder / f"{name}.yaml").write_text(text)
    return folder


def fresh_variants(folder: Path, taken: set[str], prefix: str, context_length: int, room: int = 511):
    """Profiles PREFIX-1, PREFIX-2, ... (each `variant(context_length + n)`, written into FOLDER as
    it is drawn), skipping the names in TAKEN (profiles the host's releases name): each argv is one
    no release on the host passed the launch check with, so a run of it takes the launch check (which
    runs only when its inputs change: dsv4deploy/tasks/venv.py launch_check_plan)."""
    for n in range(1, room + 1):
        name = f"{prefix}-{n}"
        if name not in taken:
            (folder / f"{name}.yaml").write_text(variant(context_length + n))
            yield name
    raise RuntimeError(f"no fresh {prefix}-N left (1..{room} are on the host): wipe the lab's twin "
                       "(bench/faults.py without --keep)")


# fault 15: three TP2 replicas (GPUs 0-1, 2-3, 4-5), a change rolling across them, the set shrunk
# to two, and the two behind another routing policy (an smg change)
F15_TP2 = """extends: nvfp4-ctx8k-dp2
server:
  tp_size: 2
  context_length: %d
  mem_fraction_static: 0.88
replicas:
  count: %d
  gpus: %s
%s"""


def f15_set(context_length: int, count: int, policy: str = "") -> str:
    gpus = "[" + ", ".join(f"[{2 * i}, {2 * i + 1}]" for i in range(count)) + "]"
    return F15_TP2 % (context_length, count, gpus, f"  gateway:\n    policy: {policy}\n" if policy else "") + TINY_GATE


VARIANTS = {
    "f15set3": f15_set(4096, 3),
    "f15set3-b": f15_set(3840, 3),
    "f15set2": f15_set(3840, 2),
    "f15set2-p": f15_set(3840, 2, "random"),
    # fault 14: a replica set (two twin servers behind smg) and a change that rolls across it
    "f14set": f"extends: nvfp4-ctx8k-dp2\n{QUICK_GATE}",
    "f14set-b": f"extends: nvfp4-ctx8k-dp2\nserver:\n  context_length: 7936\n{QUICK_GATE}",
    "f1crash": variant(9216),
    "f2never": variant(10240, extra="service:\n  health_timeout_s: 10\n"),
    "f3errors": variant(11264, gate=QUICK_GATE),
    "f4midgate": variant(13312, gate=QUICK_GATE),
    "f5stale": variant(14336),
    # fault 6's cuts deploy fresh_variants: f6cut-N, context 15360 + N (faults.F6_CUT_CONTEXT)
    "f6gate": variant(15872, gate=MID_GATE),
    "f7twice": variant(17408),
    "f8rollback": variant(18432),
    "f9weights": variant(19456),
    "f10gpus": variant(21504),
    "f10gpus-b": variant(26624),
    "f11disk": variant(22528, extra=f"model:\n  revision: \"{REVISION_11}\"\n"),
    "f12reboot": variant(23552),
    "f13budget": variant(25600, gate=BUDGET_GATE),
    "f13ok": variant(25600),
}
