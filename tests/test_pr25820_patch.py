"""PR #25820 ("[NVIDIA] Support NVFP4 MoE for DeepSeek-V4") on the real SGLang 0.5.13.post1 wheel,
applied with the deploy's own commands, and what the patched code then does.

SGLang is the real wheel in the CPU parser venv (tests/tools/sglang_parser.py; built if missing,
never skipped). Its ``sglang`` package is copied into temp dirs (checked file by file against the
wheel's RECORD; the shared cache is never touched). The venv step's own code applies the patch:
``dsv4deploy.tasks.venv.patch_applied`` (the pyinfra operation, its body called with a host
stand-in that runs its fact's check here) yields the command, which runs here with ``sh -c``
as pyinfra runs it on the host. Both come from dsv4deploy.sglang.patching.

Shown:
- the backport goes in on the first run (exactly the seven files of the diff change, no
  ``.rej``/``.orig``), and the second run finds it applied and changes nothing;
- the patched copy detects the hybrid FP8+NVFP4 checkpoint where SGLang decides it (ModelConfig,
  the loader's quantization config, the DeepSeek-V4 MoE-runner default); the pristine copy, same
  venv, same config, does not (tests/tools/pr25820_probe.py);
- a diff that does not apply changes nothing at all (hash of the whole tree, before and after):
  the upstream diff on 0.5.13.post1, the backport on 0.5.23 (which has the PR), a corrupted last
  hunk (plain `patch` would leave that tree half patched), a wrong sha256;
- on the real 0.5.13 and 0.5.14 wheels: the backport applies to 0.5.13, and the upstream diff
  is already in 0.5.14 (its reverse dry-run succeeds), the floor the validator uses.

The probe needs four small pure-Python packages the parser venv lacks (EXTRA_DEPS); they are
installed once, --no-deps, under .cache/pr25820-probe/.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "tools"))
import sglang_parser  # noqa: E402

from dsv4deploy.sglang import patching  # noqa: E402
from dsv4deploy.sglang.patches import PR25820_PATCH, PR25820_SINCE, PR25820_UPSTREAM  # noqa: E402
from dsv4deploy.host import ops  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
OLD = PR25820_PATCH["sglang_version"]        # 0.5.13.post1, the newest release before the PR
NEW = "0.5.23"                                # has the PR (and a parser venv the suite builds anyway)
BACKPORT = REPO / PR25820_PATCH["file"]
UPSTREAM = REPO / PR25820_UPSTREAM["file"]
PROBE = Path(__file__).resolve().parent / "tools" / "pr25820_probe.py"
CACHE = REPO / ".cache" / "pr25820-probe"
EXTRA_DEPS = ("einops==0.8.2", "compressed-tensors==0.20.1", "loguru==0.7.3", "gguf==0.19.0")

# config.json shaped like nvidia/DeepSeek-V4-Flash-NVFP4's: the DeepSeek-V4-Flash architecture
# fields SGLang's ModelConfig reads, and a quantization_config of the NVIDIA ModelOpt hybrid kind
# (quant_method fp8 with FP8 128x128 blocks, MIXED_PRECISION, NVFP4 MoE experts in groups of 16,
# an ignore list). Written from public descriptions of those checkpoints, not copied from the file.
CHECKPOINT_CONFIG = {
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "max_position_embeddings": 1048576, "vocab_size": 129280, "hidden_size": 4096,
    "num_hidden_layers": 43, "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
    "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_lora_rank": 1024, "o_groups": 8,
    "sliding_window": 128, "compress_ratios": [0, 0] + [4, 128] * 20 + [4],
    "index_head_dim": 128, "index_n_heads": 64, "index_topk": 512,
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 6, "n_group": 8, "topk_group": 4, "scoring_func": "sqrtsoftplus",
    "swiglu_limit": 10.0, "hc_mult": 4, "num_nextn_predict_layers": 1, "rope_theta": 10000,
    "torch_dtype": "bfloat16",
    "quantization_config": {
        "quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "scale_fmt": "ue8m0",
        "weight_block_size": [128, 128], "quant_algo": "MIXED_PRECISION", "moe_quant_algo": "NVFP4",
        "group_size": 16, "ignore": ["*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"],
    },
}
DETECTED_LOG = ("sglang.srt.configs.model_config INFO Auto-detected hybrid FP8+NVFP4 checkpoint "
                "(NVFP4 MoE group_size=16, 4 exclude_modules)")


# --- helpers -----------------------------------------------------------------------------------

def _sh(cmd: str) -> subprocess.CompletedProcess:
    """As pyinfra runs a command on the host: `sh -c`."""
    return subprocess.run(["sh", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


class _LocalHost:
    """Stands in for pyinfra's `host` inside the operation body."""

    def __init__(self):
        self.noops: list[str] = []

    def noop(self, message: str) -> None:
        self.noops.append(message)


