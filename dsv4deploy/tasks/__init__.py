"""The rollout's steps as reusable pyinfra `@deploy` functions, one module per concern,
in the order deploy/serve.py calls them."""

from .preflight import preflight
from .driver import driver
from .nccl_probe import nccl_probe
from .system import host_packages, service_user
from .venv import launch_check, sglang_venv
from .weights import weights
from .service import config_files, restart_if_changed, secrets
from .rollback import manual_rollback
from .release import begin_release, deploy_lock, needs_release, settle_interrupted, verify_and_record

__all__ = ["manual_rollback", "preflight", "driver", "nccl_probe", "host_packages", "service_user", "sglang_venv", "launch_check", "weights", "config_files", "secrets",
           "restart_if_changed", "begin_release", "deploy_lock", "needs_release", "settle_interrupted", "verify_and_record"]
