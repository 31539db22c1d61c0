/* router/udp/_send_ring.h: many sockets' sends in one system call, for the C splice (_splice.c).
 *
 * sendmmsg takes one socket. A batch of client datagrams spread over many flows goes to many
 * connected pod sockets, so the splice made one sendmmsg per flow per batch: with 100 flows,
 * about one system call per datagram. An io_uring submission queue takes a whole batch's
 * messages, to any sockets, in one io_uring_enter; each is a sendmsg with MSG_DONTWAIT, which
 * the kernel runs at once, in order (a full socket buffer completes with -EAGAIN instead of
 * waiting: REQ_F_NOWAIT), so nothing is left in flight when the call returns.
 *
 * Optional at run time: a kernel without io_uring (or without IORING_OP_SENDMSG), a seccomp
 * profile that refuses it (containerd 2's and Docker 25's defaults do), sysctl
 * kernel.io_uring_disabled, or a caller that turns it off: send_ring_open fails and the splice
 * keeps its sendmmsg per flow. Raw system calls and <linux/io_uring.h>; no liburing.
 *
 * What it owns: the ring's fd and its three mappings (closed by send_ring_close); no Python object.
 * What it must never do: block beyond the sends it submitted (each MSG_DONTWAIT), submit from a
 * forked child (the generation check), queue more than RING_ENTRIES entries (the caller's BATCH
 * is below it), or report an entry the kernel took as never submitted: an entry whose completion
 * was not seen is RING_UNSEEN, so the caller never sends a datagram twice.
 */
#ifndef STARGATE_SEND_RING_H
#define STARGATE_SEND_RING_H

#include <errno.h>
#include <pthread.h>
#include <linux/io_uring.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#define RING_ENTRIES       128         /* submission slots: one batch's messages (at most BATCH) and room */
#define RING_NOT_SUBMITTED (-1 - 4095) /* a result no errno has: the kernel never took this entry */
#define RING_UNSEEN        (-2 - 4095) /* nor this: the kernel took it, its completion was not seen */

/* io_uring_enter(2), through a macro so that tests/support/send_ring_faults.c can make it fail the
 * way a kernel may (nothing else defines it). */
#ifndef SEND_RING_ENTER
#define SEND_RING_ENTER(fd, submit, wait, flags) syscall(__NR_io_uring_enter, fd, submit, wait, flags, NULL, 0)
#endif

#ifndef IORING_SETUP_SUBMIT_ALL
#define IORING_SETUP_SUBMIT_ALL (1U << 7) /* 5.18: a failing entry does not stop the rest */
#endif
#ifndef IORING_SETUP_COOP_TASKRUN
#define IORING_SETUP_COOP_TASKRUN (1U << 8) /* 5.19: no interrupt to run completion work */
#endif
#ifndef IORING_SETUP_SINGLE_ISSUER
#define IORING_SETUP_SINGLE_ISSUER (1U << 12) /* 6.0: only the opening thread submits */
#endif
#ifndef IORING_SETUP_DEFER_TASKRUN
#define IORING_SETUP_DEFER_TASKRUN (1U << 13) /* 6.1: completion work runs inside io_uring_enter */
#endif

/* Forks seen by this process's children (pthread_atfork, registered by send_ring_register_fork):
 * a ring belongs to the process that opened it; a child that inherited it must not submit to it. */
static unsigned send_ring_forks;
static void
send_ring_after_fork_in_child(void)
{
    send_ring_forks++;
}
static inline int
send_ring_register_fork(void)
{
    return pthread_atfork(NULL, NULL, send_ring_after_fork_in_child);
}

typedef struct {
    int fd;              /* -1: no ring */
    unsigned generation; /* send_ring_forks when it was opened: a forked child must not use it */
    unsigned char *sq_ring, *cq_ring;
    size_t sq_ring_len, cq_ring_len;
    struct io_uring_sqe *sqes;
    size_t sqes_len;
    unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
    struct io_uring_cqe *cqes;
    unsigned queued; /* entries written since the last run */
} SendRing;

