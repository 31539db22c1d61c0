/* udp_peers: the UDP loads' clients and pod in C, so that the peers are not what is measured.
 *
 * The Python peers (bench/quic_load.py) spend more CPU per datagram than the middle box, on the
 * same 2 cores: the rate then says more about them than about the box. These do the same work
 * with the system calls of a QUIC stack that batches (quinn, quiche): reads are recvmmsg. What a
 * load's shape says about sends is kept: the relay's clients and the download's pod send one
 * datagram per call as aioquic does, or SEGMENTS per call as one UDP_SEGMENT (GSO) batch as
 * quinn does; the echo answers each batch it reads with one sendmmsg.
 * The traffic is QUIC-shaped as the router needs to confirm a flow (router/udp/handshake_watch.py):
 * the pod answers every long header it receives (a flow's Initial, sent by Python before these
 * run) with that datagram, as a server answers an Initial, and each client flow comes with its
 * connection ID (FD:HEX), the DCID of every short header the client sends on it.
 * Built by bench/udp_peers.py with the machine's C compiler; without one the bench uses the
 * Python peers and says so.
 *
 *     udp_peers pod FD ECHO       stdin: "stats" -> "DATAGRAMS BYTES SOURCES"; "forget" -> "ok";
 *                                 "blast SECONDS SIZE SEGMENTS" -> "SENT ELAPSED" (to every source in turn)
 *     udp_peers echo SECONDS SIZE WINDOW STALL_MS FD[:CID]...   -> "ECHOES REFILLS ELAPSED"
 *     udp_peers count SECONDS FD[:CID]...                       -> "RECEIVED"
 *     udp_peers blast SECONDS SIZE SEGMENTS FD[:CID]...         -> "SENT ELAPSED"
 *
 * CID: the flow's connection ID in hex (up to 20 octets, RFC 9000), the DCID at bytes 1.. of the
 * short headers sent on FD; none: random bytes there.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH        64
#define BUFFER       2048  /* the loads' datagrams are 1,200 bytes; longer ones are truncated */
#define SOURCES      16384 /* distinct source addresses remembered (open addressing, a power of two) */
#define MAX_FLOWS    1024
#define SOCKET_BYTES (4 << 20) /* bench/quic_load.py's SOCKET_BUFFER_BYTES */
#define CHECK_EVERY  256       /* datagrams sent between two looks at the clock */
#define MAX_SEGMENTS 64        /* the kernel's UDP_MAX_SEGMENTS */
#define MAX_CID      20        /* RFC 9000 section 17.2: a connection ID has at most 20 octets */
#define LONG_HEADER  0x80      /* the first bit of a long header (an Initial); clear in a short header */
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

static char buffers[BATCH][BUFFER];
static struct mmsghdr msgs[BATCH];
static struct iovec iov[BATCH];

static double
now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void
set_buffers(int fd)
{
    int bytes = SOCKET_BYTES;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
}

/* Read up to BATCH datagrams from fd without waiting (names into `names` when not NULL). */
static int
read_batch(int fd, struct sockaddr_in6 *names)
{
    for (int i = 0; i < BATCH; i++) {
        iov[i] = (struct iovec){ .iov_base = buffers[i], .iov_len = BUFFER };
        msgs[i].msg_hdr = (struct msghdr){ .msg_iov = &iov[i], .msg_iovlen = 1 };
        if (names) {
            msgs[i].msg_hdr.msg_name = &names[i];
            msgs[i].msg_hdr.msg_namelen = sizeof names[i];
        }
    }
    return recvmmsg(fd, msgs, BATCH, MSG_DONTWAIT, NULL);
}

/* A flow's connection ID: the DCID of the short headers its client sends. */
typedef struct {
    unsigned char bytes[MAX_CID];
    size_t len;
} Cid;

/* A short header of `size` bytes (fixed bit set) to `cid` (NULL: random bytes there), the rest
 * random, or NULL if too long. */
