"""The C sources of `gxpc make`'s hook, built by hook/build.py.

- SHIM: a library that GNU make alone loads (LD_PRELOAD, checked against
  /proc/self/exe). It hides itself from make's environment before make's main()
  reads it, and wraps posix_spawn: a recipe's command, exactly as make would
  run it (the makefile's own SHELL and .SHELLFLAGS, or a program make would exec
  without a shell), is spawned as `gxpmake-job RELAY ARGV...` instead. Recipes
  that run make recursively and `$(shell ...)` run here unchanged (the sub-make
  inherits the hook). make itself is never patched and sees nothing of this.
- CLIENT: `gxpmake-job`, the process make waits for. It sends its argv, cwd and
  environment to the per-make relay (relay.py) with its stdin, stdout and stderr
  (SCM_RIGHTS), so the relay writes the recipe's output straight into make's
  fds; it forwards the signals it gets and exits with the recipe's status, or
  dies of the signal that killed it, as a shell would. About 0.3 ms of CPU.
"""

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int (*spawn_fn)(pid_t *, const char *, const posix_spawn_file_actions_t *,
                        const posix_spawnattr_t *, char *const[], char *const[]);
typedef int (*dup2_fn)(posix_spawn_file_actions_t *, int, int);

static int active;                   /* this process is the make we hook */
static int passive;                  /* a program of a recursive line: pass the hook to make */
static char *hook_env[8];            /* our variables, given back to sub-makes */
static int n_hook_env;
static const char *relay, *client;
static const char *make_base;        /* make's file name, for the recursion guess */

/* Which file actions dup a pipe onto fd 1: make's $(shell ...) reads one. */
#define FA_SLOTS 64
static const void *fa_key[FA_SLOTS];
static int fa_out[FA_SLOTS];

static void keep(const char *name) {
    const char *v = getenv(name);
    if (v && n_hook_env < 7) {
        size_t n = strlen(name) + strlen(v) + 2;
        char *s = malloc(n);
        if (s) { snprintf(s, n, "%s=%s", name, v); hook_env[n_hook_env++] = s; }
    }
}

static const char *value_of(const char *name) {
    size_t n = strlen(name);
    for (int i = 0; i < n_hook_env; i++)
        if (!strncmp(hook_env[i], name, n) && hook_env[i][n] == '=') return hook_env[i] + n + 1;
    return NULL;
}

/* Our variables out of this process's environment (the old LD_PRELOAD back). */
static void hide_hook_env(void) {
    const char *old = value_of("GXP_MAKE_OLD_PRELOAD");
    if (old) setenv("LD_PRELOAD", old, 1); else unsetenv("LD_PRELOAD");
    unsetenv("GXP_MAKE_EXE"); unsetenv("GXP_MAKE_RELAY");
    unsetenv("GXP_MAKE_CLIENT"); unsetenv("GXP_MAKE_OLD_PRELOAD");
}

/* Two modes. In the make we hook (GXP_MAKE_EXE is this program): wrap its
   spawns. In a program a recursive recipe line starts here (its shell, and
   what the shell runs): hide our variables too, and give them back only to a
   make it executes, so a recursive line sees the environment make gave it and
   its sub-make is hooked. */
__attribute__((constructor)) static void gxpmake_init(void) {
    const char *exe = getenv("GXP_MAKE_EXE");
    char self[4096];
    ssize_t n;
    if (!exe) return;
    keep("LD_PRELOAD"); keep("GXP_MAKE_EXE"); keep("GXP_MAKE_RELAY");
    keep("GXP_MAKE_CLIENT"); keep("GXP_MAKE_OLD_PRELOAD");
    exe = value_of("GXP_MAKE_EXE");
    relay = value_of("GXP_MAKE_RELAY");
    client = value_of("GXP_MAKE_CLIENT");
    if (!exe || !relay || !client) return;
    make_base = strrchr(exe, '/') ? strrchr(exe, '/') + 1 : exe;
    hide_hook_env();
    n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = 0;
        if (!strcmp(self, exe)) { active = 1; return; }
    }
    passive = 1;
}

