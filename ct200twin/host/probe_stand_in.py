"""A CPU-only stand-in for the NCCL probe program (the twin has no GPU, so the deploy skips the
probe there): run by the deploy's own probe command (dsv4deploy/tasks/nccl_probe.py) in place of
nccl_probe.py, it reports as one JSON line what a program started that way can do: who it runs
as, whether its HOME is empty, whether it can write its HOME and the account's persistent home,
and whether it reaches loopback and a non-loopback address (its first argument). Used by
tests/test_probe_sandbox_twin.py and bench/probe_sandbox_twin.py.
"""

PATH = "/opt/dsv4deploy/probe-stand-in/nccl_probe.py"     # where the twin keeps it (root-owned)

PROGRAM = r'''
import json, os, pwd, socket, sys
peer = sys.argv[1]
env = dict(a.split("=", 1) for a in sys.argv[3::2])      # the probe's --env KEY=VALUE words
home = env.get("HOME", os.environ.get("HOME"))
account_home = pwd.getpwuid(os.getuid()).pw_dir
doc = {"user": pwd.getpwuid(os.getuid()).pw_name, "home": home, "account_home": account_home,
       "no_new_privs": open("/proc/self/status").read().split("NoNewPrivs:")[1].split()[0],
       "home_at_start": sorted(os.listdir(home)), "env": env}
def attempt(name, fn):
    try:
        fn()
        doc[name] = "ok"
    except OSError as exc:
        doc[name] = type(exc).__name__ + (f" {exc.strerror}" if exc.strerror else "")
attempt("write_home", lambda: open(os.path.join(home, "x"), "w").write("x"))
attempt("write_account_home", lambda: open(os.path.join(account_home, ".nccl.conf"), "a").write("x"))
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
attempt("connect_loopback", lambda: socket.create_connection(srv.getsockname(), timeout=2).close())
attempt("connect_peer", lambda: socket.create_connection((peer, 22), timeout=2).close())
print(json.dumps(doc))
'''
