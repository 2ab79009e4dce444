/* The simulated libnvidia-ml.so.1 of dra_driver's GPU simulator: the core (docs/simulated-libnvml.md).
 *
 * The library holds no GPU state of its own. Every modelled call is forwarded over a Unix socket to a server process
 * running the Python simulator (dra_driver.simulator.libnvml.server) on the simulated machine's state directory, the
 * same files the Python simulator and the driver read and write, so that all of them see one machine.
 *
 * Finding the machine: the state directory is the nearest ancestor of this library's own file (dladdr, symlinks
 * resolved) that holds `libnvml.conf`; the simulator lays a machine out as <state>/driver-root/usr/lib/<triplet>/
 * libnvidia-ml.so.<version>. $DRA_DRIVER_LIBNVML_STATE names it instead (a copy of the library elsewhere, a
 * container). The server listens on <state>/libnvml.sock; when nobody does, the first caller starts it (fork, exec of
 * a Python named in libnvml.conf) under the lock <state>/libnvml.lock, so that only one starts, and waits until it
 * listens. Nothing else is needed: no environment variable, no server started by hand.
 *
 * In a container: a copy of the library that finds neither (a CDI spec bind-mounted it, with the rest of the driver
 * root, into the container) reaches its machine through /run/nvidia-persistenced/socket, the driver root's
 * persistenced socket that the CDI spec mounts there, on which the machine's simulated nvidia-persistenced
 * (dra_driver.simulator.libnvml.persistenced) hands each connection to the server. The server answers as NVML does
 * in a container, with only the GPUs and MIG devices whose nodes (/dev/nvidia<minor>,
 * /dev/nvidia-caps/nvidia-cap<minor>) the connecting process has: it looks into this process's mount namespace itself,
 * or, where it cannot see this process (another pid namespace), takes the nodes this library passes it open.
 *
 * Every connection opens with a hello naming this process by a random token: the server lets only this process's
 * connections use the event sets it makes.
 *
 * Per process: nvmlInit and nvmlShutdown count references here; connections are pooled (one per concurrent call, so
 * that a thread waiting in nvmlEventSetWait holds up no other) and closed at the last nvmlShutdown; a forked child
 * starts with an empty pool. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "libnvml.h"

#define CONF_NAME "libnvml.conf"
#define SOCK_NAME "libnvml.sock"
#define LOCK_NAME "libnvml.lock"
#define LOG_NAME "libnvml-server.log"
#define STATE_ENV "DRA_DRIVER_LIBNVML_STATE"
#define DEBUG_ENV "DRA_DRIVER_LIBNVML_DEBUG"
#define STUB_LOG_ENV "DRA_DRIVER_LIBNVML_STUB_LOG" /* a file: every call of an unmodelled function, a line */
#define PERSISTENCED_SOCKET "/run/nvidia-persistenced/socket" /* where a CDI spec mounts the driver root's socket */
#define HELLO_FUNCTION "simnvmlHello" /* a connection's first request (server.py): not an NVML function */
#define HELLO_TIMEOUT_S 130      /* the persistenced may have to start the server (READY_TIMEOUT_MS) first */
#define MAX_NODE_FDS 250         /* a container's device nodes passed with its hello: under SCM_MAX_FD (253) */
#define SERVER_MODULE "dra_driver.simulator.libnvml.server"
#define MAX_ANCESTORS 8           /* how far up from the library the state directory may lie */
#define READY_TIMEOUT_MS 120000   /* a cold Python start on a loaded machine */
#define POOL_MAX 16
#define MAX_MESSAGE (16u << 20)
#define MAX_OUTPUTS 16
#define PROTOCOL_MAGIC 0x314d564eu /* "NVM1", little-endian */

extern char **environ;

