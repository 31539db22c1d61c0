/* udp_floor: the least a UDP middle box can do per datagram with the router's system calls.
 *
 * A measuring stick, not a router (bench/udp_floor/README.md): it relays
 * every client address to one pod over its own connected socket, the way the C splice does
 * (router/udp/_splice.c: recvmmsg batches of 64 on the public socket, one sendmmsg per flow per
 * batch as UDP_SEGMENT runs; an epoll set of pod sockets, each read with recvmmsg and sent back
 * through the public socket in one sendmmsg as GSO runs), with nothing else: no QUIC parsing,
 * no routing, no Python, no counters. Never built or run by CI. With a fourth argument,
 * `io_uring`, a batch's sends to many pod sockets go in one io_uring_enter through the router's
 * own ring (router/udp/_send_ring.h), as the splice does where the kernel allows it.
 *
 *     cc -O2 -o /tmp/udp_floor bench/udp_floor/udp_floor.c
 *     /tmp/udp_floor LISTEN_PORT POD_IPV4 POD_PORT [io_uring]
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../router/udp/_send_ring.h"

#define BATCH        64
#define BUFFER       65536
#define MAX_FLOWS    4096        /* open addressing, a power of two */
#define SOCKET_BYTES (4 << 20)   /* the router's QUIC_SOCKET_BUFFER_BYTES */
#define POD_BYTES    (256 << 10) /* the router's QUIC_POD_RECEIVE_BUFFER_BYTES */
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef SOL_UDP
#define SOL_UDP 17
#endif

typedef struct {
    struct sockaddr_in client;
    int fd; /* 0: empty */
} Flow;

static Flow flows[MAX_FLOWS];
static Flow *by_fd[65536];
static int listener, epoll_fd;
static struct sockaddr_in pod;
static char in_buffers[BATCH][BUFFER], out_buffers[BATCH][BUFFER];
static SendRing ring = { .fd = -1 };
static struct mmsghdr ring_msgs[BATCH];
static char ring_cmsgs[BATCH][CMSG_SPACE(sizeof(uint16_t))];

static Flow *
flow_for(const struct sockaddr_in *client)
{
    unsigned h = (ntohl(client->sin_addr.s_addr) * 2654435761u) ^ ntohs(client->sin_port);
    for (unsigned i = 0; i < MAX_FLOWS; i++) {
        Flow *f = &flows[(h + i) & (MAX_FLOWS - 1)];
        if (f->fd && f->client.sin_port == client->sin_port && f->client.sin_addr.s_addr == client->sin_addr.s_addr)
            return f;
        if (!f->fd) {
            int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
            int bytes = POD_BYTES;
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
            if (fd < 0 || fd >= 65536 || connect(fd, (struct sockaddr *)&pod, sizeof pod) < 0)
                exit(1);
            struct epoll_event event = { .events = EPOLLIN, .data.fd = fd };
            epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &event);
            f->client = *client;
            f->fd = fd;
            by_fd[fd] = f;
            return f;
        }
    }
    return NULL;
}

/* Send iov[0..n) through fd, consecutive equal-size datagrams to one place as one GSO message. */
static void
send_runs(int fd, struct iovec *iov, struct sockaddr_in **to, int n)
{
    struct mmsghdr msgs[BATCH];
    char cmsgs[BATCH][CMSG_SPACE(sizeof(uint16_t))];
    int m = 0;
    for (int i = 0; i < n;) {
        int j = i + 1;
        size_t total = iov[i].iov_len;
        while (j < n && j - i < 64 && to[j] == to[i] && iov[j].iov_len <= iov[i].iov_len &&
               total + iov[j].iov_len <= 65507) {
            total += iov[j].iov_len;
            if (iov[j++].iov_len < iov[i].iov_len)
                break;
        }
        memset(&msgs[m], 0, sizeof msgs[m]);
        msgs[m].msg_hdr.msg_name = to[i];
        msgs[m].msg_hdr.msg_namelen = to[i] ? sizeof(struct sockaddr_in) : 0;
        msgs[m].msg_hdr.msg_iov = &iov[i];
        msgs[m].msg_hdr.msg_iovlen = (size_t)(j - i);
        if (j - i > 1) {
            msgs[m].msg_hdr.msg_control = cmsgs[m];
            msgs[m].msg_hdr.msg_controllen = sizeof cmsgs[m];
            struct cmsghdr *c = CMSG_FIRSTHDR(&msgs[m].msg_hdr);
            c->cmsg_level = SOL_UDP;
            c->cmsg_type = UDP_SEGMENT;
            c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            uint16_t segment = (uint16_t)iov[i].iov_len;
            memcpy(CMSG_DATA(c), &segment, sizeof segment);
        }
        m++;
        i = j;
    }
    for (int sent = 0; sent < m;) {
        int k = sendmmsg(fd, msgs + sent, (unsigned)(m - sent), MSG_DONTWAIT);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == ENOBUFS)
                return;
            sent++; /* drop that message, as UDP drops */
            continue;
        }
        sent += k;
    }
}

