#!/usr/bin/env python3
"""Build the seccomp BPF programs that emulate dsv4deploy's `strict` unit sandbox.

Runs on a host with systemd-analyze (systemd 252 here) and libseccomp.so.2. Writes raw
classic-BPF programs (struct sock_filter[], 8 bytes each) that load_filter.py installs
with prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER). Stdlib only (ctypes).

systemd installs one seccomp filter per directive; this mirrors that:
  syscall.bpf      SystemCallFilter=@system-service + ~@privileged, SystemCallErrorNumber=EPERM
                   (allow-list: default ERRNO(EPERM), ALLOW each name; the deny-list removes names
                   from the allow set, as systemd's seccomp_parse_syscall_filter does)
  af.bpf           RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
                   (default ALLOW; socket() with another family -> EAFNOSUPPORT, built like
                   systemd's seccomp_restrict_address_families: < first, > last, and each gap)
  ns.bpf           RestrictNamespaces=yes (setns -> EPERM; unshare/clone with any CLONE_NEW* -> EPERM;
                   clone3 -> ENOSYS so glibc falls back to clone, as systemd >= 250 does)
  personality.bpf  LockPersonality=yes (personality() other than PER_LINUX -> EPERM)
  realtime.bpf     RestrictRealtime=yes (sched_setscheduler with FIFO/RR/DEADLINE.. -> EPERM)
  suid.bpf         RestrictSUIDSGID=yes (chmod family / open(O_CREAT) with S_ISUID|S_ISGID -> EPERM)
  syscall_trap.bpf, af_trap.bpf: same as syscall.bpf / af.bpf but SCMP_ACT_TRAP instead of ERRNO,
                   for the diagnostic run (sigsys_log.so logs each denied call, then returns the
                   same errno the real filter would).
  archs: every filter is native (x86_64) only; a foreign-arch call is KILL_PROCESS in syscall.bpf
         (SystemCallArchitectures=native).
"""
import ctypes, ctypes.util, json, os, subprocess, sys, functools

OUT = os.path.dirname(os.path.abspath(__file__))
lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
lib.seccomp_init.restype = ctypes.c_void_p
lib.seccomp_init.argtypes = [ctypes.c_uint32]
lib.seccomp_release.argtypes = [ctypes.c_void_p]
lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
lib.seccomp_syscall_resolve_name.restype = ctypes.c_int
lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
lib.seccomp_export_pfc.argtypes = [ctypes.c_void_p, ctypes.c_int]
lib.seccomp_arch_native.restype = ctypes.c_uint32


class ArgCmp(ctypes.Structure):  # struct scmp_arg_cmp
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int),
                ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


lib.seccomp_rule_add_exact_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                             ctypes.c_uint, ctypes.POINTER(ArgCmp)]

ACT_KILL_PROCESS = 0x80000000
ACT_TRAP = 0x00030000
ACT_ALLOW = 0x7FFF0000
def ACT_ERRNO(e): return 0x00050000 | (e & 0xFFFF)
CMP_NE, CMP_LT, CMP_LE, CMP_EQ, CMP_GE, CMP_GT, CMP_MASKED_EQ = 1, 2, 3, 4, 5, 6, 7
ATTR_ACT_BADARCH, ATTR_CTL_NNP = 2, 3
EPERM, ENOSYS, EAFNOSUPPORT = 1, 38, 97
AUDIT_ARCH_X86_64 = 0xC000003E


@functools.lru_cache(None)
def members(group):
    out = subprocess.run(["systemd-analyze", "syscall-filter", group],
                         capture_output=True, text=True, check=True).stdout
    names = []
    for line in out.splitlines()[1:]:
        s = line.strip()
        if s and not s.startswith("#"):
            names.append(s)
    return tuple(names)


def expand(group, seen=None):
    names = set()
    for m in members(group):
        names |= expand(m) if m.startswith("@") else {m}
    return names


def nr(name):
    n = lib.seccomp_syscall_resolve_name(name.encode())
    return n  # -1 = unknown; other negatives = pseudo-syscall (not on x86_64)


def new_ctx(default):
    ctx = lib.seccomp_init(default)
    assert ctx, "seccomp_init failed"
    assert lib.seccomp_arch_native() == AUDIT_ARCH_X86_64, "generator must run on x86_64"
    lib.seccomp_attr_set(ctx, ATTR_CTL_NNP, 0)  # loader sets NNP itself
    return ctx


