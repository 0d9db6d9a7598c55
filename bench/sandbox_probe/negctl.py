#!/usr/bin/env python3
"""Negative (and positive) controls: calls the filter must refuse, and calls it must allow.
Prints 'CALL <name> -> ok' or '-> errno N (NAME)'. probe.py compares runs with and without
the filter: a call that succeeds without it and fails with the expected errno under it proves
the filter is installed and enforcing."""
import ctypes, ctypes.util, errno, mmap, os, socket, sys, tempfile

LABEL = os.environ.get("PROBE_LABEL", "?")
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def res(name, fn):
    try:
        r = fn()
        if isinstance(r, int) and r < 0:
            e = ctypes.get_errno()
            out = f"errno {e} ({errno.errorcode.get(e, '?')})"
        else:
            out = "ok"
    except OSError as e:
        out = f"errno {e.errno} ({errno.errorcode.get(e.errno, '?')})"
    print(f"[{LABEL}] CALL {name} -> {out}", flush=True)


def sock(af, t, p=0):
    def f():
        s = socket.socket(af, t, p)
        s.close()
    return f


def fchown_noop():
    fd, p = tempfile.mkstemp()
    try:
        os.fchown(fd, -1, -1)  # no-op chown: allowed for any owner without the filter
    finally:
        os.close(fd); os.unlink(p)


def mincore():
    m = mmap.mmap(-1, 4096)
    buf = ctypes.create_string_buffer(1)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    r = libc.syscall(27, ctypes.c_void_p(addr), ctypes.c_size_t(4096), buf)  # mincore
    return -1 if r != 0 else 0


for line in open("/proc/self/status"):
    if line.split(":")[0] in ("Uid", "NoNewPrivs", "Seccomp", "Seccomp_filters", "CapEff"):
        print(f"[{LABEL}] STATUS {' '.join(line.split())}", flush=True)
# denied by the syscall filter whatever the capabilities (cap-independent negative controls)
res("setuid(getuid())", lambda: os.setuid(os.getuid()))
res("fchown(fd,-1,-1)", fchown_noop)
res("mincore", mincore)
# denied by the syscall filter (@privileged); as root without the filter they succeed
res("chroot('/')", lambda: libc.chroot(b"/"))
res("sethostname(same)", lambda: libc.sethostname(socket.gethostname().encode(), len(socket.gethostname())))
res("capset(NULL,NULL)", lambda: libc.syscall(126, ctypes.c_void_p(0), ctypes.c_void_p(0)))  # capset(NULL,NULL): EFAULT unfiltered
# RestrictAddressFamilies: refused families
res("socket(AF_PACKET,SOCK_DGRAM)", sock(17, socket.SOCK_DGRAM))
res("socket(AF_VSOCK,SOCK_STREAM)", sock(40, socket.SOCK_STREAM))
res("socket(AF_ALG,SOCK_SEQPACKET)", sock(38, socket.SOCK_SEQPACKET))
res("socket(AF_BLUETOOTH,SOCK_STREAM)", sock(31, socket.SOCK_STREAM))
# allowed families (positive controls)
res("socket(AF_UNIX,SOCK_STREAM)", sock(socket.AF_UNIX, socket.SOCK_STREAM))
res("socket(AF_INET,SOCK_STREAM)", sock(socket.AF_INET, socket.SOCK_STREAM))
res("socket(AF_INET6,SOCK_DGRAM)", sock(socket.AF_INET6, socket.SOCK_DGRAM))
res("socket(AF_NETLINK,NETLINK_ROUTE)", sock(socket.AF_NETLINK, socket.SOCK_RAW, 0))
# RestrictNamespaces / LockPersonality (only the 'full' set installs these)
res("clone3(NULL,0)", lambda: libc.syscall(435, ctypes.c_void_p(0), ctypes.c_size_t(0)))  # unfiltered: EFAULT/EINVAL; ns filter: ENOSYS
res("setns(-1,0)", lambda: libc.syscall(308, -1, 0))  # unfiltered: EBADF; ns filter: EPERM
res("personality(PER_LINUX32)", lambda: (libc.personality(0x0008), libc.personality(0))[0])