static void forget_fa(const posix_spawn_file_actions_t *fa) {
    for (int i = 0; i < FA_SLOTS; i++)
        if (fa_key[i] == fa) fa_key[i] = NULL;
}

/* A new (or reused) file actions object dups nothing yet. */
int posix_spawn_file_actions_init(posix_spawn_file_actions_t *fa) {
    typedef int (*init_fn)(posix_spawn_file_actions_t *);
    static init_fn real;
    if (!real) real = (init_fn)dlsym(RTLD_NEXT, "posix_spawn_file_actions_init");
    if (active) forget_fa(fa);
    return real(fa);
}

int posix_spawn_file_actions_adddup2(posix_spawn_file_actions_t *fa, int fd, int newfd) {
    static dup2_fn real;
    if (!real) real = (dup2_fn)dlsym(RTLD_NEXT, "posix_spawn_file_actions_adddup2");
    if (active && newfd == 1) {
        struct stat st;
        int slot = -1;
        for (int i = 0; i < FA_SLOTS; i++)
            if (fa_key[i] == fa || (slot < 0 && !fa_key[i])) { slot = i; if (fa_key[i] == fa) break; }
        if (slot >= 0) {
            fa_key[slot] = fa;
            fa_out[slot] = fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode);
        }
    }
    return real(fa, fd, newfd);
}

static int stdout_is_pipe(const posix_spawn_file_actions_t *fa) {
    for (int i = 0; i < FA_SLOTS; i++)
        if (fa && fa_key[i] == fa) { fa_key[i] = NULL; return fa_out[i]; }
    return 0;
}

static const char *env_get(char *const envp[], const char *name) {
    size_t n = strlen(name);
    for (int i = 0; envp && envp[i]; i++)
        if (!strncmp(envp[i], name, n) && envp[i][n] == '=') return envp[i] + n + 1;
    return NULL;
}

/* Is this the word make (or gmake, or make's own file name)? */
static int is_make_word(const char *s, size_t n) {
    const char *slash = NULL;
    for (size_t i = 0; i < n; i++) if (s[i] == '/') slash = s + i;
    if (slash) { n -= (size_t)(slash + 1 - s); s = slash + 1; }
    return (n == 4 && !strncmp(s, "make", 4)) || (n == 5 && !strncmp(s, "gmake", 5)) ||
           (n == strlen(make_base) && !strncmp(s, make_base, n));
}

/* Does this command run make? With a pipe jobserver make leaves its fds open
   (no FD_CLOEXEC) only for lines that do ($(MAKE) or +); otherwise (-j1, or
   make 4.4's fifo:PATH) look for the word make in the command. */
static int is_recursive(char *const argv[], char *const envp[]) {
    const char *mf = env_get(envp, "MAKEFLAGS");
    const char *auth = mf ? strstr(mf, "--jobserver-auth=") : NULL;
    if (!auth && mf) auth = strstr(mf, "--jobserver-fds=");
    if (auth) {
        const char *v = strchr(auth, '=') + 1;
        if (strncmp(v, "fifo:", 5)) {
            int fd = atoi(v);
            int fl = fcntl(fd, F_GETFD);
            return fl >= 0 && !(fl & FD_CLOEXEC);
        }
    }
    for (int i = 0; argv[i]; i++) {
        const char *s = argv[i];
        while (*s) {
            while (*s && strchr(" \t\n;&|()`'\"", *s)) s++;
            const char *w = s;
            while (*s && !strchr(" \t\n;&|()`'\"", *s)) s++;
            if (s > w && is_make_word(w, (size_t)(s - w))) return 1;
        }
    }
    return 0;
}

