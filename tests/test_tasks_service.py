"""The unit's files as `make plan` shows them (dsv4deploy/tasks/service.py file_diff): only the
lines that change, and a missing final newline said, as diff says it."""

from __future__ import annotations

from dsv4deploy.tasks.service import file_diff

HOST = "# NCCL preset ll-ring for profile unit-only\nNCCL_ALGO=Ring\nNCCL_PROTO=LL\n"
NEW = "# NCCL preset ll-ring for profile nvfp4-ctx8k\nNCCL_ALGO=Ring\nNCCL_PROTO=LL\n"


def test_a_plan_shows_only_the_lines_that_change():
    lines = file_diff(HOST, NEW, "/etc/dsv4deploy/sglang/nccl.env", "nvfp4-ctx8k")
    assert lines[:2] == ["--- /etc/dsv4deploy/sglang/nccl.env (on the host)",
                         "+++ /etc/dsv4deploy/sglang/nccl.env (nvfp4-ctx8k)"]
    changed = [line for line in lines[3:] if line[:1] in "+-"]
    assert changed == ["-# NCCL preset ll-ring for profile unit-only", "+# NCCL preset ll-ring for profile nvfp4-ctx8k"]
    assert " NCCL_PROTO=LL" in lines                                  # the last line: context, not a change


def test_a_file_that_lost_its_final_newline_says_so():
    lines = file_diff(HOST.rstrip("\n"), HOST, "/etc/x", "p")
    assert lines[-3:] == ["-NCCL_PROTO=LL", "\\ No newline at end of file", "+NCCL_PROTO=LL"]


def test_a_file_not_on_the_host_is_all_added():
    lines = file_diff("", NEW, "/etc/x", "p")
    assert lines[2] == "@@ -0,0 +1,3 @@" and lines[3:] == ["+" + line for line in NEW.splitlines()]


def test_lines_end_at_newlines_only_and_the_hosts_controls_are_shown_escaped():
    """A host file may hold a carriage return, a form feed or U+2028 inside a line (systemd reads
    to "\\n"), or an escape sequence that would drive the operator's terminal: the plan shows one
    changed line, escaped, not several and not raw."""
    host = "Description=old\r\x0cpart\u2028two \x1b]0;pwned\x07\nKeep=1\n"
    lines = file_diff(host, "Description=new\nKeep=1\n", "/etc/x", "p")
    assert lines[2] == "@@ -1,2 +1,2 @@"
    assert lines[3:] == ["-Description=old\\r\\x0cpart\\u2028two \\x1b]0;pwned\\x07", "+Description=new", " Keep=1"]
    assert all(line.isprintable() for line in lines)