static pthread_mutex_t g_init_lock = PTHREAD_MUTEX_INITIALIZER; /* refcount, state discovery */
static pthread_mutex_t g_pool_lock = PTHREAD_MUTEX_INITIALIZER; /* the connection pool; taken around fork */
static unsigned int g_refcount;
static char g_state[PATH_MAX]; /* the state directory; "" until found */
static int g_container;        /* no state directory: the machine is reached through PERSISTENCED_SOCKET */
static char g_view[2048];      /* in a container: the device nodes it has, "gpus=<minors> caps=<minors>" */
static char g_client[33];      /* this process's random token, hex: its connections share its event sets */
static int g_state_fd = -1;    /* O_PATH of it: reaches a socket whose path is too long for sun_path */
static int g_pool[POOL_MAX];
static int g_pool_n;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void debugf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void debugf(const char *fmt, ...)
{
    const char *on = getenv(DEBUG_ENV);
    if (on == NULL || *on == '\0' || strcmp(on, "0") == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("libnvidia-ml (simulated): ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* ----- the connection pool, fork-safe ------------------------------------------------------------------------ */
static void atfork_prepare(void) { pthread_mutex_lock(&g_pool_lock); }
static void atfork_parent(void) { pthread_mutex_unlock(&g_pool_lock); }
static void atfork_child(void)
{
    /* The parent's connections carry the parent's calls: the child must not read their answers. */
    for (int i = 0; i < g_pool_n; i++)
        close(g_pool[i]);
    g_pool_n = 0;
    pthread_mutex_unlock(&g_pool_lock);
}

/* 128 random bits: another process cannot guess them, so cannot use this one's event sets. */
static void make_token(void)
{
    unsigned char raw[16];
    size_t got = 0;
    while (got < sizeof raw) {
        ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    if (got < sizeof raw) { /* no getrandom (an old kernel): /dev/urandom, else the clock and pid */
        int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
        ssize_t n = fd >= 0 ? read(fd, raw, sizeof raw) : -1;
        if (fd >= 0)
            close(fd);
        if (n != (ssize_t)sizeof raw) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t mix[2] = {(uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32), (uint64_t)ts.tv_sec};
            memcpy(raw, mix, sizeof raw);
        }
    }
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(g_client + 2 * i, 3, "%02x", raw[i]);
}

static void once_init(void)
{
    make_token();
    pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

static void pool_put(int fd)
{
    pthread_mutex_lock(&g_pool_lock);
    if (g_pool_n < POOL_MAX && __atomic_load_n(&g_refcount, __ATOMIC_ACQUIRE) > 0) {
        g_pool[g_pool_n++] = fd;
        fd = -1;
    }
    pthread_mutex_unlock(&g_pool_lock);
    if (fd >= 0)
        close(fd);
}

static int pool_take(void)
{
    int fd = -1;
    pthread_mutex_lock(&g_pool_lock);
    if (g_pool_n > 0)
        fd = g_pool[--g_pool_n];
    pthread_mutex_unlock(&g_pool_lock);
    return fd;
}

static void pool_drain(void)
{
    pthread_mutex_lock(&g_pool_lock);
    for (int i = 0; i < g_pool_n; i++)
        close(g_pool[i]);
    g_pool_n = 0;
    pthread_mutex_unlock(&g_pool_lock);
}

/* ----- finding the simulated machine ------------------------------------------------------------------------- */
static int path_join(char *out, size_t size, const char *dir, const char *name)
{
    int n = snprintf(out, size, "%s/%s", dir, name);
    return n < 0 || (size_t)n >= size ? -1 : 0;
}

static int set_state(const char *dir)
{
    char conf[PATH_MAX];
    if (path_join(conf, sizeof conf, dir, CONF_NAME) != 0 || access(conf, R_OK) != 0)
        return -1;
    int fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    if (g_state_fd >= 0)
        close(g_state_fd);
    g_state_fd = fd;
    snprintf(g_state, sizeof g_state, "%s", dir);
    return 0;
}

static int find_state(void)
{
    const char *env = getenv(STATE_ENV);
    if (env != NULL && *env != '\0') {
        if (set_state(env) == 0)
            return 0;
        debugf("$%s=%s holds no %s", STATE_ENV, env, CONF_NAME);
        return -1;
    }
    Dl_info info;
    char path[PATH_MAX];
    if (dladdr((void *)&find_state, &info) == 0 || info.dli_fname == NULL || realpath(info.dli_fname, path) == NULL) {
        debugf("cannot tell where this library lies");
        return -1;
    }
    for (int level = 0; level < MAX_ANCESTORS; level++) {
        char *slash = strrchr(path, '/');
        if (slash == NULL || slash == path)
            break;
        *slash = '\0';
        if (set_state(path) == 0)
            return 0;
    }
    struct stat st;
    if (stat(PERSISTENCED_SOCKET, &st) == 0 && S_ISSOCK(st.st_mode)) {
        g_container = 1;
        debugf("no %s above %s: reaching the machine through %s", CONF_NAME, info.dli_fname, PERSISTENCED_SOCKET);
        return 0;
    }
    debugf("no %s above %s and no %s (not a simulated driver root; set $%s)", CONF_NAME, info.dli_fname,
           PERSISTENCED_SOCKET, STATE_ENV);
    return -1;
}

/* Appends to `out` the numbers N of the character devices <dir>/<prefix>N, comma-separated: the device nodes a
 * container got (NVML there sees the GPUs and MIG devices whose nodes it can open, and no other). */
static void append_minors(char *out, size_t size, const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    size_t prefix_len = strlen(prefix);
    int first = 1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *digits = e->d_name + prefix_len;
        if (strncmp(e->d_name, prefix, prefix_len) != 0 || *digits == '\0' ||
            strspn(digits, "0123456789") != strlen(digits) || strlen(digits) > 9)
            continue;
        char path[PATH_MAX];
        struct stat st;
        if (path_join(path, sizeof path, dir, e->d_name) != 0 || stat(path, &st) != 0 || !S_ISCHR(st.st_mode))
            continue;
        size_t len = strlen(out);
        if (len + strlen(digits) + 2 >= size)
            break;
        snprintf(out + len, size - len, "%s%s", first ? "" : ",", digits);
        first = 0;
    }
    closedir(d);
}

static void find_view(void)
{
    snprintf(g_view, sizeof g_view, "gpus=");
    append_minors(g_view, sizeof g_view, "/dev", "nvidia");
    size_t len = strlen(g_view);
    snprintf(g_view + len, sizeof g_view - len, " caps=");
    append_minors(g_view, sizeof g_view, "/dev/nvidia-caps", "nvidia-cap");
    debugf("this container's device nodes: %s", g_view);
}

/* ----- reaching and starting the server ---------------------------------------------------------------------- */
static int send_hello(int fd);

/* A connection with its hello answered; -1 when nobody listens, -2 when someone does but the hello got no answer
 * (a server at its limits, one leaving, the persistenced finding no server): no new server is started for that. */
static int try_connect(void)
{
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (g_container) {
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", PERSISTENCED_SOCKET);
    } else if (path_join(sa.sun_path, sizeof sa.sun_path, g_state, SOCK_NAME) != 0) {
        char dir[64];
        snprintf(dir, sizeof dir, "/proc/self/fd/%d", g_state_fd);
        if (path_join(sa.sun_path, sizeof sa.sun_path, dir, SOCK_NAME) != 0)
            return -1;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(sa.sun_path) + 1);
    while (connect(fd, (struct sockaddr *)&sa, len) != 0) {
        if (errno == EINTR)
            continue;
        close(fd);
        return -1;
    }
    if (send_hello(fd) != 0) {
        close(fd);
        return -2;
    }
    return fd;
}

/* The first `python<TAB>interpreter<TAB>package directory` line of libnvml.conf whose interpreter and dra_driver
 * package exist here (a state directory may be shared by a host and a container, each writing its own). */
static int pick_python(char *python, size_t python_size, char *package, size_t package_size)
{
    char conf[PATH_MAX], line[2 * PATH_MAX + 16];
    if (path_join(conf, sizeof conf, g_state, CONF_NAME) != 0)
        return -1;
    FILE *f = fopen(conf, "re");
    if (f == NULL)
        return -1;
    int found = -1;
    while (found != 0 && fgets(line, sizeof line, f) != NULL) {
        line[strcspn(line, "\n")] = '\0';
        char *save = NULL, *key = strtok_r(line, "\t", &save), *py = strtok_r(NULL, "\t", &save),
             *pkg = strtok_r(NULL, "\t", &save);
        struct stat st;
        if (key == NULL || strcmp(key, "python") != 0 || py == NULL || pkg == NULL)
            continue;
        if (access(py, X_OK) != 0 || stat(pkg, &st) != 0 || !S_ISDIR(st.st_mode))
            continue;
        if ((size_t)snprintf(python, python_size, "%s", py) >= python_size ||
            (size_t)snprintf(package, package_size, "%s", pkg) >= package_size)
            continue;
        found = 0;
    }
    fclose(f);
    return found;
}

static void close_from(int lowest)
{
#ifdef SYS_close_range
    if (syscall(SYS_close_range, (unsigned int)lowest, ~0u, 0u) == 0)
        return;
#endif
    for (int fd = lowest; fd < 4096; fd++)
        close(fd);
}

/* Starts the server, detached (its own session, reparented to init), and waits until it listens: it inherits the
 * write end of a pipe as fd 3 and closes it once its socket accepts, or dies, which closes it too. */
static int spawn_server(void)
{
    char python[PATH_MAX], package[PATH_MAX], sys_path[PATH_MAX], log_path[PATH_MAX];
    if (pick_python(python, sizeof python, package, sizeof package) != 0) {
        debugf("%s/%s names no Python with the dra_driver package that exists here", g_state, CONF_NAME);
        return -1;
    }
    snprintf(sys_path, sizeof sys_path, "%s", package);
    char *slash = strrchr(sys_path, '/');
    if (slash == NULL)
        return -1;
    *slash = '\0';
    if (slash == sys_path)
        sys_path[1] = '\0';
    if (path_join(log_path, sizeof log_path, g_state, LOG_NAME) != 0)
        return -1;
    static const char code[] = "import sys; sys.path.insert(0, sys.argv[1]); "
                               "from " SERVER_MODULE " import main; sys.exit(main(sys.argv[2:]))";
    char *argv[] = {python, "-c", (char *)code, sys_path, "--state", g_state, "--ready-fd", "3", NULL};
    size_t n_env = 0;
    while (environ != NULL && environ[n_env] != NULL)
        n_env++;
    char **envp = calloc(n_env + 1, sizeof *envp);
    if (envp == NULL)
        return -1;
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++) {
        const char *e = environ[i];
        /* The server is the simulator's own Python: nothing of the caller's loader or Python setup. */
        if (strncmp(e, "LD_PRELOAD=", 11) == 0 || strncmp(e, "PYTHONHOME=", 11) == 0 ||
            strncmp(e, "PYTHONPATH=", 11) == 0 || strncmp(e, "PYTHONSTARTUP=", 14) == 0)
            continue;
        envp[k++] = environ[i];
    }
    envp[k] = NULL;
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) != 0) {
        free(envp);
        return -1;
    }
    debugf("starting %s for %s", SERVER_MODULE, g_state);
    pid_t pid = fork();
    if (pid == 0) {
        /* Only async-signal-safe calls from here on: the caller may be multithreaded (a Go program). */
        setsid();
        pid_t grandchild = fork();
        if (grandchild != 0)
            _exit(grandchild < 0 ? 1 : 0);
        int ready = fcntl(pipefd[1], F_DUPFD, 10);
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0 && null != 0)
            dup2(null, 0);
        int log = open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (log >= 0) {
            dup2(log, 1);
            dup2(log, 2);
        }
        if (ready < 0 || dup2(ready, 3) != 3)
            _exit(126);
        close_from(4);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        int sigs[] = {SIGCHLD, SIGPIPE, SIGINT, SIGTERM, SIGHUP};
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
            sigaction(sigs[i], &dfl, NULL);
        if (chdir("/") != 0)
            _exit(126);
        execve(python, argv, envp);
        _exit(127);
    }
    close(pipefd[1]);
    free(envp);
    if (pid < 0) {
        close(pipefd[0]);
        return -1;
    }
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    struct pollfd p = {.fd = pipefd[0], .events = POLLIN};
    int waited = 0, rc;
    for (;;) {
        rc = poll(&p, 1, 500);
        if (rc < 0 && errno == EINTR)
            continue;
        if (rc != 0)
            break;
        waited += 500;
        if (waited >= READY_TIMEOUT_MS) {
            debugf("the server did not start within %d s (see %s)", READY_TIMEOUT_MS / 1000, log_path);
            break;
        }
    }
    close(pipefd[0]);
    return 0;
}