static char *
payload(size_t size, const Cid *cid)
{
    char *data = size <= BUFFER ? malloc(size) : NULL;
    if (!data)
        return NULL;
    for (size_t i = 0; i < size; i++)
        data[i] = (char)rand();
    data[0] = (char)(0x40 | (data[0] & 0x3f));
    if (cid && cid->len < size)
        memcpy(data + 1, cid->bytes, cid->len);
    return data;
}

/* One send of `segments` datagrams of `size` bytes (a GSO batch when more than one) to `to`
 * (NULL: the connected peer), blocking as the Python senders do; the datagrams it sent. */
typedef struct {
    char *data;
    size_t size;
    int segments;
    char control[CMSG_SPACE(sizeof(uint16_t))];
} Sender;

static int
sender_init(Sender *s, size_t size, int segments, const Cid *cid)
{
    char *one = payload(size, cid);
    if (!one || segments < 1 || segments > MAX_SEGMENTS)
        return -1;
    s->data = malloc(size * (size_t)segments);
    if (!s->data)
        return -1;
    for (int i = 0; i < segments; i++)
        memcpy(s->data + (size_t)i * size, one, size);
    free(one);
    s->size = size;
    s->segments = segments;
    memset(s->control, 0, sizeof s->control);
    struct msghdr m = { .msg_control = s->control, .msg_controllen = sizeof s->control };
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_UDP;
    c->cmsg_type = UDP_SEGMENT;
    c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
    uint16_t segment = (uint16_t)size;
    memcpy(CMSG_DATA(c), &segment, sizeof segment);
    return 0;
}

static int
sender_send(Sender *s, int fd, const struct sockaddr_in6 *to, socklen_t to_len)
{
    struct iovec v = { .iov_base = s->data, .iov_len = s->size * (size_t)s->segments };
    struct msghdr m = { .msg_name = (void *)to, .msg_namelen = to ? to_len : 0, .msg_iov = &v, .msg_iovlen = 1 };
    if (s->segments > 1) {
        m.msg_control = s->control;
        m.msg_controllen = sizeof s->control;
    }
    return sendmsg(fd, &m, 0) < 0 ? 0 : s->segments;
}

/* -- the pod ---------------------------------------------------------------------------- */
static struct sockaddr_in6 sources[SOURCES];
static socklen_t source_lengths[SOURCES];
static long source_count;

static void
remember(const struct sockaddr_in6 *a, socklen_t len)
{
    uint32_t h = 2166136261u;
    for (socklen_t i = 0; i < len; i++)
        h = (h ^ ((const unsigned char *)a)[i]) * 16777619u;
    for (unsigned i = 0; i < SOURCES; i++) {
        unsigned k = (h + i) & (SOURCES - 1);
        if (!source_lengths[k]) {
            source_lengths[k] = len;
            memcpy(&sources[k], a, len);
            source_count++;
            return;
        }
        if (source_lengths[k] == len && memcmp(&sources[k], a, len) == 0)
            return;
    }
}

/* Send `segments` datagrams of `size` bytes per call to every source in turn for `seconds`. */
static void
pod_blast(int fd, double seconds, size_t size, int segments)
{
    static int targets[SOURCES];
    Sender s;
    int n = 0;
    for (int k = 0; k < SOURCES; k++)
        if (source_lengths[k])
            targets[n++] = k;
    long sent = 0, calls = 0;
    double started = now_s(), deadline = started + seconds;
    int ok = sender_init(&s, size, segments, NULL) == 0; /* no middle box reads a pod's short header */
    while (ok && n && now_s() < deadline) {
        for (int c = 0; c < CHECK_EVERY; c += segments, calls++) {
            int k = targets[calls % n];
            sent += sender_send(&s, fd, &sources[k], source_lengths[k]);
        }
    }
    printf("%ld %.6f\n", sent, now_s() - started);
    if (ok)
        free(s.data);
}

