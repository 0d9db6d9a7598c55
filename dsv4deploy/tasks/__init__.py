"""The rollout's steps as reusable pyinfra `@deploy` functions, one module per concern,
in the order deploy/serve.py calls them. Host effects live in dsv4deploy/host/."""

from dsv4deploy.host.dependency_patches import install_operation_order

install_operation_order()      # pyinfra's operation order without inspect.stack(): ~50 ms of CPU less a run

from dsv4deploy.tasks.preflight import preflight
from dsv4deploy.tasks.driver import driver
from dsv4deploy.tasks.nccl_probe import nccl_probe
from dsv4deploy.tasks.system import host_packages, service_user
from dsv4deploy.tasks.venv import launch_check, sglang_venv
from dsv4deploy.tasks.weights import weights
from dsv4deploy.tasks.service import config_files, files_differ, secrets, switch
from dsv4deploy.tasks.replicas import cannot_roll, gateway_restart, gateway_venv, switch_set
from dsv4deploy.tasks.rollback import manual_rollback
from dsv4deploy.tasks.release import (begin_release, deploy_lock, needs_release, pending_in, read_locked, release_store,
                                      settle_interrupted, verify_and_record)
from dsv4deploy.tasks.plan import show_plan
from dsv4deploy.tasks.watch import arm as arm_watch


__all__ = ["manual_rollback", "preflight", "driver", "nccl_probe", "host_packages", "service_user", "sglang_venv",
           "launch_check", "weights", "config_files", "files_differ", "secrets", "switch",
           "begin_release", "deploy_lock", "needs_release", "pending_in", "settle_interrupted", "verify_and_record",
           "show_plan", "read_locked", "release_store", "gateway_venv", "switch_set", "cannot_roll", "gateway_restart", "arm_watch"]