static int lock_start(void)
{
    char path[PATH_MAX];
    if (path_join(path, sizeof path, g_state, LOCK_NAME) != 0)
        return -1;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    while (flock(fd, LOCK_EX) != 0) {
        if (errno != EINTR) {
            close(fd);
            return -1;
        }
    }
    return fd;
}

/* A connection: a pooled one, else a new one, starting the server when nobody listens. `*pooled` tells which. */
static int get_connection(int *pooled)
{
    int fd = pool_take();
    *pooled = fd >= 0;
    if (fd >= 0)
        return fd;
    fd = try_connect();
    if (fd != -1)
        return fd;
    if (g_container) { /* nothing to start here: the host's simulated nvidia-persistenced starts the server */
        for (int attempt = 0; fd == -1 && attempt < 2; attempt++) { /* a server that left as it was reached */
            usleep(50000);
            fd = try_connect();
        }
        if (fd < 0)
            debugf("nobody answers on %s (is the machine's simulated nvidia-persistenced running?)",
                   PERSISTENCED_SOCKET);
        return fd;
    }
    int lock = lock_start(); /* the server takes it too before it leaves: no start races a stop */
    fd = try_connect();
    if (fd == -1 && spawn_server() == 0)
        fd = try_connect();
    if (lock >= 0)
        close(lock);
    if (fd < 0)
        debugf("no simulator server for %s (see %s/%s)", g_state, g_state, LOG_NAME);
    return fd;
}