/* envp plus our variables: a sub-make started here is hooked too. */
static char **with_hook_env(char *const envp[]) {
    int n = 0;
    while (envp && envp[n]) n++;
    char **out = malloc(sizeof(char *) * (size_t)(n + n_hook_env + 1));
    if (!out) return NULL;
    int k = 0;
    for (int i = 0; i < n; i++) {
        int ours = 0;
        for (int j = 0; j < n_hook_env; j++) {
            size_t len = strchr(hook_env[j], '=') - hook_env[j] + 1;
            if (!strncmp(envp[i], hook_env[j], len)) ours = 1;
        }
        if (!ours) out[k++] = envp[i];
    }
    for (int j = 0; j < n_hook_env; j++) out[k++] = hook_env[j];
    out[k] = NULL;
    return out;
}

static int is_make_path(const char *path) {
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    return is_make_word(base, strlen(base));
}

static int spawn(spawn_fn real, pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                 const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    if (passive && is_make_path(path)) {
        char **env = with_hook_env(envp);
        int r = real(pid, path, fa, attr, argv, env ? env : (char **)envp);
        free(env);
        return r;
    }
    if (!active) return real(pid, path, fa, attr, argv, envp);
    if (stdout_is_pipe(fa))                        /* $(shell ...): make reads it here */
        return real(pid, path, fa, attr, argv, envp);
    if (is_recursive(argv, envp)) {
        char **env = with_hook_env(envp);
        int r = real(pid, path, fa, attr, argv, env ? env : (char **)envp);
        free(env);
        return r;
    }
    int n = 0;
    while (argv[n]) n++;
    char **args = malloc(sizeof(char *) * (size_t)(n + 4));
    if (!args) return real(pid, path, fa, attr, argv, envp);
    args[0] = (char *)client;
    args[1] = (char *)relay;
    args[2] = (char *)path;              /* what make resolved; argv[0] as make wrote it */
    for (int i = 0; i <= n; i++) args[3 + i] = argv[i];
    int r = real(pid, client, fa, attr, args, envp);
    free(args);
    return r;
}

typedef int (*execve_fn)(const char *, char *const[], char *const[]);
typedef int (*execv_fn)(const char *, char *const[]);

int execve(const char *path, char *const argv[], char *const envp[]) {
    static execve_fn real;
    if (!real) real = (execve_fn)dlsym(RTLD_NEXT, "execve");
    if (passive && is_make_path(path)) {
        char **env = with_hook_env(envp);
        int r = real(path, argv, env ? env : (char **)envp);
        free(env);
        return r;
    }
    return real(path, argv, envp);
}

/* execv and execvp read environ (glibc's own execve call is not ours to wrap).
   make itself re-executes with execvp after remaking an included makefile:
   the new make must be hooked too. */
static int exec_environ(const char *name, const char *file, char *const argv[]) {
    execv_fn real = (execv_fn)dlsym(RTLD_NEXT, name);
    if (!real) return -1;
    if (!((active || passive) && is_make_path(file))) return real(file, argv);
    for (int i = 0; i < n_hook_env; i++) putenv(hook_env[i]);
    int r = real(file, argv);
    int e = errno;
    hide_hook_env();
    errno = e;
    return r;
}

int execv(const char *path, char *const argv[]) { return exec_environ("execv", path, argv); }
int execvp(const char *file, char *const argv[]) { return exec_environ("execvp", file, argv); }

int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
                const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    static spawn_fn real;
    if (!real) real = (spawn_fn)dlsym(RTLD_NEXT, "posix_spawn");
    return spawn(real, pid, path, fa, attr, argv, envp);
}