static void
send_ring_close(SendRing *r)
{
    if (r->sqes)
        munmap(r->sqes, r->sqes_len);
    if (r->cq_ring && r->cq_ring != r->sq_ring)
        munmap(r->cq_ring, r->cq_ring_len);
    if (r->sq_ring)
        munmap(r->sq_ring, r->sq_ring_len);
    if (r->fd >= 0)
        close(r->fd);
    memset(r, 0, sizeof *r);
    r->fd = -1;
}

/* Whether an entry's result says its message was never sent, so sending it now sends it once: the
 * kernel did not take it, a failure earlier in its link cancelled it, or it was interrupted. */
static inline int
send_ring_untried(int result)
{
    return result == RING_NOT_SUBMITTED || result == -ECANCELED || result == -EINTR;
}

/* Whether the kernel's ring runs IORING_OP_SENDMSG (5.3+): an unknown opcode would complete with
 * -EINVAL, which the splice would take for a pod refusing GSO. */
static int
send_ring_probe(int fd)
{
    size_t size = sizeof(struct io_uring_probe) + 256 * sizeof(struct io_uring_probe_op);
    struct io_uring_probe *probe = calloc(1, size);
    if (!probe)
        return 0;
    int ok = syscall(__NR_io_uring_register, fd, IORING_REGISTER_PROBE, probe, 256) == 0 &&
             probe->last_op >= IORING_OP_SENDMSG && (probe->ops[IORING_OP_SENDMSG].flags & IO_URING_OP_SUPPORTED);
    free(probe);
    return ok;
}

/* Open a ring; 0, or -1 with errno (ENOSYS, EPERM under seccomp, ...) and r closed. */
static int
send_ring_open(SendRing *r)
{
    static const unsigned flag_sets[] = {
        /* the cheapest this kernel takes */
        IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
        IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN,
        0,
    };
    struct io_uring_params p;
    memset(r, 0, sizeof *r);
    r->fd = -1;
    for (size_t i = 0; i < sizeof flag_sets / sizeof flag_sets[0] && r->fd < 0; i++) {
        memset(&p, 0, sizeof p);
        p.flags = flag_sets[i];
        r->fd = (int)syscall(__NR_io_uring_setup, RING_ENTRIES, &p);
        if (r->fd < 0 && errno != EINVAL)
            return -1;
    }
    if (r->fd < 0)
        return -1;
    if (!send_ring_probe(r->fd)) {
        send_ring_close(r);
        errno = EOPNOTSUPP;
        return -1;
    }
    r->generation = send_ring_forks;
    r->sq_ring_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    r->cq_ring_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    int single = (p.features & IORING_FEAT_SINGLE_MMAP) != 0;
    if (single && r->cq_ring_len > r->sq_ring_len)
        r->sq_ring_len = r->cq_ring_len;
    r->sq_ring =
        mmap(NULL, r->sq_ring_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQ_RING);
    if (r->sq_ring == MAP_FAILED)
        r->sq_ring = NULL;
    r->cq_ring = single ? r->sq_ring
                        : mmap(NULL, r->cq_ring_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd,
                               IORING_OFF_CQ_RING);
    if (r->cq_ring == MAP_FAILED)
        r->cq_ring = NULL;
    r->sqes_len = p.sq_entries * sizeof(struct io_uring_sqe);
    r->sqes = mmap(NULL, r->sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, r->fd, IORING_OFF_SQES);
    if (r->sqes == MAP_FAILED)
        r->sqes = NULL;
    if (!r->sq_ring || !r->cq_ring || !r->sqes) {
        int error = errno;
        send_ring_close(r);
        errno = error;
        return -1;
    }
    r->sq_tail = (unsigned *)(r->sq_ring + p.sq_off.tail);
    r->sq_mask = (unsigned *)(r->sq_ring + p.sq_off.ring_mask);
    r->sq_array = (unsigned *)(r->sq_ring + p.sq_off.array);
    r->cq_head = (unsigned *)(r->cq_ring + p.cq_off.head);
    r->cq_tail = (unsigned *)(r->cq_ring + p.cq_off.tail);
    r->cq_mask = (unsigned *)(r->cq_ring + p.cq_off.ring_mask);
    r->cqes = (struct io_uring_cqe *)(r->cq_ring + p.cq_off.cqes);
    return 0;
}