def deploy_patch(site: Path, patch_file: Path, strip: int = 2, sha256: str | None = None) -> dict:
    """What the venv step does for one profile patch: patch_applied's body decides (fact), the
    command it yields runs in `site`. Returns {"noop": bool, "commands": [...], "runs": [...]}."""
    sha256 = sha256 or hashlib.sha256(patch_file.read_bytes()).hexdigest()
    fake = _LocalHost()
    # the venv step's fact (PatchesApplied) runs this check for each patch
    applied = patching.parse_state(_sh(patching.state_command(str(site), str(patch_file), strip)).stdout.splitlines())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ops, "host", fake)
        commands = [c.get_raw_value() for c in ops.patch_applied._inner(
            directory=str(site), patch_file=str(patch_file), applied=applied, strip=strip, sha256=sha256)]
    runs = [_sh(c) for c in commands]
    return {"noop": bool(fake.noops), "commands": commands, "runs": runs,
            "ok": all(r.returncode == 0 for r in runs),
            "stderr": "".join(r.stderr for r in runs)}


def tree_digest(root: Path) -> str:
    """sha256 over every entry under `root`: path, kind, mode, and content (files) or target
    (links). Any byte, file, folder or permission that changes, changes it."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in [*sorted(dirnames), *sorted(filenames)]:
            path = Path(dirpath) / name
            st = path.lstat()
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                h.update(f"L {rel} {os.readlink(path)}\n".encode())
            elif path.is_dir():
                h.update(f"D {rel} {st.st_mode:o}\n".encode())
            else:
                h.update(f"F {rel} {st.st_mode:o} {hashlib.sha256(path.read_bytes()).hexdigest()}\n".encode())
    return h.hexdigest()


def file_digests(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*") if p.is_file()}


def leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.name.endswith((".rej", ".orig")) or p.name.startswith(".#"))


def patch_targets(patch_file: Path, strip: int = 2) -> set[str]:
    """The files a patch touches, relative to site-packages."""
    return {"/".join(line.split()[1].split("/")[strip:]) for line in patch_file.read_text().splitlines()
            if line.startswith("+++ ")}


def _site(version: str) -> Path:
    return next((sglang_parser.venv_dir(version) / "lib").glob("python3.*/site-packages"))


def copy_sglang(version: str, dest: Path) -> Path:
    """The real wheel's `sglang` package from the parser venv, into dest/ (a site-packages
    stand-in), bytecode left out; checked against the wheel's RECORD, file by file."""
    site = _site(version)
    shutil.copytree(site / "sglang", dest / "sglang", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    record = next(site.glob(f"sglang-{version}.dist-info/RECORD"))
    want = {}
    with open(record, newline="") as fh:
        for row in csv.reader(fh):
            if row and row[0].startswith("sglang/") and row[1].startswith("sha256="):
                want[row[0]] = row[1][len("sha256="):]
    got = {rel: base64.urlsafe_b64encode(bytes.fromhex(digest)).rstrip(b"=").decode()
           for rel, digest in file_digests(dest).items()}
    assert got == want, f"the copied sglang {version} is not the wheel's (RECORD differs)"
    return dest


def wheel_tree(version: str, dest: Path) -> Path:
    """sglang==version's wheel from PyPI (pip download --no-deps, kept under .cache), its
    `sglang/` unpacked into dest/."""
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    if not found:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                               "--only-binary", ":all:", "--python-version", "3.11",
                               "--dest", str(wheels), f"sglang=={version}"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.returncode == 0, proc.stdout[-3000:]
        found = sorted(wheels.glob(f"sglang-{version}-*.whl"))
    with zipfile.ZipFile(found[0]) as whl:
        whl.extractall(dest, members=[n for n in whl.namelist() if n.startswith("sglang/")])
    return dest


# --- fixtures ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def old_venv():
    """The SGLang 0.5.13.post1 parser venv (the real wheel, from its lock), built if missing."""
    return sglang_parser.ensure(OLD)


@pytest.fixture(scope="module")
def probe_deps(old_venv):
    """What the probe imports beyond the parser venv (pure Python, --no-deps), once, cached."""
    key = hashlib.sha256(json.dumps(EXTRA_DEPS).encode()).hexdigest()[:12]
    final = CACHE / f"deps-{key}"
    if not (final / ".complete").is_file():
        tmp = CACHE / f".deps-{key}.{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        proc = subprocess.run([str(old_venv), "-m", "pip", "install", "--quiet", "--no-deps",
                               "--only-binary", ":all:", "--disable-pip-version-check",
                               "--cache-dir", str(sglang_parser.PIP_CACHE), "--target", str(tmp),
                               *EXTRA_DEPS], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.returncode == 0, proc.stdout[-3000:]
        (tmp / ".complete").write_text("\n".join(EXTRA_DEPS) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
    return final


@pytest.fixture(scope="module")
def applied(old_venv, tmp_path_factory):
    """Two copies of the real 0.5.13.post1 sglang package; the backport deployed twice into one."""
    root = tmp_path_factory.mktemp("pr25820")
    pristine = copy_sglang(OLD, root / "pristine")
    patched = copy_sglang(OLD, root / "patched")
    before_files, before = file_digests(patched), tree_digest(patched)
    first = deploy_patch(patched, BACKPORT, sha256=PR25820_PATCH["sha256"])
    after_first_files, after_first = file_digests(patched), tree_digest(patched)
    second = deploy_patch(patched, BACKPORT, sha256=PR25820_PATCH["sha256"])
    after_second = tree_digest(patched)
    return {"pristine": pristine, "patched": patched, "first": first, "second": second,
            "before": before, "after_first": after_first, "after_second": after_second,
            "changed": {rel for rel in before_files if before_files[rel] != after_first_files.get(rel)}
            | (set(after_first_files) - set(before_files))}


@pytest.fixture(scope="module")
def probed(applied, old_venv, probe_deps, tmp_path_factory):
    """The probe's answer from each copy, same venv, same checkpoint config."""
    model = tmp_path_factory.mktemp("dsv4-checkpoint")
    (model / "config.json").write_text(json.dumps(CHECKPOINT_CONFIG, indent=1))
    out = {}
    for name in ("pristine", "patched"):
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env.update(PYTHONPATH=f"{applied[name]}{os.pathsep}{probe_deps}", PYTHONDONTWRITEBYTECODE="1",
                   CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1")
        proc = subprocess.run([str(old_venv), str(PROBE), str(model)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env, cwd=str(model))
        assert proc.returncode == 0, f"probe on the {name} copy failed:\n{proc.stderr[-4000:]}"
        out[name] = json.loads(proc.stdout)
        assert out[name]["sglang_file"] == str(applied[name] / "sglang" / "__init__.py")
        assert out[name]["sglang_version"] == OLD
    return out


# --- the backport goes in once -----------------------------------------------------------------

def test_the_backport_is_the_pinned_file():
    assert hashlib.sha256(BACKPORT.read_bytes()).hexdigest() == PR25820_PATCH["sha256"]
    assert hashlib.sha256(UPSTREAM.read_bytes()).hexdigest() == PR25820_UPSTREAM["sha256"]
    assert patch_targets(BACKPORT) == patch_targets(UPSTREAM)
    assert all(t.startswith("sglang/") for t in patch_targets(UPSTREAM))


def test_first_run_applies_exactly_the_diff(applied):
    first = applied["first"]
    assert not first["noop"] and len(first["commands"]) == 1
    assert first["ok"], first["stderr"]
    assert first["commands"][0] == patching.apply_command(
        str(applied["patched"]), str(BACKPORT), 2, sha256=PR25820_PATCH["sha256"])
    assert applied["changed"] == patch_targets(BACKPORT)
    assert leftovers(applied["patched"]) == []


def test_second_run_finds_it_applied_and_changes_nothing(applied):
    second = applied["second"]
    assert second["noop"] and second["commands"] == [] and second["runs"] == []
    assert applied["after_second"] == applied["after_first"] != applied["before"]
    # Even forced, the command never applies it twice: its forward dry-run refuses.
    forced = _sh(patching.apply_command(str(applied["patched"]), str(BACKPORT), 2,
                                        sha256=PR25820_PATCH["sha256"]))
    assert forced.returncode == 1 and "does not apply" in forced.stderr
    assert tree_digest(applied["patched"]) == applied["after_first"]
    assert leftovers(applied["patched"]) == []


# --- what the patched code does ----------------------------------------------------------------

def test_patched_sglang_detects_the_nvfp4_moe_checkpoint(probed):
    got = probed["patched"]
    assert got["nvfp4_moe_meta"] == {"group_size": 16,
                                     "exclude_modules": ["*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"]}
    assert DETECTED_LOG in got["log"]
    assert got["quantization"] == "fp8"          # no --quantization: SGLang resolves fp8 itself
    assert got["quant_config"] == "HybridFp8NvFp4Config" and got["quant_config_bases"][0] == "Fp8Config"
    nv = got["nvfp4_config"]
    assert nv["type"] == "ModelOptFp4Config" and nv["group_size"] == 16 and nv["checkpoint_nvfp4_serialized"]
    assert "model.decoder.*" in nv["exclude_modules"]
    assert not nv["routed_experts_excluded"] and nv["mtp_experts_excluded"]
    # With --moe-runner-backend auto the patched hook picks flashinfer_trtllm_routed (no sm_120
    # kernels); the profile's explicit marlin is kept.
    assert got["moe_runner_backend"] == {"auto": "flashinfer_trtllm_routed", "marlin": "marlin"}


def test_pristine_sglang_does_not(probed):
    """Negative control: the same wheel without the patch treats the checkpoint as plain FP8."""
    got = probed["pristine"]
    assert not got["has_nvfp4_moe_meta"] and got["nvfp4_moe_meta"] is None
    assert got["quant_config"] == "Fp8Config" and got["nvfp4_config"] is None
    assert got["moe_runner_backend"] == {"auto": "auto", "marlin": "marlin"}
    assert got["log"] == []


# --- a diff that does not apply changes nothing ------------------------------------------------

def _refused(site: Path, patch_file: Path, sha256: str | None = None) -> dict:
    before = tree_digest(site)
    result = deploy_patch(site, patch_file, sha256=sha256)
    assert not result["noop"], "the fact took a patch that is not in for applied"
    assert not result["ok"], f"{patch_file.name} applied to {site}"
    assert tree_digest(site) == before, "the tree changed although the patch did not apply"
    assert leftovers(site) == []
    return result


def test_upstream_diff_does_not_apply_to_0_5_13_post1(old_venv, tmp_path):
    """The real merge diff, unadapted: some hunks would apply, others not. Nothing changes."""
    site = copy_sglang(OLD, tmp_path / "site")
    result = _refused(site, UPSTREAM, PR25820_UPSTREAM["sha256"])
    assert "does not apply to" in result["stderr"] and "nothing was changed" in result["stderr"]
    assert "FAILED" in result["stderr"] and "flashinfer_trtllm.py" in result["stderr"]


def test_diffs_on_a_release_that_has_the_pr_change_nothing(tmp_path):
    """0.5.23 has PR #25820 (rewritten since): neither diff applies, neither is taken as in."""
    sglang_parser.ensure(NEW)
    site = copy_sglang(NEW, tmp_path / "site")
    for patch_file in (BACKPORT, UPSTREAM):
        assert "does not apply" in _refused(site, patch_file)["stderr"]


def test_corrupted_last_hunk_leaves_no_half_applied_tree(old_venv, tmp_path):
    """Every hunk but the last one applies. Plain `patch` (the old apply) would write six files
    and a .rej; the deploy's command writes nothing."""
    text = BACKPORT.read_text()
    marker = '-        skipped_checking_patterns = ["attn_mqa.k_scale", "attn_mqa.v_scale"]'
    assert text.count(marker) == 1
    bad = tmp_path / "corrupted.patch"
    bad.write_text(text.replace(marker, marker.replace("v_scale", "w_scale")))
    site = copy_sglang(OLD, tmp_path / "site")
    _refused(site, bad)

    control = copy_sglang(OLD, tmp_path / "control")
    before = file_digests(control)
    plain = _sh(f"cd {control} && patch -p2 -s -f --no-backup-if-mismatch < {bad}")
    assert plain.returncode == 1
    after = file_digests(control)
    changed = {rel for rel in before if before[rel] != after.get(rel)}
    assert changed == patch_targets(BACKPORT) - {"sglang/srt/models/deepseek_v4.py"}
    assert any(p.endswith(".rej") for p in leftovers(control))


def test_wrong_sha256_changes_nothing(old_venv, tmp_path):
    site = copy_sglang(OLD, tmp_path / "site")
    result = _refused(site, BACKPORT, sha256="0" * 64)
    assert "sha256 is not " + "0" * 64 in result["stderr"]


# --- the floor: 0.5.13 takes the backport, 0.5.14 has the upstream diff ------------------------

@pytest.mark.parametrize("version", ["0.5.13", PR25820_SINCE])
def test_real_wheels_around_the_floor(version, tmp_path):
    site = wheel_tree(version, tmp_path / "site")
    state = {}
    for name, patch_file in (("backport", BACKPORT), ("upstream", UPSTREAM)):
        state[name] = {
            "in": _sh(f"cd {site} && {patching.reverse_dry_run(str(patch_file), 2)}").returncode == 0,
            "applies": _sh(f"cd {site} && {patching.forward_dry_run(str(patch_file), 2)}").returncode == 0,
        }
    if version == PR25820_SINCE:
        assert state["upstream"] == {"in": True, "applies": False}
        assert state["backport"] == {"in": False, "applies": False}
    else:
        assert state["backport"] == {"in": False, "applies": True}
        assert state["upstream"] == {"in": False, "applies": False}


def test_no_fuzz_a_shifted_hunk_is_refused_not_misplaced(old_venv, tmp_path):
    """Why every step runs with -F0: upstream's hunk that adds the `gemm1_clamp_limit` field to
    FlashInferTrtllmFp4MoeQuantInfo finds its context lines in 0.5.13.post1 only with GNU patch's
    default fuzz 2, and then lands after `return hs_fp4, hs_sf` in the next function (valid
    Python, wrong place: the dataclass never gets the field)."""
    rel = "sglang/srt/layers/moe/moe_runner/flashinfer_trtllm.py"
    lines = UPSTREAM.read_text().splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("diff --git") and rel in line)
    hunk = next(i for i in range(start, len(lines)) if lines[i].startswith("@@ -857,6 +857,8 @@"))
    end = next(i for i in range(hunk + 1, len(lines)) if lines[i].startswith(("@@", "diff --git")))
    one = tmp_path / "one-hunk.patch"
    one.write_text("".join(lines[start:start + 4] + lines[hunk:end]))
    site = tmp_path / "site"
    (site / rel).parent.mkdir(parents=True)
    shutil.copy2(_site(OLD) / rel, site / rel)

    fuzzy = _sh(f"cd {site} && patch -p2 -f --dry-run < {one}")
    assert fuzzy.returncode == 0 and "with fuzz 2" in fuzzy.stdout
    scratch = tmp_path / "scratch"
    shutil.copytree(site, scratch)
    assert _sh(f"cd {scratch} && patch -p2 -f -s --no-backup-if-mismatch < {one}").returncode == 0
    text = (scratch / rel).read_text()
    field = text.index("    gemm1_clamp_limit: Optional[torch.Tensor] = None")
    assert text.rindex("return hs_fp4, hs_sf", 0, field) > text.index("class FlashInferTrtllmFp4MoeQuantInfo")
    assert text.index("def quantize_hidden_states_fp4") < field

    strict = _sh(f"cd {site} && {patching.forward_dry_run(str(one), 2)}")
    assert strict.returncode == 1 and "FAILED" in strict.stdout