def rule(ctx, action, sysnr, *cmps):
    arr = (ArgCmp * max(1, len(cmps)))(*[ArgCmp(*c) for c in cmps])
    r = lib.seccomp_rule_add_exact_array(ctx, action, sysnr, len(cmps), arr)
    if r < 0:
        raise OSError(-r, f"seccomp_rule_add_exact({sysnr}) failed: {os.strerror(-r)}")


def export(ctx, name):
    path = os.path.join(OUT, name)
    with open(path, "wb") as f:
        f.flush()
        r = lib.seccomp_export_bpf(ctx, f.fileno())
        assert r == 0, r
    with open(path + ".pfc", "w") as f:
        f.flush()
        lib.seccomp_export_pfc(ctx, f.fileno())
    lib.seccomp_release(ctx)
    size = os.path.getsize(path)
    assert size % 8 == 0 and size // 8 < 4096, size
    return size // 8


def syscall_filter(default):
    allow_names = expand("@system-service") - expand("@privileged")
    allowed, skipped = {}, []
    for n in sorted(allow_names):
        num = nr(n)
        if num < 0:
            skipped.append(n)  # not an x86_64 syscall (mmap2, chown32, ...) or unknown to libseccomp
            continue
        allowed[n] = num
    ctx = new_ctx(default)
    lib.seccomp_attr_set(ctx, ATTR_ACT_BADARCH, ACT_KILL_PROCESS)
    for n, num in allowed.items():
        rule(ctx, ACT_ALLOW, num)
    return ctx, allowed, skipped, allow_names


AF_ALLOW = {1: "AF_UNIX", 2: "AF_INET", 10: "AF_INET6", 16: "AF_NETLINK"}
AF_MAX = 46  # linux/socket.h (AF_MCTP=45) as of 6.x


def af_filter(action):
    ctx = new_ctx(ACT_ALLOW)
    lib.seccomp_attr_set(ctx, ATTR_ACT_BADARCH, ACT_ALLOW)
    s = nr("socket")
    first, last = min(AF_ALLOW), max(AF_ALLOW)
    rule(ctx, action, s, (0, CMP_LT, first, 0))
    rule(ctx, action, s, (0, CMP_GT, last, 0))
    for af in range(1, AF_MAX):
        if af not in AF_ALLOW and first < af < last:
            rule(ctx, action, s, (0, CMP_EQ, af, 0))
    return ctx


CLONE_NEW = {"CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWIPC": 0x08000000, "CLONE_NEWNET": 0x40000000,
             "CLONE_NEWNS": 0x00020000, "CLONE_NEWPID": 0x20000000, "CLONE_NEWUSER": 0x10000000,
             "CLONE_NEWUTS": 0x04000000}


def ns_filter():
    ctx = new_ctx(ACT_ALLOW)
    lib.seccomp_attr_set(ctx, ATTR_ACT_BADARCH, ACT_ALLOW)
    rule(ctx, ACT_ERRNO(EPERM), nr("setns"))
    for f in CLONE_NEW.values():
        rule(ctx, ACT_ERRNO(EPERM), nr("unshare"), (0, CMP_MASKED_EQ, f, f))
        rule(ctx, ACT_ERRNO(EPERM), nr("clone"), (0, CMP_MASKED_EQ, f, f))
    rule(ctx, ACT_ERRNO(ENOSYS), nr("clone3"))
    return ctx


def personality_filter():
    # systemd seccomp_lock_personality(PER_LINUX): one rule, personality(arg != PER_LINUX) -> EPERM.
    ctx = new_ctx(ACT_ALLOW)
    lib.seccomp_attr_set(ctx, ATTR_ACT_BADARCH, ACT_ALLOW)
    p = nr("personality")
    rule(ctx, ACT_ERRNO(EPERM), p, (0, CMP_NE, 0, 0))
    return ctx


def realtime_filter():
    ctx = new_ctx(ACT_ALLOW)
    lib.seccomp_attr_set(ctx, ATTR_ACT_BADARCH, ACT_ALLOW)
    s = nr("sched_setscheduler")
    permitted = {0, 3, 5}  # SCHED_OTHER, SCHED_BATCH, SCHED_IDLE
    for p in range(0, max(permitted)):
        if p not in permitted:
            rule(ctx, ACT_ERRNO(EPERM), s, (1, CMP_EQ, p, 0))
    rule(ctx, ACT_ERRNO(EPERM), s, (1, CMP_GT, max(permitted), 0))
    return ctx