/* ----- the wire format (docs/simulated-libnvml.md) ----------------------------------------------------------- */
typedef struct {
    unsigned char *data;
    size_t len, cap;
    int failed;
} buf_t;

static void put(buf_t *b, const void *p, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        unsigned char *d = realloc(b->data, cap);
        if (d == NULL) {
            b->failed = 1;
            return;
        }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
}
static void put_u8(buf_t *b, uint8_t v) { put(b, &v, 1); }
static void put_u16(buf_t *b, uint16_t v) { put(b, &v, 2); }
static void put_u32(buf_t *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf_t *b, uint64_t v) { put(b, &v, 8); }

static int write_all(int fd, const unsigned char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* 0: all read; -1: error or EOF after `*got` bytes. */
static int read_all(int fd, unsigned char *p, size_t n, size_t *got)
{
    while (n > 0) {
        ssize_t r = recv(fd, p, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        p += r;
        n -= (size_t)r;
        *got += (size_t)r;
    }
    return 0;
}

enum out_kind { OUT_PLAIN, OUT_VERSIONED, OUT_STRING, OUT_COUNT, OUT_ARRAY };
typedef struct {
    enum out_kind kind;
    void *ptr;
    size_t size; /* the most bytes the caller's buffer holds */
} out_t;

/* A request frame, with `fds` (SCM_RIGHTS) on its first byte. */
static int send_frame(int fd, const buf_t *req, const int *fds, int n_fds)
{
    unsigned char head[4];
    uint32_t len = (uint32_t)req->len;
    memcpy(head, &len, 4);
    if (n_fds <= 0)
        return write_all(fd, head, 4) != 0 || write_all(fd, req->data, req->len) != 0 ? -1 : 0;
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int) * MAX_NODE_FDS)];
    } control;
    memset(&control, 0, sizeof control);
    struct iovec iov[2] = {{head, 4}, {req->data, req->len}};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = 2, .msg_control = control.buf,
                         .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n_fds)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n_fds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)n_fds);
    ssize_t w;
    do
        w = sendmsg(fd, &msg, MSG_NOSIGNAL);
    while (w < 0 && errno == EINTR);
    if (w <= 0)
        return -1;
    size_t sent = (size_t)w; /* the rest plainly, if the socket took only part: the descriptors went with byte 0 */
    if (sent < 4 && write_all(fd, head + sent, 4 - sent) != 0)
        return -1;
    size_t body = sent < 4 ? 0 : sent - 4;
    return write_all(fd, req->data + body, req->len - body);
}