static int
pod(int fd, int echo)
{
    struct sockaddr_in6 names[BATCH];
    long datagrams = 0, bytes = 0;
    set_buffers(fd);
    struct pollfd polls[2] = { { .fd = fd, .events = POLLIN }, { .fd = 0, .events = POLLIN } };
    char line[128];
    for (;;) {
        if (poll(polls, 2, -1) < 0 && errno != EINTR)
            return 1;
        if (polls[1].revents) {
            double seconds;
            size_t size;
            int segments;
            if (!fgets(line, sizeof line, stdin))
                return 0; /* the agent went away */
            if (strncmp(line, "stats", 5) == 0)
                printf("%ld %ld %ld\n", datagrams, bytes, source_count);
            else if (strncmp(line, "forget", 6) == 0) {
                memset(source_lengths, 0, sizeof source_lengths);
                source_count = 0;
                printf("ok\n");
            } else if (sscanf(line, "blast %lf %zu %d", &seconds, &size, &segments) == 3)
                pod_blast(fd, seconds, size, segments);
            else
                printf("?\n");
            fflush(stdout);
        }
        if (!polls[0].revents)
            continue;
        int n;
        do {
            n = read_batch(fd, names);
            int answers = 0;
            for (int i = 0; i < n; i++) {
                datagrams++;
                bytes += msgs[i].msg_len;
                remember(&names[i], msgs[i].msg_hdr.msg_namelen);
                iov[i].iov_len = msgs[i].msg_len;
                if (!echo && msgs[i].msg_len && (buffers[i][0] & LONG_HEADER))
                    msgs[answers++] = msgs[i]; /* an Initial: answered with itself (its iov stays put) */
            }
            int out = echo ? n : answers;
            for (int sent = 0; sent < out;) { /* a full send buffer loses the rest, as UDP loses */
                int k = sendmmsg(fd, msgs + sent, (unsigned)(out - sent), MSG_DONTWAIT);
                sent += k > 0 ? k : 1;
            }
        } while (n == BATCH);
    }
}

/* -- the clients ------------------------------------------------------------------------ */
static void
send_copies(int fd, char *data, size_t size, int count)
{
    struct mmsghdr out[BATCH];
    struct iovec one = { .iov_base = data, .iov_len = size };
    while (count > 0) {
        int n = count < BATCH ? count : BATCH;
        for (int i = 0; i < n; i++)
            out[i].msg_hdr = (struct msghdr){ .msg_iov = &one, .msg_iovlen = 1 };
        int k = sendmmsg(fd, out, (unsigned)n, MSG_DONTWAIT);
        count -= k > 0 ? k : n; /* ENOBUFS / ECONNREFUSED: counted as lost */
    }
}

/* An epoll set of the flows' sockets (data: the flow's index), each with a big receive buffer
 * and emptied of what came before (echoed Initials). */
static int
flow_set(int *fds, int flows)
{
    int ep = epoll_create1(0);
    for (int i = 0; i < flows; i++) {
        set_buffers(fds[i]);
        while (read_batch(fds[i], NULL) > 0) {
        }
        struct epoll_event e = { .events = EPOLLIN, .data.u32 = (uint32_t)i };
        epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &e);
    }
    return ep;
}

static int
echo(double seconds, size_t size, int window, double stall_s, int *fds, const Cid *cids, int flows)
{
    static double progress[MAX_FLOWS];
    static char *data[MAX_FLOWS]; /* each flow's short header, to its connection ID */
    for (int i = 0; i < flows; i++)
        if (!(data[i] = payload(size, &cids[i])))
            return 1;
    int ep = flow_set(fds, flows);
    long received = 0, refills = 0;
    double started = now_s(), deadline = started + seconds, now;
    for (int i = 0; i < flows; i++) {
        send_copies(fds[i], data[i], size, window);
        progress[i] = started;
    }
    struct epoll_event events[BATCH];
    while ((now = now_s()) < deadline) {
        double wait = deadline - now < stall_s ? deadline - now : stall_s;
        int ready = epoll_wait(ep, events, BATCH, (int)(wait * 1000) + 1);
        for (int e = 0; e < ready; e++) {
            int i = (int)events[e].data.u32, got = 0, n;
            do {
                n = read_batch(fds[i], NULL);
                if (n > 0) {
                    got += n;
                    send_copies(fds[i], data[i], size, n);
                }
            } while (n == BATCH);
            received += got;
            if (got)
                progress[i] = now_s();
        }
        now = now_s();
        for (int i = 0; i < flows; i++) {
            if (now - progress[i] > stall_s) {
                refills++;
                send_copies(fds[i], data[i], size, window);
                progress[i] = now;
            }
        }
    }
    printf("%ld %ld %.6f\n", received, refills, now_s() - started);
    return 0;
}

