"""The twin's vocabulary and its tokenizer: a stand-in for DeepSeek-V4's 129,280-token BPE.

The twin server writes its tokens as words of WORDS (engine.token_text) and counts a text prompt
as its whitespace-separated words (count_text_tokens). The stand-in checkpoint carries a real
Hugging Face tokenizer built from the same words (tokenizer_files: a ``WordLevel`` model split on
whitespace, no special tokens added), so a client that loads it (SGLang's bench_serving) counts
every text exactly as the twin server does: a decoded prompt, a generated text, anything.
The real tokenizer adds a BOS token to a text prompt; the stand-in adds none (the gate sends token
ids, whose count no tokenizer changes).
"""

from __future__ import annotations

import json

WORDS = ("the model serves tokens from a sparse mixture of experts while the indexer scores "
         "compressed attention blocks across every layer and the scheduler batches running "
         "requests into one decode step on four blackwell cards over pcie with nccl ring "
         "all reduce and cuda graphs for small batches").split()
BOS, EOS, UNK = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<unk>"
SPECIAL = (BOS, EOS, UNK)


def count_text_tokens(text: str) -> int:
    """How many tokens the twin server counts in a text prompt (what the stand-in tokenizer encodes)."""
    return max(1, len(text.split()))


def vocabulary() -> dict[str, int]:
    """Token -> id: the special tokens first, then every distinct word in sorted order."""
    return {tok: i for i, tok in enumerate(list(SPECIAL) + sorted(set(WORDS)))}


def tokenizer_files(stand_in_for: str) -> dict[str, str]:
    """{file name: text} of the stand-in tokenizer (tokenizer.json in the `tokenizers` library's
    format, tokenizer_config.json for transformers' AutoTokenizer), the same bytes every time."""
    vocab = vocabulary()
    added = [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for t in SPECIAL]
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
                 "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
                 "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": UNK}}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1048576,
              "bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "add_bos_token": False,
              "add_eos_token": False, "clean_up_tokenization_spaces": False,
              "_dsv4deploy_stand_in": f"word-level stand-in for {stand_in_for}'s tokenizer (ct200twin/server/vocab.py)"}
    return {"tokenizer.json": json.dumps(tokenizer, ensure_ascii=False, indent=1, sort_keys=True) + "\n",
            "tokenizer_config.json": json.dumps(config, ensure_ascii=False, indent=1, sort_keys=True) + "\n"}
