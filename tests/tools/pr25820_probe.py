#!/usr/bin/env python3
"""What SGLang makes of a hybrid FP8+NVFP4 DeepSeek-V4 checkpoint: the three places PR #25820
decides it, run from whichever ``sglang`` package is first on PYTHONPATH (a patched or a
pristine copy of a real wheel). For tests/test_pr25820_patch.py; runs inside the CPU parser venv
(tests/tools/sglang_parser.py), stdlib-only apart from SGLang.

    python pr25820_probe.py MODEL_DIR    # MODEL_DIR holds config.json; prints one JSON object

1. ``ModelConfig(model_path=MODEL_DIR)`` (configs/model_config.py): ``nvfp4_moe_meta`` and the
   log line "Auto-detected hybrid FP8+NVFP4 checkpoint ...".
2. ``model_loader.loader._get_quantization_config`` on that ModelConfig: the quantization config
   the model's layers would get (the PR wraps SGLang's Fp8Config in HybridFp8NvFp4Config, whose
   NVFP4 part covers the routed experts and excludes the MTP layers). One SGLang function is
   replaced for this: ``get_model_architecture``, which imports the CUDA model class only to read
   its ``packed_modules_mapping`` (here ``{}``).
3. ``arg_groups.deepseek_v4_hook.apply_deepseek_v4_defaults`` with ``--moe-runner-backend`` auto
   and marlin, on a stand-in for ServerArgs that carries the fields the hook reads (ServerArgs
   itself needs an accelerator in this release).
"""

from __future__ import annotations

import json
import logging
import sys
import types


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(f"{record.name} {record.levelname} {record.getMessage()}")


def main(model_dir: str) -> int:
    out = sys.stdout
    sys.stdout = sys.stderr  # SGLang's prints stay off the JSON channel
    records = _Records()
    logging.getLogger().addHandler(records)
    logging.getLogger().setLevel(logging.INFO)

    import sglang
    from sglang.srt.arg_groups import deepseek_v4_hook
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader import loader
    from sglang.srt.server_args import ServerArgs

    result: dict = {"sglang_file": sglang.__file__,
                    "sglang_version": getattr(sglang, "__version__", None)}

    model_config = ModelConfig(model_path=model_dir)
    result["has_nvfp4_moe_meta"] = hasattr(model_config, "nvfp4_moe_meta")
    result["nvfp4_moe_meta"] = getattr(model_config, "nvfp4_moe_meta", None)
    result["quantization"] = model_config.quantization

    class _Arch:
        packed_modules_mapping: dict = {}

    loader.get_model_architecture = lambda _config: (_Arch, "DeepseekV4ForCausalLM")
    quant_config = loader._get_quantization_config(model_config, LoadConfig())
    result["quant_config"] = type(quant_config).__name__
    result["quant_config_bases"] = [c.__name__ for c in type(quant_config).__mro__[1:3]]
    nvfp4 = getattr(quant_config, "nvfp4_config", None)
    result["nvfp4_config"] = None if nvfp4 is None else {
        "type": type(nvfp4).__name__,
        "group_size": nvfp4.group_size,
        "exclude_modules": list(nvfp4.exclude_modules),
        "checkpoint_nvfp4_serialized": nvfp4.is_checkpoint_nvfp4_serialized,
        "routed_experts_excluded": nvfp4.is_layer_excluded("model.layers.3.ffn.experts"),
        "mtp_experts_excluded": nvfp4.is_layer_excluded("model.decoder.layers.0.ffn.experts"),
    }

    result["moe_runner_backend"] = {}
    for backend in ("auto", "marlin"):
        args = types.SimpleNamespace(
            attention_backend=None, page_size=None, max_running_requests=64, kv_cache_dtype="auto",
            speculative_algorithm=None, swa_full_tokens_ratio=ServerArgs.swa_full_tokens_ratio,
            moe_runner_backend=backend, get_model_config=lambda: model_config)
        deepseek_v4_hook.apply_deepseek_v4_defaults(args, "DeepseekV4ForCausalLM")
        result["moe_runner_backend"][backend] = args.moe_runner_backend

    result["log"] = [m for m in records.messages if "NVFP4" in m or "nvfp4" in m]
    out.write(json.dumps(result))
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