/* One round trip; returns the server's code, or -1 when the connection failed before any answer arrived. */
static int round_trip(int fd, const buf_t *req, const int *fds, int n_fds, unsigned char **resp, uint32_t *resp_len,
                      size_t *got)
{
    if (send_frame(fd, req, fds, n_fds) != 0)
        return -1;
    if (read_all(fd, (unsigned char *)resp_len, 4, got) != 0 || *resp_len < 6 || *resp_len > MAX_MESSAGE)
        return -1;
    *resp = malloc(*resp_len);
    if (*resp == NULL || read_all(fd, *resp, *resp_len, got) != 0)
        return -1;
    return 0;
}

static nvmlReturn_t apply(const unsigned char *resp, uint32_t resp_len, out_t *outs, int n_outs)
{
    int32_t rc;
    uint16_t n_blobs;
    memcpy(&rc, resp, 4);
    memcpy(&n_blobs, resp + 4, 2);
    if (n_blobs != n_outs) {
        debugf("answer with %u outputs for %d", n_blobs, n_outs);
        return NVML_ERROR_UNKNOWN;
    }
    size_t off = 6;
    for (int i = 0; i < n_outs; i++) {
        int32_t blob;
        if (off + 4 > resp_len)
            return NVML_ERROR_UNKNOWN;
        memcpy(&blob, resp + off, 4);
        off += 4;
        if (blob < 0)
            continue; /* not written */
        if (off + (size_t)blob > resp_len || outs[i].ptr == NULL || (size_t)blob > outs[i].size) {
            debugf("output %d: %d bytes for a buffer of %zu", i, blob, outs[i].size);
            return NVML_ERROR_UNKNOWN;
        }
        memcpy(outs[i].ptr, resp + off, (size_t)blob);
        off += (size_t)blob;
    }
    return (nvmlReturn_t)rc;
}

