#!/usr/bin/env python3
"""Install seccomp BPF programs (raw struct sock_filter[] files) the way systemd does for the unit,
then exec a command. Stdlib only (ctypes); runs on the GPU machine.

usage: load_filter.py [--filters a.bpf,b.bpf] [--drop-caps] [--user NAME] [--home DIR] -- CMD...

Order mirrors systemd's exec path: drop the capability bounding set and ambient set, switch
user (User=), drop remaining capabilities (CapabilityBoundingSet= empty), set no_new_privs
(NoNewPrivileges=yes), install the filters in the given order (systemd installs SystemCallFilter
last), then execve. Exits 3 with 'LOADER SECCOMP_UNSUPPORTED' if the kernel refuses a filter.
"""
import ctypes, os, pwd, sys

libc = ctypes.CDLL(None, use_errno=True)
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
libc.prctl.restype = ctypes.c_int
libc.capset.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
libc.capset.restype = ctypes.c_int

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_CAPBSET_DROP, PR_CAP_AMBIENT = 38, 22, 24, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECCOMP_MODE_FILTER = 2


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint32)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def log(msg):
    sys.stderr.write(f"LOADER {msg}\n")
    sys.stderr.flush()


def err():
    e = ctypes.get_errno()
    return f"errno={e} ({os.strerror(e)})"


def install(path):
    data = open(path, "rb").read()
    n = len(data) // 8
    assert len(data) == 8 * n and 0 < n < 4096, (path, len(data))
    buf = (SockFilter * n).from_buffer_copy(data)
    prog = SockFprog(n, buf)
    r = libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.cast(ctypes.pointer(prog), ctypes.c_void_p).value, 0, 0)
    if r != 0:
        log(f"SECCOMP_UNSUPPORTED prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, {os.path.basename(path)}) failed: {err()}")
        sys.exit(3)
    log(f"installed {os.path.basename(path)} ({n} instructions)")


def drop_caps():
    dropped = 0
    for cap in range(0, 64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
            dropped += 1
        elif ctypes.get_errno() == 22:  # EINVAL: past the last capability
            break
        else:
            log(f"PR_CAPBSET_DROP({cap}) failed: {err()}")
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    return dropped


def capset_empty():
    hdr = CapHeader(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    data = (CapData * 2)()
    if libc.capset(ctypes.byref(hdr), ctypes.byref(data)) != 0:
        log(f"capset(empty) failed: {err()}")
        return False
    return True


def status(keys=("Uid", "NoNewPrivs", "Seccomp", "Seccomp_filters", "CapEff", "CapPrm", "CapBnd", "CapAmb")):
    out = {}
    for line in open("/proc/self/status"):
        k, _, v = line.partition(":")
        if k in keys:
            out[k] = " ".join(v.split())
    return out


def main(argv):
    filters, do_caps, user, home = [], False, None, None
    i = 0
    while i < len(argv) and argv[i] != "--":
        a = argv[i]
        if a == "--filters":
            filters = [f for f in argv[i + 1].split(",") if f]; i += 2
        elif a == "--drop-caps":
            do_caps = True; i += 1
        elif a == "--user":
            user = argv[i + 1]; i += 2
        elif a == "--home":
            home = argv[i + 1]; i += 2
        else:
            sys.exit(f"unknown option {a}")
    cmd = argv[i + 1:]
    assert cmd, "no command"
    here = os.path.dirname(os.path.abspath(__file__))
    if do_caps or user:
        log(f"capability bounding set: dropped {drop_caps()} capabilities")
    if user:
        pw = pwd.getpwnam(user)
        os.setgroups([])
        os.setresgid(pw.pw_gid, pw.pw_gid, pw.pw_gid)
        os.setresuid(pw.pw_uid, pw.pw_uid, pw.pw_uid)
        log(f"switched to {user} uid={pw.pw_uid} gid={pw.pw_gid}")
    if do_caps or user:
        capset_empty()
    if home:
        os.environ["HOME"] = home
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        log(f"PR_SET_NO_NEW_PRIVS failed: {err()}")
        sys.exit(3)
    for f in filters:
        install(f if os.path.isabs(f) else os.path.join(here, f))
    log("status " + " ".join(f"{k}={v}" for k, v in status().items()))
    sys.stdout.flush()
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