/* Queue iov[0..n) for fd on the ring, runs as GSO messages (no failure handling: a measuring stick). */
static void
queue_runs(int fd, struct iovec *iov, int n, unsigned *queued)
{
    for (int i = 0; i < n;) {
        int j = i + 1;
        size_t total = iov[i].iov_len;
        while (j < n && j - i < 64 && iov[j].iov_len <= iov[i].iov_len && total + iov[j].iov_len <= 65507) {
            total += iov[j].iov_len;
            if (iov[j++].iov_len < iov[i].iov_len)
                break;
        }
        struct msghdr *m = &ring_msgs[*queued].msg_hdr;
        memset(m, 0, sizeof *m);
        m->msg_iov = &iov[i];
        m->msg_iovlen = (size_t)(j - i);
        if (j - i > 1) {
            m->msg_control = ring_cmsgs[*queued];
            m->msg_controllen = sizeof ring_cmsgs[*queued];
            struct cmsghdr *c = CMSG_FIRSTHDR(m);
            c->cmsg_level = SOL_UDP;
            c->cmsg_type = UDP_SEGMENT;
            c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            uint16_t segment = (uint16_t)iov[i].iov_len;
            memcpy(CMSG_DATA(c), &segment, sizeof segment);
        }
        send_ring_queue(&ring, fd, m, *queued, j < n);
        (*queued)++;
        i = j;
    }
}

static void
from_clients(void)
{
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH], out[BATCH];
    struct sockaddr_in names[BATCH];
    struct sockaddr_in *to[BATCH];
    for (int round = 0; round < 4; round++) {
        memset(msgs, 0, sizeof msgs);
        for (int i = 0; i < BATCH; i++) {
            iov[i].iov_base = in_buffers[i];
            iov[i].iov_len = BUFFER;
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_name = &names[i];
            msgs[i].msg_hdr.msg_namelen = sizeof names[i];
        }
        int n = recvmmsg(listener, msgs, BATCH, MSG_DONTWAIT, NULL);
        if (n <= 0)
            return;
        Flow *of[BATCH];
        for (int i = 0; i < n; i++)
            of[i] = flow_for(&names[i]);
        int done[BATCH] = { 0 }, used = 0, results[BATCH];
        unsigned queued = 0;
        for (int i = 0; i < n; i++) { /* per flow, in order: one sendmmsg each, or all on the ring */
            if (done[i] || !of[i])
                continue;
            int count = 0;
            for (int j = i; j < n; j++) {
                if (of[j] != of[i])
                    continue;
                done[j] = 1;
                out[used + count].iov_base = in_buffers[j];
                out[used + count].iov_len = msgs[j].msg_len;
                to[count++] = NULL;
            }
            if (ring.fd >= 0)
                queue_runs(of[i]->fd, out + used, count, &queued);
            else
                send_runs(of[i]->fd, out + used, to, count);
            used += count;
        }
        if (queued)
            send_ring_run(&ring, results);
        if (n < BATCH)
            return;
    }
}

static void
from_pods(void)
{
    struct epoll_event events[BATCH];
    int ready = epoll_wait(epoll_fd, events, BATCH, 0);
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH], out[BATCH];
    struct sockaddr_in *to[BATCH];
    int used = 0;
    for (int e = 0; e < ready; e++) {
        Flow *f = by_fd[events[e].data.fd];
        for (;;) {
            if (used == BATCH) {
                send_runs(listener, out, to, used);
                used = 0;
            }
            int want = BATCH - used;
            memset(msgs + used, 0, (size_t)want * sizeof msgs[0]);
            for (int i = used; i < BATCH; i++) {
                iov[i].iov_base = out_buffers[i];
                iov[i].iov_len = BUFFER;
                msgs[i].msg_hdr.msg_iov = &iov[i];
                msgs[i].msg_hdr.msg_iovlen = 1;
            }
            int n = recvmmsg(f->fd, msgs + used, (unsigned)want, MSG_DONTWAIT, NULL);
            if (n <= 0)
                break;
            for (int i = used; i < used + n; i++) {
                out[i].iov_base = out_buffers[i];
                out[i].iov_len = msgs[i].msg_len;
                to[i] = &f->client;
            }
            used += n;
            if (n < want)
                break;
        }
    }
    if (used)
        send_runs(listener, out, to, used);
}

int
main(int argc, char **argv)
{
    if (argc != 4 && !(argc == 5 && strcmp(argv[4], "io_uring") == 0)) {
        fprintf(stderr, "usage: udp_floor LISTEN_PORT POD_IPV4 POD_PORT [io_uring]\n");
        return 2;
    }
    if (argc == 5 && send_ring_open(&ring) < 0) {
        perror("io_uring");
        return 1;
    }
    pod.sin_family = AF_INET;
    pod.sin_port = htons((uint16_t)atoi(argv[3]));
    if (inet_pton(AF_INET, argv[2], &pod.sin_addr) != 1)
        return 2;
    listener = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
    int bytes = SOCKET_BYTES;
    setsockopt(listener, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
    setsockopt(listener, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
    struct sockaddr_in at = { .sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])) };
    inet_pton(AF_INET, "127.0.0.1", &at.sin_addr);
    if (bind(listener, (struct sockaddr *)&at, sizeof at) < 0) {
        perror("bind");
        return 1;
    }
    epoll_fd = epoll_create1(0);
    int outer = epoll_create1(0); /* the listener and the pods' epoll set, as the router's loop sees them */
    struct epoll_event event = { .events = EPOLLIN, .data.fd = listener };
    epoll_ctl(outer, EPOLL_CTL_ADD, listener, &event);
    event.data.fd = epoll_fd;
    epoll_ctl(outer, EPOLL_CTL_ADD, epoll_fd, &event);
    fprintf(stderr, "udp_floor listening on 127.0.0.1:%s\n", argv[1]);
    for (;;) {
        struct epoll_event got[2];
        int n = epoll_wait(outer, got, 2, -1);
        for (int i = 0; i < n; i++) {
            if (got[i].data.fd == listener)
                from_clients();
            else
                from_pods();
        }
    }
}
