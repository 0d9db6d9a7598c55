/* LD_PRELOAD helper for the diagnostic run only: with syscall_trap.bpf / af_trap.bpf a denied
 * system call raises SIGSYS instead of failing; this handler logs it (pid, comm, number, arg0) to
 * $SIGSYS_LOG and makes the call return what the real filter returns: -EAFNOSUPPORT for socket(),
 * -EPERM for anything else. Only raw write() is used in the handler (async-signal-safe). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

static int logfd = -1;
static char comm[32] = "?";

static int fmt_u(char *p, unsigned long v, int base) {
    char t[32]; int n = 0, i;
    do { t[n++] = "0123456789abcdef"[v % base]; v /= base; } while (v);
    for (i = 0; i < n; i++) p[i] = t[n - 1 - i];
    return n;
}

static void handler(int sig, siginfo_t *si, void *vctx) {
    ucontext_t *uc = (ucontext_t *)vctx;
    int saved = errno;
    int nr = si->si_syscall;
    long ret = (nr == SYS_socket) ? -EAFNOSUPPORT : -EPERM;
    char buf[160]; int n = 0;
    memcpy(buf + n, "DENIED pid=", 11); n += 11;
    n += fmt_u(buf + n, (unsigned long)syscall(SYS_getpid), 10);
    memcpy(buf + n, " comm=", 6); n += 6;
    { size_t l = strlen(comm); memcpy(buf + n, comm, l); n += l; }
    memcpy(buf + n, " nr=", 4); n += 4;
    n += fmt_u(buf + n, (unsigned long)nr, 10);
    memcpy(buf + n, " arg0=0x", 8); n += 8;
    n += fmt_u(buf + n, (unsigned long)uc->uc_mcontext.gregs[REG_RDI], 16);
    buf[n++] = '\n';
    if (logfd >= 0) (void)!write(logfd, buf, n);
    uc->uc_mcontext.gregs[REG_RAX] = ret;
    errno = saved;
}

__attribute__((constructor)) static void sigsys_log_init(void) {
    const char *p = getenv("SIGSYS_LOG");
    struct sigaction sa;
    int fd;
    if (!p) return;
    fd = open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t r = read(fd, comm, sizeof(comm) - 1);
        if (r > 0) { comm[r] = 0; if (comm[r - 1] == '\n') comm[r - 1] = 0; }
        close(fd);
    }
    logfd = open(p, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = handler;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSYS, &sa, NULL);
}
