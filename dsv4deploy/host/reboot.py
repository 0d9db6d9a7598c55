"""Reboot the host and wait for it to come back on a new boot, as long as a big server needs.

pyinfra's server.reboot decides that the host rebooted when its uptime went down, and waits
300 s by default. This waits the profile's `driver.reboot_wait_s` and decides by the kernel's
boot id (/proc/sys/kernel/random/boot_id, new at every boot), which also holds where the uptime is
not the host's own (a container shares its kernel's uptime, a boot id is given per container).
"""

from __future__ import annotations

import time

from pyinfra import logger
from pyinfra.api import FunctionCommand, StringCommand, operation
from pyinfra.connectors.util import clear_askpass_cache, remove_any_sudo_askpass_file

from dsv4deploy.host import io

BOOT_ID = "cat /proc/sys/kernel/random/boot_id"
# driver.reboot_wait_s unset: an 8-GPU server's firmware alone can take minutes (not in the profile's
# defaults: a value there would be part of every profile's hash, and a change of it restart the server)
REBOOT_WAIT_S = 900


def boot_id(h) -> str | None:
    ok, out = io.sh(h, BOOT_ID, timeout=30)
    return out.strip() if ok and out.strip() else None


@operation(is_idempotent=False)
def reboot_and_wait(wait_s: int, before: str = "", delay_s: int = 10, interval_s: int = 2):
    """BEFORE (a command), then `systemctl reboot` detached from the session; then reconnect every
    INTERVAL_S seconds (after DELAY_S) until the boot id differs from the one before, or refuse
    after WAIT_S seconds with one line."""
    first: list[str] = []

    def remember(state, host):
        remove_any_sudo_askpass_file(host)
        first.append(boot_id(host) or "")

    yield FunctionCommand(remember, (), {})
    yield StringCommand(f"{before + ' && ' if before else ''}"
                        "( sleep 1 && systemctl reboot ) </dev/null >/dev/null 2>&1 &")

    def wait(state, host):
        deadline = time.monotonic() + wait_s
        time.sleep(min(delay_s, wait_s))
        clear_askpass_cache(host)
        host.disconnect()
        while True:
            host.connect(show_errors=False)
            if host.connected:
                now = boot_id(host)
                if now and now != first[0]:
                    return True
                host.disconnect()
            if time.monotonic() >= deadline:
                logger.error(f"    [{host.name}] the host did not come back on a new boot within {wait_s} s "
                             "(driver.reboot_wait_s): look at its console, then deploy again")
                return False
            time.sleep(interval_s)

    yield FunctionCommand(wait, (), {})
