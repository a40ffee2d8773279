/*
 * A replica born inside its app's cgroup without copying the reaper.
 *
 * The reaper (reaper.py) starts a replica that comes alone with clone3 and
 * CLONE_INTO_CGROUP, since moving itself into the cgroup first waits for an
 * RCU grace period after a quiet while (5-15 ms here). From Python that clone
 * is a full fork: the reaper's page tables copied, its pages faulted in again
 * by the child's Python before the exec (2.4-2.8 ms a spawn, measured on
 * 2026-12-05). Here the child shares the reaper's memory and the reaper waits
 * until the exec (CLONE_VM | CLONE_VFORK, as glibc's posix_spawn): 1.0-1.4 ms,
 * most of it the kernel filling the new cgroup. glibc offers the same from
 * 2.39 (posix_spawnattr_setcgroup_np); Debian 12 has 2.36.
 *
 * The reaper loads this file with ctypes, not as a module: it runs with
 * ``python -I -S`` and imports nothing of the package. Built only where the
 * compiler is (an optional extension); without it, or off x86-64, the reaper
 * forks from Python as before.
 *
 * The child runs on a stack of its own and, sharing the reaper's memory, calls
 * nothing but system call wrappers: every signal is blocked around the clone,
 * and the child sets every handled signal back to its default before it
 * unblocks them, so no handler of the reaper's ever runs in it.
 */
#define _GNU_SOURCE
#include <Python.h>

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__x86_64__) && defined(__linux__)
#include <linux/sched.h>
#define ASV_HAVE_CLONE3 1
#endif

/* Where a child that did not reach its program stopped (reaper.py reads the same numbers). */
enum { STEP_CLONE = 0, STEP_SETUP = 1, STEP_CHDIR = 2, STEP_EXEC = 3 };

#define CHILD_STACK_SIZE (64 * 1024)
#define KERNEL_SIGSET_SIZE (_NSIG / 8)

struct spawn_job {
    const char *const *places; /* where the program may be, in PATH's order */
    char *const *argv;
    char *const *envp;
    const char *cwd;
    const int *stdio;            /* three descriptors, for 0, 1 and 2 */
    const int *signals_restored; /* ignored here, default in the replica; 0-terminated */
    sigset_t mask;               /* the reaper's own (as the kernel keeps it), the replica's */
    volatile int error;          /* set by a child that did not reach its program */
    volatile int step;
};

#ifdef ASV_HAVE_CLONE3
static void set_default(int sig)
{
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = SIG_DFL;
    sigaction(sig, &action, NULL);
}

static int child_fails(struct spawn_job *job, int error)
{
    job->error = error ? error : EINVAL;
    _exit(127);
}

/* In the child: what Popen(start_new_session=True) does, then the first place that runs. */
static int spawn_child(void *arg)
{
    struct spawn_job *job = arg;
    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction old;
        /* The C library refuses its own reserved signals: nothing to reset there. */
        if (sigaction(sig, NULL, &old) == 0 && old.sa_handler != SIG_IGN && old.sa_handler != SIG_DFL)
            set_default(sig);
    }
    for (const int *sig = job->signals_restored; *sig; sig++)
        set_default(*sig);
    job->step = STEP_SETUP;
    if (setsid() < 0)
        return child_fails(job, errno);
    for (int target = 0; target < 3; target++) {
        int fd = job->stdio[target];
        if (fd == target) { /* dup2 onto itself keeps close-on-exec: clear it instead */
            int flags = fcntl(fd, F_GETFD);
            if (flags < 0 || fcntl(fd, F_SETFD, flags & ~FD_CLOEXEC) < 0)
                return child_fails(job, errno);
        } else if (dup2(fd, target) < 0) {
            return child_fails(job, errno);
        }
    }
    job->step = STEP_CHDIR;
    if (chdir(job->cwd) < 0)
        return child_fails(job, errno);
    job->step = STEP_SETUP;
    if (syscall(SYS_rt_sigprocmask, SIG_SETMASK, &job->mask, NULL, KERNEL_SIGSET_SIZE) < 0)
        return child_fails(job, errno);
    /* As Popen: the first error that is not "not there", else the last one. */
    job->step = STEP_EXEC;
    int first = 0, last = ENOENT;
    for (const char *const *place = job->places; *place; place++) {
        execve(*place, job->argv, job->envp);
        last = errno;
        if (!first && last != ENOENT && last != ENOTDIR)
            first = last;
    }
    return child_fails(job, first ? first : last);
}

/*
 * clone3 that runs ``fn(arg)`` in the child on the stack ``args`` gives, then exits.
 * A system call made inline: with CLONE_VM, a child returning through a C function
 * would overwrite the frames the waiting parent returns through.
 */
static long clone3_running(struct clone_args *args, int (*fn)(void *), void *arg)
{
    register long rax __asm__("rax") = SYS_clone3;
    register struct clone_args *rdi __asm__("rdi") = args;
    register long rsi __asm__("rsi") = sizeof *args;
    register int (*r12)(void *) __asm__("r12") = fn;
    register void *r13 __asm__("r13") = arg;
    __asm__ volatile(
        "syscall\n\t"
        "test %%rax, %%rax\n\t"
        "jnz 1f\n\t"
        /* The child, on its own stack (16-byte aligned: the call makes the frame ABI's). */
        "xor %%ebp, %%ebp\n\t"
        "mov %%r13, %%rdi\n\t"
        "call *%%r12\n\t"
        "mov %%eax, %%edi\n\t"
        "mov %[exit_group], %%eax\n\t"
        "syscall\n\t"
        "hlt\n\t"
        "1:\n\t"
        : "+r"(rax)
        : "r"(rdi), "r"(rsi), "r"(r12), "r"(r13), [exit_group] "i"(SYS_exit_group)
        : "rcx", "r11", "memory", "cc");
    return rax;
}

