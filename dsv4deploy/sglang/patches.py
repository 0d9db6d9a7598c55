"""Patches this project ships for SGLang wheels (dsv4deploy/data/patches/), and how to tell
whether an installed SGLang tree carries one.

PR25820_PATCH is upstream PR #25820 ("[NVIDIA] Support NVFP4 MoE for DeepSeek-V4"), in every
SGLang wheel from 0.5.14 on, backported to 0.5.13.post1 (and 0.5.13): without it SGLang does
not recognise the hybrid FP8+NVFP4 layout of nvidia/DeepSeek-V4-*-NVFP4. PR25820_UPSTREAM is
the upstream diff itself, byte for byte, kept for provenance; it applies to no release
(0.5.13.post1 lacks its context, 0.5.14 already has it).

MASK_SECRETS_PATCH masks SGLang 0.5.23's server-argument secrets (api_key, admin_api_key,
ssl_keyfile_password) wherever SGLang shows its args: the startup ``server_args=...`` log lines,
/server_info and /get_server_info (fields, internal_states and launch_command), ServerArgs'
repr. Auth still uses the real values. data/patches/README.md has the details.

The entry has the profile schema's patch keys (name, file, sha256, strip) plus the SGLang
version it is made for; ``profile_entry()`` is what a profile's ``sglang.patches`` lists.
"""

from __future__ import annotations

from pathlib import Path

MASK_SECRETS_PATCH = {
    "name": "sglang-0.5.23-mask-secrets",
    "file": "dsv4deploy/data/patches/sglang-0.5.23-mask-secrets.patch",
    "sha256": "0aedb3019048320fad4e53a8d787be443a8fefe6565aa502a774c8b8ecc53cc9",
    "strip": 1,
    "sglang_version": "0.5.23",
}

# The first SGLang release with PR #25820 in its wheel (checked: 0.5.13.post1 lacks it, the
# upstream diff reverse-applies exactly to 0.5.14).
PR25820_SINCE = "0.5.14"

PR25820_UPSTREAM = {
    "name": "pr25820-nvfp4-moe-dsv4",
    "file": "dsv4deploy/data/patches/pr25820-nvfp4-moe-dsv4.patch",
    "sha256": "d74cc63a8ba5b4e5efec75244e4a37a1d06644a5185ff85793afbaf84dff5f1c",
    "strip": 2,
    "commit": "c0bb04b67f269d87fa0a5b79799b268bc52069f2",   # sgl-project/sglang, squash merge
    "parent": "5deca2d39ffb6189ee2187dd992fd679a6d4699f",
}

PR25820_PATCH = {
    "name": "pr25820-nvfp4-moe-dsv4",
    "file": "dsv4deploy/data/patches/pr25820-nvfp4-moe-dsv4-sglang-0.5.13.post1.patch",
    "sha256": "d0a053912d877c43f9ed23af89b9429a095ba11adcd28b6bf9a8d915381b0fd2",
    "strip": 2,
    "sglang_version": "0.5.13.post1",
}

# What the patched SGLang shows instead of a secret (its existing watermark-secret mask).
MASK = "<redacted>"

# One line the patch adds to each file it touches (paths relative to site-packages), verbatim:
# all present means the tree carries the patch, none means pristine.
MASK_SECRETS_MARKERS = {
    "sglang/srt/sampling/watermarking/config.py":
        "# dsv4deploy-mask-secrets: server-argument secrets, masked like the watermark",
    "sglang/srt/sampling/watermarking/core.py":
        ") | SERVER_SECRET_FIELD_NAMES",
    "sglang/srt/server_args.py":
        '    """dsv4deploy-mask-secrets: a secret field\'s value as ServerArgs shows it."""',
}


def profile_entry(patch: dict | None = None) -> dict:
    """A patch (default: the mask patch) as a profile's ``sglang.patches`` item (the schema's
    keys only)."""
    patch = patch or MASK_SECRETS_PATCH
    return {k: patch[k] for k in ("name", "file", "sha256", "strip")}


def mask_secrets_applied(site_packages: str | Path) -> bool | None:
    """True when every file the patch touches under `site_packages` has its marker line, False
    when none has, None when the tree is partly patched or a file is missing (not SGLang 0.5.23,
    or a half-applied patch)."""
    site = Path(site_packages)
    found = []
    for rel, line in MASK_SECRETS_MARKERS.items():
        try:
            text = (site / rel).read_text()
        except OSError:
            return None
        found.append(line in text.splitlines())
    if all(found):
        return True
    return False if not any(found) else None
