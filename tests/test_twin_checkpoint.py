"""The twin's stand-in checkpoint (ct200twin/host/checkpoint.py): a Hugging Face layout with a real
tokenizer over the twin server's own words, made once, the same bytes every time."""

from __future__ import annotations

import json

from ct200twin.host.checkpoint import make_checkpoint
from ct200twin.server.engine import token_id, token_text
from ct200twin.server.vocab import SPECIAL, count_text_tokens


def test_the_checkpoint_carries_a_tokenizer_of_the_servers_words(tmp_path):
    folder = make_checkpoint("org/model", root=tmp_path)
    tok = json.loads((folder / "tokenizer.json").read_text())
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert tok["model"]["type"] == "WordLevel" and tok["pre_tokenizer"] == {"type": "WhitespaceSplit"}
    assert tok["post_processor"] is None and not config["add_bos_token"]   # no token added to a prompt
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and "org/model" in config["_dsv4deploy_stand_in"]
    vocab = tok["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(len(vocab))) and all(t in vocab for t in SPECIAL)
    # every token the server writes is one word of the vocabulary: the tokenizer counts it as the server does
    text = "".join(token_text(token_id(12345, i)) for i in range(500))
    words = text.split()
    assert all(w in vocab for w in words) and count_text_tokens(text) == len(words) == 500
    assert sum((folder / n).stat().st_size for n in ("tokenizer.json", "tokenizer_config.json")) < 4096


def test_an_older_checkpoint_gets_the_tokenizer_and_an_unchanged_one_is_not_rewritten(tmp_path):
    folder = make_checkpoint("org/model", root=tmp_path)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir()}
    assert make_checkpoint("org/model", root=tmp_path) == folder
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir()} == before
    (folder / "tokenizer.json").unlink()                        # made before it carried one
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 1048576}))
    make_checkpoint("org/model", root=tmp_path)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == {k: v[0] for k, v in before.items()}