/* Opens (O_PATH: nothing of the device is touched) the nodes g_view names, at most `max`: the server takes what
 * each one is (its device number) where it cannot look into this process's mount namespace itself. */
static int open_nodes(int *fds, int max)
{
    int n = 0;
    const char *p = g_view;
    const char *gpus = strstr(p, "gpus="), *caps = strstr(p, " caps=");
    for (int part = 0; part < 2; part++) {
        const char *at = part == 0 ? gpus : caps;
        if (at == NULL)
            continue;
        at = strchr(at, '=') + 1;
        const char *dir = part == 0 ? "/dev/nvidia" : "/dev/nvidia-caps/nvidia-cap";
        while (n < max && *at >= '0' && *at <= '9') {
            char path[64];
            size_t digits = strspn(at, "0123456789");
            if (digits < 12) {
                snprintf(path, sizeof path, "%s%.*s", dir, (int)digits, at);
                int fd = open(path, O_PATH | O_CLOEXEC);
                if (fd >= 0)
                    fds[n++] = fd;
            }
            at += digits;
            if (*at == ',')
                at++;
        }
    }
    return n;
}

/* A connection's first request: this process's token, and in a container the device nodes it has (named in the
 * text, passed open). 0 when the server took it. */
static int send_hello(int fd)
{
    char text[sizeof g_view + 64];
    snprintf(text, sizeof text, "client=%s%s%s", g_client, g_container ? " " : "", g_container ? g_view : "");
    buf_t req = {0};
    size_t name_len = strlen(HELLO_FUNCTION), text_len = strlen(text);
    put_u32(&req, PROTOCOL_MAGIC);
    put_u16(&req, (uint16_t)name_len);
    put(&req, HELLO_FUNCTION, name_len);
    put_u16(&req, 1);
    put(&req, "s", 1);
    put_u8(&req, 1);
    put_u32(&req, (uint32_t)text_len);
    put(&req, text, text_len);
    int fds[MAX_NODE_FDS];
    int n_fds = g_container ? open_nodes(fds, MAX_NODE_FDS) : 0;
    struct timeval tv = {.tv_sec = HELLO_TIMEOUT_S}, none = {0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv); /* something else listening there may never answer */
    unsigned char *resp = NULL;
    uint32_t resp_len = 0;
    size_t got = 0;
    int rc = req.failed ? -1 : round_trip(fd, &req, fds, n_fds, &resp, &resp_len, &got);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
    for (int i = 0; i < n_fds; i++)
        close(fds[i]);
    int32_t code = -1;
    if (rc == 0)
        memcpy(&code, resp, 4);
    free(resp);
    free(req.data);
    if (code != NVML_SUCCESS)
        debugf("%s answers no simulated machine (%d)", g_container ? PERSISTENCED_SOCKET : SOCK_NAME,
               rc == 0 ? code : -1);
    return code == NVML_SUCCESS ? 0 : -1;
}