static int
count(double seconds, int *fds, int flows)
{
    int ep = flow_set(fds, flows);
    long received = 0;
    double deadline = now_s() + seconds, now;
    struct epoll_event events[BATCH];
    while ((now = now_s()) < deadline) {
        int ready = epoll_wait(ep, events, BATCH, (int)((deadline - now) * 1000) + 1);
        for (int e = 0; e < ready; e++) {
            int n;
            do {
                n = read_batch(fds[events[e].data.u32], NULL);
                received += n > 0 ? n : 0;
            } while (n == BATCH);
        }
    }
    printf("%ld\n", received);
    return 0;
}

static int
blast(double seconds, size_t size, int segments, int *fds, const Cid *cids, int flows)
{
    static Sender s[MAX_FLOWS]; /* each flow's batch of short headers, to its connection ID */
    for (int i = 0; i < flows; i++)
        if (sender_init(&s[i], size, segments, &cids[i]) != 0)
            return 1;
    long sent = 0, calls = 0;
    double started = now_s(), deadline = started + seconds;
    while (now_s() < deadline) {
        for (int c = 0; c < CHECK_EVERY; c += segments, calls++) {
            int i = (int)(calls % flows);
            sent += sender_send(&s[i], fds[i], NULL, 0);
        }
    }
    printf("%ld %.6f\n", sent, now_s() - started);
    return 0;
}

/* "FD" or "FD:HEX" into `fd` and `cid`; 0 when malformed. */
static int
parse_flow(const char *arg, int *fd, Cid *cid)
{
    char *end;
    long value = strtol(arg, &end, 10);
    if (end == arg || value < 0)
        return 0;
    *fd = (int)value;
    cid->len = 0;
    if (*end == '\0')
        return 1;
    if (*end != ':')
        return 0;
    const char *hex = end + 1;
    size_t digits = strlen(hex);
    if (digits % 2 || digits / 2 > MAX_CID)
        return 0;
    for (size_t i = 0; i < digits / 2; i++) {
        unsigned octet;
        if (sscanf(hex + 2 * i, "%2x", &octet) != 1)
            return 0;
        cid->bytes[i] = (unsigned char)octet;
    }
    cid->len = digits / 2;
    return 1;
}

int
main(int argc, char **argv)
{
    static Cid cids[MAX_FLOWS];
    int fds[MAX_FLOWS], first = 0;
    const char *mode = argc > 1 ? argv[1] : "";
    if (strcmp(mode, "pod") == 0 && argc == 4)
        return pod(atoi(argv[2]), atoi(argv[3]));
    if (strcmp(mode, "echo") == 0)
        first = 6;
    else if (strcmp(mode, "count") == 0)
        first = 3;
    else if (strcmp(mode, "blast") == 0)
        first = 5;
    if (first && argc > first && argc - first <= MAX_FLOWS) {
        int flows = argc - first, ok = 1;
        for (int i = 0; i < flows; i++)
            ok &= parse_flow(argv[first + i], &fds[i], &cids[i]);
        if (!ok) {
            fprintf(stderr, "udp_peers: a flow is FD or FD:HEX (a connection ID of up to %d octets)\n", MAX_CID);
            return 2;
        }
        if (mode[0] == 'e')
            return echo(atof(argv[2]), (size_t)atol(argv[3]), atoi(argv[4]), atof(argv[5]) / 1000.0, fds, cids, flows);
        if (mode[0] == 'c')
            return count(atof(argv[2]), fds, flows);
        return blast(atof(argv[2]), (size_t)atol(argv[3]), atoi(argv[4]), fds, cids, flows);
    }
    fprintf(stderr, "usage: udp_peers pod FD ECHO | echo SECONDS SIZE WINDOW STALL_MS FD[:CID]... | "
                    "count SECONDS FD[:CID]... | blast SECONDS SIZE SEGMENTS FD[:CID]...\n");
    return 2;
}