/* Whether this process may use the ring now (it is open, and not a forked parent's). */
static inline int
send_ring_usable(const SendRing *r)
{
    return r->fd >= 0 && r->generation == send_ring_forks;
}

/* Queue sendmsg(fd, msg, MSG_DONTWAIT) as entry number `index` (< RING_ENTRIES); `linked`: the
 * next queued entry runs only if this one succeeds (the rest of a chain completes -ECANCELED),
 * so one flow's messages never overtake each other when one fails. */
static void
send_ring_queue(SendRing *r, int fd, struct msghdr *msg, unsigned index, int linked)
{
    unsigned slot = (*r->sq_tail + r->queued) & *r->sq_mask;
    struct io_uring_sqe *sqe = &r->sqes[slot];
    memset(sqe, 0, sizeof *sqe);
    sqe->opcode = IORING_OP_SENDMSG;
    sqe->fd = fd;
    sqe->addr = (uint64_t)(uintptr_t)msg;
    sqe->len = 1;
    sqe->msg_flags = MSG_DONTWAIT;
    sqe->flags = linked ? IOSQE_IO_LINK : 0;
    sqe->user_data = index;
    r->sq_array[slot] = slot;
    r->queued++;
}

/* Submit what is queued and wait for all of it: results[i] is entry i's result (bytes sent, or
 * -errno), RING_NOT_SUBMITTED for one the kernel did not take, RING_UNSEEN for one it took whose
 * completion the wait failed to bring (it may have been sent: never send it again). Returns 0, or
 * -1 if the ring is no longer fit to use (the caller closes it and sends the untaken entries
 * itself). */
static int
send_ring_run(SendRing *r, int *results)
{
    unsigned n = r->queued;
    for (unsigned i = 0; i < n; i++)
        results[i] = RING_NOT_SUBMITTED;
    if (!n)
        return 0;
    __atomic_store_n(r->sq_tail, *r->sq_tail + n, __ATOMIC_RELEASE);
    r->queued = 0;
    long submitted;
    do
        submitted = SEND_RING_ENTER(r->fd, n, n, IORING_ENTER_GETEVENTS);
    while (submitted < 0 && errno == EINTR);
    if (submitted < 0)
        return -1; /* nothing was taken; the entries stay queued: the ring is done */
    for (unsigned i = 0; i < (unsigned)submitted && i < n; i++)
        results[i] = RING_UNSEEN; /* the kernel takes entries in order: these ran, or will */
    unsigned reaped = 0;
    while (reaped < (unsigned)submitted) {
        unsigned head = *r->cq_head, tail = __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE);
        for (; head != tail; head++, reaped++) {
            struct io_uring_cqe *cqe = &r->cqes[head & *r->cq_mask];
            if (cqe->user_data < n)
                results[cqe->user_data] = cqe->res;
        }
        __atomic_store_n(r->cq_head, head, __ATOMIC_RELEASE);
        if (reaped < (unsigned)submitted &&
            SEND_RING_ENTER(r->fd, 0, (unsigned)submitted - reaped, IORING_ENTER_GETEVENTS) < 0 && errno != EINTR)
            return -1; /* a taken entry not reaped stays RING_UNSEEN: not sent twice */
    }
    return submitted == n ? 0 : -1;
}

#endif