/* The child of ``asv_populate_cgroup``: its whole life is its exit. */
static int exit_at_once(void *arg)
{
    (void)arg;
    return 0;
}
#endif

/*
 * Start ``argv`` from the first of ``places`` that runs, inside the cgroup of the
 * directory ``cgroup_fd``: the pid, or minus an errno with ``*step`` saying where
 * it failed (STEP_CLONE: no child was made, the caller spawns another way).
 */
__attribute__((visibility("default"))) long asv_spawn_into_cgroup(
    int cgroup_fd, const char *const *places, char *const *argv, char *const *envp,
    const char *cwd, const int *stdio, const int *signals_restored, int *step)
{
    *step = STEP_CLONE;
#ifndef ASV_HAVE_CLONE3
    (void)cgroup_fd, (void)places, (void)argv, (void)envp, (void)cwd, (void)stdio;
    (void)signals_restored;
    return -ENOSYS;
#else
    void *stack = mmap(NULL, CHILD_STACK_SIZE, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED)
        return -errno;
    struct spawn_job job;
    memset(&job, 0, sizeof job);
    job.places = places;
    job.argv = argv;
    job.envp = envp;
    job.cwd = cwd;
    job.stdio = stdio;
    job.signals_restored = signals_restored;
    /* From the kernel itself: the C library's calls leave its own two signals unblocked. */
    sigset_t all;
    memset(&all, 0xff, sizeof all);
    if (syscall(SYS_rt_sigprocmask, SIG_BLOCK, &all, &job.mask, KERNEL_SIGSET_SIZE) < 0) {
        int error = errno;
        munmap(stack, CHILD_STACK_SIZE);
        return -error;
    }
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.flags = CLONE_VM | CLONE_VFORK | CLONE_INTO_CGROUP;
    args.exit_signal = SIGCHLD;
    args.stack = (uint64_t)(uintptr_t)stack;
    args.stack_size = CHILD_STACK_SIZE;
    args.cgroup = (uint64_t)cgroup_fd;
    long pid = clone3_running(&args, spawn_child, &job);
    /* Here the child has exec'd or exited: it no longer uses the stack or ``job``. */
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &job.mask, NULL, KERNEL_SIGSET_SIZE);
    munmap(stack, CHILD_STACK_SIZE);
    if (pid < 0)
        return pid;
    if (job.error) {
        int status;
        while (waitpid((pid_t)pid, &status, 0) < 0 && errno == EINTR) {
        }
        *step = job.step;
        return -job.error;
    }
    return pid;
#endif
}

/*
 * Have the new (empty) cgroup of ``cgroup_fd`` populated once by a child born in it
 * that exits at once, reaped here: 0, or minus an errno (no child was made).
 *
 * The first process in a cgroup makes it populated, and Linux notifies the
 * watchers of its ``cgroup.events`` through a kernel worker queued on this CPU.
 * With a replica as that first process, the reaper waited for its exec while
 * the worker ran, and was woken late: 0.7-0.9 ms for a spawn that takes
 * 0.2-0.25 ms right after this child (medians of 20, 2026-12-05). Linux sends a
 * cgroup's notifications at most every 20 ms, the later ones from a timer: the
 * replica's spawn right after this finds none to wait behind (one 50 ms later
 * did again). The child uses nothing but its own stack and takes no signal (all
 * blocked), so it shares this process's memory, descriptors and handlers instead
 * of copying them: 0.15 ms in all. One at a time (one stack): it is reaped here.
 */
__attribute__((visibility("default"))) long asv_populate_cgroup(int cgroup_fd)
{
#ifndef ASV_HAVE_CLONE3
    (void)cgroup_fd;
    return -ENOSYS;
#else
    static char stack[4096] __attribute__((aligned(16)));
    sigset_t all, mask;
    memset(&all, 0xff, sizeof all);
    if (syscall(SYS_rt_sigprocmask, SIG_BLOCK, &all, &mask, KERNEL_SIGSET_SIZE) < 0)
        return -errno;
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.flags = CLONE_VM | CLONE_FILES | CLONE_FS | CLONE_SIGHAND | CLONE_INTO_CGROUP;
    args.exit_signal = 0; /* no SIGCHLD: reaped below, never seen by the reaper's loop */
    args.stack = (uint64_t)(uintptr_t)stack;
    args.stack_size = sizeof stack;
    args.cgroup = (uint64_t)cgroup_fd;
    long pid = clone3_running(&args, exit_at_once, NULL);
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &mask, NULL, KERNEL_SIGSET_SIZE);
    if (pid < 0)
        return pid;
    int status;
    while (waitpid((pid_t)pid, &status, __WALL) < 0 && errno == EINTR) {
    }
    return 0;
#endif
}

/* Importable too (the package's tests and tools find it as a module); it defines nothing. */
static struct PyModuleDef cspawn_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_cspawn",
    .m_doc = "The reaper's spawn into a cgroup, loaded through ctypes (see the source).",
};

PyMODINIT_FUNC PyInit__cspawn(void) { return PyModuleDef_Init(&cspawn_module); }
