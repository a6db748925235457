/* Preloaded into ViZDoom's engines (env.engine_wait: yield): an engine waiting for a peer's packet
 * gives its core away instead of spinning on it.
 *
 * ZDoom's netcode waits for its peers' tics by calling recvfrom() on a non-blocking UDP socket in a
 * tight loop. With 8 engines, their player processes and the learner on 2 cores, those loops took
 * about a third of the machine's CPU (most of it in the kernel), time the peer being waited for
 * needed. After SPINS misses in a row, each closer than TIGHT_NS to the last, every further miss
 * calls sched_yield(): the core goes to whatever else is runnable, and the loop, and so the engine's
 * latency, is unchanged on an idle core. Sleeping instead (poll() on the socket) was measured much
 * slower: the same loop also waits on the engine's own controller, whose messages wake no socket.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <sys/socket.h>
#include <time.h>

#define SPINS 20           /* misses before yielding: a peer that answers within them costs no switch */
#define TIGHT_NS 50000LL   /* misses further apart than this are no waiting loop */

typedef ssize_t (*recvfrom_fn)(int, void *, size_t, int, struct sockaddr *, socklen_t *);

static recvfrom_fn real_recvfrom;
static __thread long long last_miss_ns;
static __thread int misses;

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000LL + t.tv_nsec;
}

ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *addr, socklen_t *addrlen) {
    if (!real_recvfrom)
        real_recvfrom = (recvfrom_fn)dlsym(RTLD_NEXT, "recvfrom");
    ssize_t n = real_recvfrom(fd, buf, len, flags, addr, addrlen);
    if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
        misses = 0;
        return n;
    }
    int saved = errno;
    long long now = now_ns();
    misses = now - last_miss_ns < TIGHT_NS ? misses + 1 : 0;
    last_miss_ns = now;
    if (misses >= SPINS) {
        sched_yield();
        last_miss_ns = now_ns();
    }
    errno = saved;
    return n;
}
