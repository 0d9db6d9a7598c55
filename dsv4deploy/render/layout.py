"""Where things live on the GPU host. One place, so the renderer, the deploy steps and the
release store agree, and two releases never share a half-upgraded venv or checkpoint.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from dsv4deploy.sglang.versions import lock_sha256

OPT = "/opt/dsv4deploy"
ETC = "/etc/dsv4deploy"
STATE = "/var/lib/dsv4deploy"
MODELS = "/srv/dsv4deploy/models"
RELEASES = f"{STATE}/releases"   # the release store: one per host, whatever the profile
HOMES = f"{STATE}/homes"         # the server's home and caches: HOMES/<service>/<venv folder name>
GATE_USER = "dsv4deploy-gate"   # the gate's load client runs as this user: no files, no login, no groups
# The checkpoint folders' owner: the download and the verification run as this user (host/sandbox.py),
# so that the server's account reads the checkpoints and can never change them
FETCH_USER = "dsv4deploy-fetch"


def patchset_id(patches: list[dict]) -> str:
    """Names a patch set by its content: 'nopatch' or 12 hex of the sorted patch sha256s."""
    if not patches:
        return "nopatch"
    joined = ",".join(sorted(p["sha256"] for p in patches))
    return hashlib.sha256(joined.encode()).hexdigest()[:12]


def venv_id(sglang: dict, lock_sha256: str | None = None) -> str:
    """Names what a venv holds: the patch set alone ('nopatch' or its hash, as before) when the
    package comes plainly from PyPI; otherwise 12 hex over the patches, extras, index URLs and
    the version's lock file, so two different venvs never share a path."""
    patches = sglang.get("patches") or []
    extras = sorted(sglang.get("extras") or [])
    index = sglang.get("index_url")
    extra_index = list(sglang.get("extra_index_urls") or [])
    indexes = sglang.get("indexes") or []
    if not (extras or index or extra_index or indexes or lock_sha256):
        return patchset_id(patches)
    doc = {"patches": sorted(p["sha256"] for p in patches), "extras": extras, "index_url": index,
           "extra_index_urls": extra_index, "lock": lock_sha256}
    if indexes:             # only when given: the names of venvs without named indexes stay as they were
        doc["indexes"] = [[i["name"], i["url"], sorted(i["packages"])] for i in indexes]
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Layout:
    """Host paths for one profile."""

    service: str
    sglang_version: str
    patchset: str
    model_repo: str
    model_revision: str

    @classmethod
    def of(cls, data: dict) -> "Layout":
        return cls(
            service=data["service"]["name"],
            sglang_version=data["sglang"]["version"],
            patchset=venv_id(data["sglang"], lock_sha256(data["sglang"]["version"])),
            model_repo=data["model"]["repo"],
            model_revision=data["model"]["revision"],
        )

    @property
    def venv(self) -> str:
        return f"{OPT}/venvs/sglang-{self.sglang_version}-{self.patchset}"

    @property
    def python(self) -> str:
        return f"{self.venv}/bin/python"

    @property
    def model_dir(self) -> str:
        return f"{MODELS}/{self.model_repo.replace('/', '--')}/{self.model_revision}"

    @property
    def config_dir(self) -> str:
        return f"{ETC}/{self.service}"

    @property
    def nccl_env(self) -> str:
        return f"{self.config_dir}/nccl.env"

    @property
    def secrets_dir(self) -> str:
        """Root-only (0700) home of the host's secrets: API key, SGLang's key config, HF token."""
        return f"{ETC}/secrets"

    @property
    def api_key_file(self) -> str:
        """The service's API key (0600, root), generated on the host; clients read it there."""
        return f"{self.secrets_dir}/{self.service}-api-key"

    @property
    def admin_key_file(self) -> str:
        """SGLang's admin key (0600, root), generated on the host: its management endpoints
        (weights, memory, profiling, aborts) take this key and refuse the inference key."""
        return f"{self.secrets_dir}/{self.service}-admin-api-key"

    @property
    def gateway_control_key_file(self) -> str:
        """The gateway's control-plane key (0600, root), generated on the host: smg's /workers
        takes only this key; the deploy's calls to it read it there."""
        return f"{self.secrets_dir}/{self.service}-gateway-control-key"

    @property
    def sglang_config_secret(self) -> str:
        """SGLang's --config YAML holding the inference and admin keys (0600, root), loaded as a
        systemd credential."""
        return f"{self.secrets_dir}/{self.service}-sglang-config.yaml"

    @property
    def hf_token_file(self) -> str:
        """The Hugging Face token from the control node (0600, root), read by the weights step."""
        return f"{self.secrets_dir}/hf-token"

    def credential_path(self, name: str) -> str:
        """Where systemd puts credential `name` for the service ($CREDENTIALS_DIRECTORY)."""
        return f"/run/credentials/{self.service}.service/{name}"

    @property
    def manifest(self) -> str:
        return f"{self.config_dir}/manifest.json"

    @property
    def unit(self) -> str:
        return f"/etc/systemd/system/{self.service}.service"

    # --- replicas (profile `replicas:`): instances <service>@<i> of one templated unit ---------

    @property
    def template_unit(self) -> str:
        return f"/etc/systemd/system/{self.service}@.service"

    def instance(self, index: int) -> str:
        """The unit name of replica `index`, without .service: sglang@0."""
        return f"{self.service}@{index}"

    def replica_env(self, index: int) -> str:
        """Replica `index`'s GPUs and port (CUDA_VISIBLE_DEVICES, DSV4_REPLICA_PORT)."""
        return f"{self.config_dir}/replica-{index}.env"

    def replica_nccl_env(self, index: int) -> str:
        return f"{self.config_dir}/nccl-{index}.env"

    def instance_credential_path(self, index: int, name: str) -> str:
        return f"/run/credentials/{self.instance(index)}.service/{name}"

    @property
    def gateway_service(self) -> str:
        return f"{self.service}-gateway"

    @property
    def gateway_unit(self) -> str:
        return f"/etc/systemd/system/{self.gateway_service}.service"

    @staticmethod
    def gateway_venv(version: str, lock_sha256: str | None) -> str:
        """The smg venv: named by release and lock file, so a new pin is a new venv."""
        return f"{OPT}/venvs/smg-{version}-{(lock_sha256 or 'nolock')[:12]}"

    @property
    def state_dir(self) -> str:
        return f"{STATE}/{self.service}"

    @property
    def releases_dir(self) -> str:
        return RELEASES

    @property
    def home(self) -> str:
        """The server's HOME and JIT caches: one folder per service and venv, so a restart of the
        same venv finds its compiled kernels and a new venv (a new release's code) starts empty.
        systemd makes it (StateDirectory=); pruning removes it with its venv (venv_of_home)."""
        return f"{HOMES}/{self.service}/{self.venv.rsplit('/', 1)[1]}"

    @property
    def state_directory(self) -> str:
        """`home` as systemd's StateDirectory= names it (relative to /var/lib)."""
        return self.home.removeprefix("/var/lib/")


def venv_of_home(path: str) -> str | None:
    """The venv whose server home PATH is (Layout.home), or None when PATH is no such home."""
    parts = path[len(HOMES) + 1:].split("/") if path.startswith(HOMES + "/") else []
    return f"{OPT}/venvs/{parts[1]}" if len(parts) == 2 and all(parts) else None