static nvmlReturn_t forward_va(const char *name, const char *fmt, va_list ap)
{
    buf_t req = {0};
    out_t outs[MAX_OUTPUTS];
    int n_outs = 0;
    size_t name_len = strlen(name), fmt_len = strlen(fmt);
    put_u32(&req, PROTOCOL_MAGIC);
    put_u16(&req, (uint16_t)name_len);
    put(&req, name, name_len);
    put_u16(&req, (uint16_t)fmt_len);
    put(&req, fmt, fmt_len);
    for (const char *p = fmt; *p != '\0';) {
        char token = *p++;
        if (token == ' ')
            continue;
        size_t size = 0;
        while (*p >= '0' && *p <= '9')
            size = size * 10 + (size_t)(*p++ - '0');
        if (n_outs + 2 > MAX_OUTPUTS)
            goto bad_format;
        switch (token) {
        case 'h':
            put_u64(&req, (uint64_t)(uintptr_t)va_arg(ap, void *));
            break;
        case 'u':
            put_u32(&req, va_arg(ap, unsigned int));
            break;
        case 'i':
            put_u32(&req, (uint32_t)va_arg(ap, int));
            break;
        case 'U':
            put_u64(&req, (uint64_t)va_arg(ap, unsigned long long));
            break;
        case 's': {
            const char *s = va_arg(ap, const char *);
            put_u8(&req, s != NULL);
            if (s != NULL) {
                size_t n = strnlen(s, 4096);
                put_u32(&req, (uint32_t)n);
                put(&req, s, n);
            }
            break;
        }
        case 'B': {
            const void *b = va_arg(ap, const void *);
            put_u8(&req, b != NULL);
            if (b != NULL)
                put(&req, b, size);
            break;
        }
        case 'o': {
            void *o = va_arg(ap, void *);
            put_u8(&req, o != NULL);
            outs[n_outs++] = (out_t){OUT_PLAIN, o, size};
            break;
        }
        case 'v': {
            void *o = va_arg(ap, void *);
            uint32_t version = 0;
            if (o != NULL)
                memcpy(&version, o, 4);
            put_u8(&req, o != NULL);
            put_u32(&req, version);
            outs[n_outs++] = (out_t){OUT_VERSIONED, o, version & 0xffffffu};
            break;
        }
        case 'S': {
            char *s = va_arg(ap, char *);
            unsigned int length = va_arg(ap, unsigned int);
            put_u8(&req, s != NULL);
            put_u32(&req, length);
            outs[n_outs++] = (out_t){OUT_STRING, s, length};
            break;
        }
        case 'A': {
            void *array = va_arg(ap, void *);
            unsigned int *count = va_arg(ap, unsigned int *);
            unsigned int n = count != NULL ? *count : 0;
            put_u8(&req, array != NULL);
            put_u8(&req, count != NULL);
            put_u32(&req, n);
            outs[n_outs++] = (out_t){OUT_COUNT, count, sizeof *count};
            outs[n_outs++] = (out_t){OUT_ARRAY, array, array != NULL ? (size_t)n * size : 0};
            break;
        }
        default:
            goto bad_format;
        }
    }
    if (req.failed) {
        free(req.data);
        return NVML_ERROR_MEMORY;
    }
    nvmlReturn_t result = NVML_ERROR_UNKNOWN;
    for (int attempt = 0; attempt < 3; attempt++) {
        int pooled;
        int fd = get_connection(&pooled);
        if (fd == -2 && attempt < 2) { /* answered by nobody: a server at its limits, or leaving */
            usleep(20000);
            continue;
        }
        if (fd < 0) {
            result = NVML_ERROR_DRIVER_NOT_LOADED;
            break;
        }
        unsigned char *resp = NULL;
        uint32_t resp_len = 0;
        size_t got = 0;
        if (round_trip(fd, &req, NULL, 0, &resp, &resp_len, &got) != 0) {
            free(resp);
            close(fd);
            /* No answer at all: a pooled connection the server closed (it left, or was killed), or a new one a
             * dying server still accepted. Try again; a dead server's socket refuses, and the next one starts. */
            if (got == 0 && attempt < 2) {
                if (!pooled)
                    usleep(20000);
                continue;
            }
            debugf("%s: the connection to the server failed (%s, %zu bytes of the answer, %s connection)", name,
                   strerror(errno), got, pooled ? "pooled" : "new");
            result = NVML_ERROR_UNKNOWN;
            break;
        }
        result = apply(resp, resp_len, outs, n_outs);
        free(resp);
        pool_put(fd);
        break;
    }
    free(req.data);
    return result;

bad_format:
    free(req.data);
    debugf("%s: bad format \"%s\"", name, fmt);
    return NVML_ERROR_UNKNOWN;
}