int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
                 const posix_spawnattr_t *attr, char *const argv[], char *const envp[]) {
    static spawn_fn real;
    if (!real) real = (spawn_fn)dlsym(RTLD_NEXT, "posix_spawnp");
    return spawn(real, pid, file, fa, attr, argv, envp);
}
"""

CLIENT = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

extern char **environ;
static int sock = -1;
static volatile sig_atomic_t got_signal;

static void on_signal(int sig) {
    unsigned char b = (unsigned char)sig;
    if (!got_signal) got_signal = sig;
    if (sock >= 0) { ssize_t r = write(sock, &b, 1); (void)r; }
}

static void fail(const char *what) {
    dprintf(2, "gxpc make: %s: %s\n", what, strerror(errno));
    _exit(127);
}

struct buf { char *p; size_t n, cap; };

static void put(struct buf *b, const void *data, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 65536;
        while (cap < b->n + n) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) fail("memory");
        b->cap = cap;
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void put_u32(struct buf *b, uint32_t v) { put(b, &v, 4); }
static void put_str(struct buf *b, const char *s) { put(b, s, strlen(s) + 1); }

int main(int argc, char **argv) {
    /* argv: gxpmake-job RELAY PATH ARGV... (PATH: the program make resolved) */
    if (argc < 4) { dprintf(2, "gxpc make: gxpmake-job is started by gxpc make only\n"); return 127; }
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(argv[1]) >= sizeof sa.sun_path) { errno = ENAMETOOLONG; fail(argv[1]); }
    strcpy(sa.sun_path, argv[1]);
    sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0) fail("socket");
    if (connect(sock, (struct sockaddr *)&sa, sizeof sa) < 0) fail("the make relay");

    struct buf b = {0};
    char cwd[8192];
    if (!getcwd(cwd, sizeof cwd)) fail("getcwd");
    put(&b, "GXPJ", 4);
    put_u32(&b, 0);                       /* length, filled below */
    put_str(&b, cwd);
    put_u32(&b, (uint32_t)(argc - 2));
    for (int i = 2; i < argc; i++) put_str(&b, argv[i]);
    uint32_t envc = 0;
    for (char **e = environ; *e; e++) envc++;
    put_u32(&b, envc);
    for (char **e = environ; *e; e++) put_str(&b, *e);
    uint32_t len = (uint32_t)b.n;
    memcpy(b.p + 4, &len, 4);

    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_handler = on_signal;
    sigaction(SIGINT, &act, NULL);
    sigaction(SIGTERM, &act, NULL);
    sigaction(SIGHUP, &act, NULL);
    sigaction(SIGQUIT, &act, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* the first bytes carry our stdin, stdout and stderr */
    int fds[3] = {0, 1, 2};
    char ctl[CMSG_SPACE(sizeof fds)];
    memset(ctl, 0, sizeof ctl);
    struct iovec iov = {b.p, b.n};
    struct msghdr mh;
    memset(&mh, 0, sizeof mh);
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl;
    mh.msg_controllen = sizeof ctl;
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(cm), fds, sizeof fds);
    ssize_t sent = sendmsg(sock, &mh, 0);
    /* ETOOMANYREFS: the user has more descriptors in flight than its limit (many
       recipes queued for the relay): wait for the relay to take some. */
    for (unsigned pause = 100; sent < 0 && (errno == EINTR || errno == ETOOMANYREFS); ) {
        if (errno == ETOOMANYREFS) {
            usleep(pause);
            if (pause < 20000) pause *= 2;
        }
        sent = sendmsg(sock, &mh, 0);
    }
    if (sent < 0) fail("the make relay");
    size_t off = (size_t)sent;
    while (off < b.n) {
        ssize_t r = write(sock, b.p + off, b.n - off);
        if (r < 0) { if (errno == EINTR) continue; fail("the make relay"); }
        off += (size_t)r;
    }

    int32_t status;
    size_t got = 0;
    while (got < sizeof status) {
        ssize_t r = read(sock, (char *)&status + got, sizeof status - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (got_signal) break;
            dprintf(2, "gxpc make: the make relay went away\n");
            return 127;
        }
        got += (size_t)r;
    }
    if (got_signal || (got == sizeof status && status < 0)) {
        int sig = got_signal ? got_signal : -status;
        signal(sig, SIG_DFL);
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, sig);
        sigprocmask(SIG_UNBLOCK, &set, NULL);
        raise(sig);
    }
    return got == sizeof status ? status : 127;
}
"""
