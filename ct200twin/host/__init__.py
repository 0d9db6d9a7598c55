"""The CT200 twin host: Debian + systemd booted with systemd-nspawn, sshd on 127.0.0.(N+1),
and a fake nvidia-smi reporting CT200's 8 GPUs.  See docs/twin.md."""

from ct200twin.host.machines import (SimError, SimHost, down, existing_hosts, inventory_hosts, running_hosts,
                                     set_gpus, sim_dir, status, up)

__all__ = ["SimError", "SimHost", "down", "existing_hosts", "inventory_hosts", "running_hosts",
           "set_gpus", "sim_dir", "status", "up"]