nvmlReturn_t simnvml_forward(const char *name, const char *fmt, ...)
{
    if (__atomic_load_n(&g_refcount, __ATOMIC_ACQUIRE) == 0)
        return NVML_ERROR_UNINITIALIZED;
    va_list ap;
    va_start(ap, fmt);
    nvmlReturn_t rc = forward_va(name, fmt, ap);
    va_end(ap);
    return rc;
}

nvmlReturn_t simnvml_unsupported(const char *name)
{
    if (__atomic_load_n(&g_refcount, __ATOMIC_ACQUIRE) == 0)
        return NVML_ERROR_UNINITIALIZED;
    debugf("%s: not modelled (NVML_ERROR_NOT_SUPPORTED)", name);
    const char *log = getenv(STUB_LOG_ENV);
    if (log != NULL && *log != '\0') {
        char line[160];
        int n = snprintf(line, sizeof line, "%s\n", name);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            if (n > 0 && write(fd, line, (size_t)n) < 0)
                debugf("cannot write %s: %s", log, strerror(errno));
            close(fd);
        }
    }
    return NVML_ERROR_NOT_SUPPORTED;
}

static nvmlReturn_t forward_unchecked(const char *name, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    nvmlReturn_t rc = forward_va(name, fmt, ap);
    va_end(ap);
    return rc;
}

/* ----- initialisation and error strings (answered here) ------------------------------------------------------- */
static nvmlReturn_t init_with_flags(unsigned int flags)
{
    pthread_once(&g_once, once_init);
    pthread_mutex_lock(&g_init_lock);
    nvmlReturn_t rc = NVML_SUCCESS;
    if (g_refcount == 0) {
        if (g_state[0] == '\0' && !g_container && find_state() != 0) {
            rc = NVML_ERROR_DRIVER_NOT_LOADED;
        } else {
            if (g_container) {
                pool_drain(); /* connections of an earlier init carry the view of then */
                find_view();
            }
            rc = forward_unchecked("nvmlInitWithFlags", "u", flags);
        }
    }
    if (rc == NVML_SUCCESS)
        __atomic_add_fetch(&g_refcount, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&g_init_lock);
    return rc;
}

NVML_EXPORT nvmlReturn_t nvmlInit(void) { return init_with_flags(0); }
NVML_EXPORT nvmlReturn_t nvmlInit_v2(void) { return init_with_flags(0); }
NVML_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { return init_with_flags(flags); }

NVML_EXPORT nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&g_init_lock);
    nvmlReturn_t rc = NVML_SUCCESS;
    if (g_refcount == 0)
        rc = NVML_ERROR_UNINITIALIZED;
    else if (__atomic_sub_fetch(&g_refcount, 1, __ATOMIC_RELEASE) == 0)
        pool_drain();
    pthread_mutex_unlock(&g_init_lock);
    return rc;
}

NVML_EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INSUFFICIENT_POWER: return "Insufficient External Power";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_IRQ_ISSUE: return "Interrupt Request Issue";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_CORRUPTED_INFOROM: return "Corrupted infoROM";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires reset";
    case NVML_ERROR_OPERATING_SYSTEM: return "GPU access blocked by the operating system";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "Driver/library version mismatch";
    case NVML_ERROR_IN_USE: return "In use by another client";
    case NVML_ERROR_MEMORY: return "Insufficient Memory";
    case NVML_ERROR_NO_DATA: return "No data";
    case NVML_ERROR_VGPU_ECC_NOT_SUPPORTED: return "vGPU ECC not supported";
    case NVML_ERROR_INSUFFICIENT_RESOURCES: return "Insufficient Resources";
    case NVML_ERROR_FREQ_NOT_SUPPORTED: return "Frequency not supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    case NVML_ERROR_DEPRECATED: return "Deprecated";
    case NVML_ERROR_NOT_READY: return "Not ready";
    case NVML_ERROR_GPU_NOT_FOUND: return "GPU not found";
    case NVML_ERROR_INVALID_STATE: return "Invalid state";
    case NVML_ERROR_RESET_TYPE_NOT_SUPPORTED: return "Reset type not supported";
    default: return "Unknown Error";
    }
}