def suid_filter():
    S_ISUID, S_ISGID, O_CREAT, O_TMPFILE = 0o4000, 0o2000, 0o100, 0o20200000
    ctx = new_ctx(ACT_ALLOW)
    lib.seccomp_attr_set(ctx, ATTR_ACT_BADARCH, ACT_ALLOW)
    for bit in (S_ISUID, S_ISGID):
        rule(ctx, ACT_ERRNO(EPERM), nr("chmod"), (1, CMP_MASKED_EQ, bit, bit))
        rule(ctx, ACT_ERRNO(EPERM), nr("fchmod"), (1, CMP_MASKED_EQ, bit, bit))
        rule(ctx, ACT_ERRNO(EPERM), nr("fchmodat"), (2, CMP_MASKED_EQ, bit, bit))
        rule(ctx, ACT_ERRNO(EPERM), nr("creat"), (1, CMP_MASKED_EQ, bit, bit))
        rule(ctx, ACT_ERRNO(EPERM), nr("open"), (1, CMP_MASKED_EQ, O_CREAT, O_CREAT),
             (2, CMP_MASKED_EQ, bit, bit))
        rule(ctx, ACT_ERRNO(EPERM), nr("openat"), (2, CMP_MASKED_EQ, O_CREAT, O_CREAT),
             (3, CMP_MASKED_EQ, bit, bit))
    return ctx


def main():
    ver = subprocess.run(["systemd-analyze", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    ctx, allowed, skipped, names = syscall_filter(ACT_ERRNO(EPERM))
    n_syscall = export(ctx, "syscall.bpf")
    ctx, _, _, _ = syscall_filter(ACT_TRAP)
    n_trap = export(ctx, "syscall_trap.bpf")
    sizes = {"syscall.bpf": n_syscall, "syscall_trap.bpf": n_trap,
             "af.bpf": export(af_filter(ACT_ERRNO(EAFNOSUPPORT)), "af.bpf"),
             "af_trap.bpf": export(af_filter(ACT_TRAP), "af_trap.bpf"),
             "ns.bpf": export(ns_filter(), "ns.bpf"),
             "personality.bpf": export(personality_filter(), "personality.bpf"),
             "realtime.bpf": export(realtime_filter(), "realtime.bpf"),
             "suid.bpf": export(suid_filter(), "suid.bpf")}
    # every x86_64 syscall number libseccomp knows, to list what the allow-list denies
    known = {}
    for i in range(0, 600):
        lib.seccomp_syscall_resolve_num_arch.restype = ctypes.c_void_p
        lib.seccomp_syscall_resolve_num_arch.argtypes = [ctypes.c_uint32, ctypes.c_int]
        p = lib.seccomp_syscall_resolve_num_arch(AUDIT_ARCH_X86_64, i)
        if p:
            known[i] = ctypes.string_at(p).decode()
            ctypes.CDLL(None).free(ctypes.c_void_p(p))
    denied = {i: n for i, n in known.items() if n not in allowed}
    meta = {
        "systemd": ver,
        "libseccomp": os.path.realpath(ctypes.util.find_library("seccomp") and
                                       "/usr/lib/x86_64-linux-gnu/libseccomp.so.2"),
        "system_service_names": len(expand("@system-service")),
        "privileged_names": len(expand("@privileged")),
        "allow_names_after_minus_privileged": len(names),
        "allowed_x86_64_count": len(allowed),
        "allowed": {n: allowed[n] for n in sorted(allowed, key=allowed.get)},
        "skipped_not_x86_64_or_unknown": skipped,
        "removed_by_privileged_from_system_service": sorted(expand("@system-service") & expand("@privileged")),
        "denied_x86_64": {str(i): n for i, n in sorted(denied.items())},
        "x86_64_known_max_nr": max(known),
        "bpf_instructions": sizes,
    }
    with open(os.path.join(OUT, "filters.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(json.dumps({k: v for k, v in meta.items() if k not in ("allowed", "denied_x86_64")}, indent=1))
    print("denied x86_64 syscalls:", len(denied))


if __name__ == "__main__":
    main()
