"""A small stand-in checkpoint for the twin: the real one is 149 GiB in 46 shards.

Same layout as a Hugging Face safetensors checkpoint (config.json, tokenizer files,
model.safetensors.index.json naming every shard, valid safetensors shards), so the weights
step's download, completeness check and marker run for real; only the sizes are small. The
tokenizer is a real one (tokenizer.json, loaded by transformers: SGLang's bench_serving gates with
it) over the twin server's own words, so both count every text the same (server/vocab.py).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from ct200twin.host.layout import REPO_ROOT
from ct200twin.server.vocab import tokenizer_files

CHECKPOINTS = REPO_ROOT / ".sim" / "checkpoints"


def _shard(path: Path, names: list[str], floats: int) -> None:
    header, offset = {}, 0
    for name in names:
        size = floats * 4
        header[name] = {"dtype": "F32", "shape": [floats], "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for i, _ in enumerate(names):
            f.write(struct.pack(f"<{floats}f", *([float(i)] * floats)))


def make_checkpoint(repo: str, shards: int = 3, floats: int = 4096, root: Path | None = None) -> Path:
    """Create (once) the stand-in checkpoint for `repo`; returns its folder. One made before it
    carried a tokenizer gets it (the weights step then pushes the new files)."""
    folder = (root or CHECKPOINTS) / repo.replace("/", "--")
    if (folder / "model.safetensors.index.json").is_file():
        _write_tokenizer(folder, repo)
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for i in range(shards):
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        names = [f"model.layers.{i}.mlp.experts.w{j}" for j in range(2)]
        _shard(folder / shard, names, floats)
        weight_map.update({n: shard for n in names})
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
        "num_hidden_layers": 43, "num_attention_heads": 64, "max_position_embeddings": 1048576,
        "_dsv4deploy_stand_in": f"small stand-in for {repo}"}, indent=2))
    _write_tokenizer(folder, repo)
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": sum((folder / s).stat().st_size for s in set(weight_map.values()))},
         "weight_map": weight_map}, indent=2))
    return folder


def _write_tokenizer(folder: Path, repo: str) -> None:
    """The tokenizer files, written only where their bytes differ (a rewrite would change the
    files' mtime, and the rsync source's digests are kept by mtime)."""
    for name, text in tokenizer_files(repo).items():
        path = folder / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
