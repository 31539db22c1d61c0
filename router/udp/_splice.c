/* router.udp._splice: the established QUIC flows' datagrams, both ways, batched across flows.
 *
 * What it owns: the epoll set of the attached pod sockets, the datagram buffers, the io_uring
 * send ring (_send_ring.h), and a strong reference to each attached flow object with its client
 * address, until detach or close. The pod sockets and the public socket stay Python's: never
 * closed here. The attributes written on the flow objects are named once, in attribute_table
 * (exported as ATTRIBUTES, checked against router/udp/flows.py's Flow by
 * tests/process/test_c_attributes.py). Flows point back at the splice through their links, so the splice
 * has GC support: a splice dropped without close() is collected with its flows.
 * What it must never do: block (every socket call is MSG_DONTWAIT, epoll_wait does not wait), keep
 * a borrowed reference past a call that may run Python code (a call that does is made while the
 * splice is busy, so nothing re-entered can free what it walks), send one client address's
 * datagrams to a pod its connection IDs do not name, trust a caller's fds, sizes or addresses (every entry point
 * checks its own arguments: a pod fd must be an open UDP socket, a size must fit the arrays it sizes), or let a
 * Python callback that raises for one item cost the call's other items (deliver).
 *
 * Optional: built at install when a C compiler is there; without it the router runs the same
 * flows through its pure-Python path (router/udp/pod_link.py, pod_to_client.py), which the test
 * suite runs too. The policy stays in Python. This module only moves bytes for flows Python
 * has attached, and hands Python everything else, in arrival order:
 *
 *   client -> pod: recvmmsg on the public socket (UDP_GRO on: a client's GSO batch is one read,
 *     cut here at its segment size, each datagram judged on its own); a short-header datagram
 *     from an attached client address, or a long header whose DCID is the pod CID the flow last
 *     learned, is sent to its flow's connected pod socket (in order, runs as GSO messages: one
 *     io_uring_enter for all the batch's flows where the kernel allows io_uring, _send_ring.h;
 *     otherwise one sendmmsg per flow per batch); any other datagram (a new address, another
 *     long header, an empty one) is returned as (bytes, address) for the Python edge, and so are
 *     the later datagrams of that flow in the same call, so a flow's datagrams never overtake
 *     each other. Several flows may share a client address (one client socket, several QUIC
 *     connections: router/udp/flow_table.py): an address with one flow costs one lookup, as
 *     ever; once two flows have met at an address (attach, rekey) they are shared, and each of
 *     their datagrams goes to the flow whose last learned pod CID it carries as its DCID (a
 *     short list, walked only then); one that names none goes to Python, with the rest of that
 *     address's datagrams of the call. A flow QUIC-LB joined is told apart so from the start
 *     (learn: the pod CID it came with), alone at its address or not.
 *   pod -> client: an epoll set holds the attached pod sockets; each readable one is read with
 *     recvmmsg and its datagrams leave the public socket to the flow's client address in one
 *     sendmmsg across flows. A pod socket with UDP_GRO on may hand over a pod's GSO batch (or
 *     what the NIC's GRO glued) as one read: it is cut at the UDP_GRO segment size and leaves as
 *     one GSO message, the same datagrams in the same order. A long header with a new v1/v2
 *     SCID for its flow is sent and its SCID returned (flow, scid): Python learns the pod's
 *     connection IDs from them.
 *
 * A flow attached unconfirmed (router/udp/handshake_watch.py: a forged Initial or a junk join may have
 * opened it) is watched by Python until confirm(): its client's short headers go to Python, and its
 * pod's datagrams are handed over (flow, datagram) instead of sent, so Python sees the handshake both
 * ways; its long headers to the learned CID (the handshake itself) are spliced as any flow's.
 *
 * A pod socket error (ECONNREFUSED after an ICMP) is queued as (flow, errno) for Python to end
 * the flow. A full socket buffer drops, as UDP drops. The flows' byte counts and activity times
 * are written to the Python flow objects once per call (client_bytes, last_active; pod_bytes,
 * last_active).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "_send_ring.h"

#define BATCH            64    /* datagrams per recvmmsg / sendmmsg: one GSO run's worth */
#define BUFFER_BYTES     65536 /* per datagram buffer: no UDP payload is longer, nothing truncates */
#define KEY_BYTES        24    /* family, port, address (16), scope id: one client address */
#define MAX_CID_BYTES    20    /* RFC 9000 section 17.2: a v1/v2 connection ID is at most 20 bytes */
#define QUIC_V1          0x00000001u
#define QUIC_V2          0x6b3343cfu /* RFC 9369 */
#define GSO_MAX_SEGMENTS 64          /* datagrams per UDP_SEGMENT send: the kernel's limit before Linux 6.x */
#define GSO_MAX_BYTES    65507       /* payload of one UDP_SEGMENT send: the largest IPv4 UDP payload */
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103 /* <linux/udp.h>: a u16 segment size; the kernel cuts the payload */
#endif
#ifndef SOL_UDP
#define SOL_UDP 17
#endif
#ifndef UDP_GRO
#define UDP_GRO 104 /* <linux/udp.h>: an int cmsg, the segment size of a glued read */
#endif
#define GRO_MAX_SEGMENTS 64 /* datagrams one GRO read holds at most (the kernel's UDP_GRO_CNT_MAX) */
#define OUT_DATAGRAMS    (BATCH * GRO_MAX_SEGMENTS) /* pod datagrams one from_pods call may queue */
#define MAX_BATCHES      4096  /* recvmmsg calls per from_clients at most: far above any callback's share */
#define MAX_PER_POD      65536 /* datagrams read from one pod socket per from_pods at most, likewise */

/* One datagram to send: its bytes and where to (NULL on a connected socket). */
typedef struct {
    struct iovec iov;
    const void *name;
    socklen_t name_len;
} Datagram;

typedef struct Slot {
    PyObject *flow;             /* the Python flow (strong reference) */
    PyObject *key;              /* its client address key in by_key */
    struct sockaddr_in6 client; /* where pod datagrams go (sockaddr_in fits too) */
    socklen_t client_len;
    int fd;                          /* the flow's connected pod socket */
    unsigned long long client_bytes; /* since the last write to the flow object */
    unsigned long long pod_bytes;
    unsigned int slow_call;            /* the call in which this flow went to Python */
    unsigned int touched_call;         /* the call in which it was last counted */
    int failed;                        /* an error is queued for Python: send nothing more */
    unsigned char scid[MAX_CID_BYTES]; /* the pod's SCID last handed to Python (v1/v2 only), or learn()'s */
    int scid_len;                      /* -1: none yet */
    int no_gso;                        /* the kernel refused a GSO send to this pod (a segment over the
                                          route's MTU): its runs go datagram by datagram from then on */
    struct Slot *next_here;            /* the next flow at its client address (by_key names the first) */
    int shared;                        /* it has met another flow at an address, or learn() named it: chosen
                                          by DCID from then on */
    int unconfirmed;                   /* not confirmed yet (router/udp/handshake_watch.py): its short headers
                                          go to Python and its pod's datagrams are handed over, not sent */
} Slot;

typedef struct {
    PyObject_HEAD
    int listener; /* the public socket (a duplicate the owner keeps open) */
    int family;
    int epoll_fd;
    int batches; /* recvmmsg calls per from_clients at most */
    int per_pod; /* datagrams read from one pod socket per from_pods at most */
    int busy;
    int gso; /* the kernel takes UDP_SEGMENT sends (until one says it cannot) */
    unsigned int call;
    Slot **by_fd;
    Py_ssize_t by_fd_len;
    Py_ssize_t flows;
    PyObject *by_key;   /* client address key -> pod fd of the address's first flow */
    PyObject *failures; /* list of (flow, errno) */
    PyObject *handed;   /* list of (flow, datagram): unconfirmed flows' pod datagrams, for Python to send */
    Slot **touched;     /* the flows this call counted: each once, so never more than are attached */
    Py_ssize_t touched_len, touched_cap;
    char *client_buffers; /* BATCH x BUFFER_BYTES, mmap'd: only touched pages count */
    char *pod_buffers;
    Datagram *pod_out;               /* OUT_DATAGRAMS: the pod datagrams one from_pods call queues */
    SendRing ring;                   /* a batch's sends to many pod sockets in one call (fd -1: none) */
    int ring_errno;                  /* why there is no ring (0: there is one, or none was asked for) */
    unsigned long long ring_batches; /* client batches whose sends to pods went through the ring */
    unsigned long long to_pod_bytes, to_client_bytes;
} Splicer;

/* The attributes of Python objects this file reads or writes by name (owner, name): the one list of
 * them, exported as ATTRIBUTES, interned at import into `attribute`. */
enum { LAST_ACTIVE, CLIENT_BYTES, POD_BYTES, ATTRIBUTE_COUNT };
static const char *const attribute_table[ATTRIBUTE_COUNT][2] = {
    [LAST_ACTIVE] = { "router.udp.flows.Flow", "last_active" },
    [CLIENT_BYTES] = { "router.udp.flows.Flow", "client_bytes" },
    [POD_BYTES] = { "router.udp.flows.Flow", "pod_bytes" },
};
static PyObject *attribute[ATTRIBUTE_COUNT];

/* -- addresses ---------------------------------------------------------------------------- */

static PyObject *
key_of(const struct sockaddr *sa)
{
    unsigned char key[KEY_BYTES];
    memset(key, 0, sizeof key);
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        key[0] = AF_INET;
        memcpy(key + 2, &in->sin_port, 2);
        memcpy(key + 4, &in->sin_addr, 4);
        return PyBytes_FromStringAndSize((const char *)key, 8);
    }
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    key[0] = AF_INET6;
    memcpy(key + 2, &in6->sin6_port, 2);
    memcpy(key + 4, &in6->sin6_addr, 16);
    memcpy(key + 20, &in6->sin6_scope_id, 4);
    return PyBytes_FromStringAndSize((const char *)key, KEY_BYTES);
}

/* The address tuple Python's socket module gives for sa: (host, port) or (host, port, flowinfo, scope_id). */
static PyObject *
tuple_of(const struct sockaddr *sa)
{
    char host[INET6_ADDRSTRLEN];
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        if (!inet_ntop(AF_INET, &in->sin_addr, host, sizeof host))
            return PyErr_SetFromErrno(PyExc_OSError);
        return Py_BuildValue("(si)", host, (int)ntohs(in->sin_port));
    }
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    if (!inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host))
        return PyErr_SetFromErrno(PyExc_OSError);
    return Py_BuildValue("(siII)", host, (int)ntohs(in6->sin6_port), (unsigned int)ntohl(in6->sin6_flowinfo),
                         (unsigned int)in6->sin6_scope_id);
}

/* Parse a Python address tuple of the listener's family into out; -1 with ValueError if it is not one. */
static int
parse_address(Splicer *self, PyObject *address, struct sockaddr_in6 *out, socklen_t *len)
{
    const char *host;
    int port;
    unsigned int flowinfo = 0, scope_id = 0;
    memset(out, 0, sizeof *out);
    if (!PyTuple_Check(address)) {
        PyErr_SetString(PyExc_ValueError, "address must be a tuple");
        return -1;
    }
    if (self->family == AF_INET) {
        struct sockaddr_in *in = (struct sockaddr_in *)out;
        if (!PyArg_ParseTuple(address, "si", &host, &port))
            return -1;
        if (port < 0 || port > 65535 || inet_pton(AF_INET, host, &in->sin_addr) != 1) {
            PyErr_Format(PyExc_ValueError, "not an IPv4 address: %R", address);
            return -1;
        }
        in->sin_family = AF_INET;
        in->sin_port = htons((unsigned short)port);
        *len = sizeof(struct sockaddr_in);
        return 0;
    }
    if (!PyArg_ParseTuple(address, "si|II", &host, &port, &flowinfo, &scope_id))
        return -1;
    if (port < 0 || port > 65535 || inet_pton(AF_INET6, host, &out->sin6_addr) != 1) {
        PyErr_Format(PyExc_ValueError, "not an IPv6 address: %R", address);
        return -1;
    }
    out->sin6_family = AF_INET6;
    out->sin6_port = htons((unsigned short)port);
    out->sin6_flowinfo = htonl(flowinfo);
    out->sin6_scope_id = scope_id;
    *len = sizeof(struct sockaddr_in6);
    return 0;
}

/* -- bookkeeping ---------------------------------------------------------------------------- */

static Slot *
slot_for_fd(Splicer *self, int fd)
{
    return (fd >= 0 && fd < self->by_fd_len) ? self->by_fd[fd] : NULL;
}

static Slot *
slot_for_address(Splicer *self, const struct sockaddr *sa)
{
    PyObject *key = key_of(sa);
    if (!key) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *fd = PyDict_GetItemWithError(self->by_key, key); /* borrowed */
    Py_DECREF(key);
    if (!fd) {
        PyErr_Clear();
        return NULL;
    }
    return slot_for_fd(self, (int)PyLong_AsLong(fd));
}

static void
touch(Splicer *self, Slot *slot)
{
    if (slot->touched_call != self->call && self->touched_len < self->touched_cap) { /* attach keeps room */
        slot->touched_call = self->call;
        self->touched[self->touched_len++] = slot;
    }
}

static int
add_to_attribute(PyObject *flow, PyObject *name, unsigned long long amount)
{
    PyObject *old = PyObject_GetAttr(flow, name);
    if (!old)
        return -1;
    PyObject *delta = PyLong_FromUnsignedLongLong(amount);
    PyObject *sum = delta ? PyNumber_Add(old, delta) : NULL;
    Py_DECREF(old);
    Py_XDECREF(delta);
    if (!sum)
        return -1;
    int rc = PyObject_SetAttr(flow, name, sum);
    Py_DECREF(sum);
    return rc;
}

/* Write what this call counted into the flow objects: once per flow per call. */
static int
write_counts(Splicer *self, double now, int client_side)
{
    PyObject *when = PyFloat_FromDouble(now);
    if (!when)
        return -1;
    int rc = 0;
    for (Py_ssize_t i = 0; i < self->touched_len && rc == 0; i++) {
        Slot *slot = self->touched[i];
        if (!slot->flow)
            continue;
        rc = PyObject_SetAttr(slot->flow, attribute[LAST_ACTIVE], when);
        if (rc == 0 && client_side) {
            if (slot->client_bytes)
                rc = add_to_attribute(slot->flow, attribute[CLIENT_BYTES], slot->client_bytes);
            slot->client_bytes = 0;
        } else if (rc == 0) {
            if (slot->pod_bytes)
                rc = add_to_attribute(slot->flow, attribute[POD_BYTES], slot->pod_bytes);
            slot->pod_bytes = 0;
        }
    }
    self->touched_len = 0;
    Py_DECREF(when);
    return rc;
}

static void
fail(Splicer *self, Slot *slot, int error)
{
    if (slot->failed)
        return;
    slot->failed = 1;
    PyObject *item = Py_BuildValue("(Oi)", slot->flow, error);
    if (!item || PyList_Append(self->failures, item) < 0)
        PyErr_Clear();
    Py_XDECREF(item);
}

/* Plan datagrams[0..count) into messages: with GSO on, a run to one destination whose datagrams
 * all have the first one's size (the last may be shorter, and then ends the run) leaves in one
 * UDP_SEGMENT message, so the kernel's send path runs once per run instead of once per datagram;
 * the receiver gets the same datagrams in the same order. first[m] is message m's first datagram. */
static int
plan(Splicer *self, Datagram *d, int count, int gso, struct mmsghdr *msgs, struct iovec *iovs,
     char (*cmsgs)[CMSG_SPACE(sizeof(uint16_t))], int *first)
{
    int m = 0;
    for (int i = 0; i < count;) {
        size_t size = d[i].iov.iov_len, total = size;
        int j = i + 1;
        if (gso && size > 0) {
            while (j < count && j - i < GSO_MAX_SEGMENTS && d[j].name == d[i].name && d[j].iov.iov_len > 0 &&
                   d[j].iov.iov_len <= size && total + d[j].iov.iov_len <= GSO_MAX_BYTES) {
                total += d[j].iov.iov_len;
                j++;
                if (d[j - 1].iov.iov_len < size)
                    break;
            }
        }
        memset(&msgs[m], 0, sizeof msgs[m]);
        for (int k = i; k < j; k++)
            iovs[k] = d[k].iov;
        msgs[m].msg_hdr.msg_name = (void *)d[i].name;
        msgs[m].msg_hdr.msg_namelen = d[i].name ? d[i].name_len : 0;
        msgs[m].msg_hdr.msg_iov = &iovs[i];
        msgs[m].msg_hdr.msg_iovlen = (size_t)(j - i);
        if (j - i > 1) {
            memset(cmsgs[m], 0, sizeof cmsgs[m]);
            msgs[m].msg_hdr.msg_control = cmsgs[m];
            msgs[m].msg_hdr.msg_controllen = sizeof cmsgs[m];
            struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msgs[m].msg_hdr);
            cmsg->cmsg_level = SOL_UDP;
            cmsg->cmsg_type = UDP_SEGMENT;
            cmsg->cmsg_len = CMSG_LEN(sizeof(uint16_t));
            uint16_t segment = (uint16_t)size;
            memcpy(CMSG_DATA(cmsg), &segment, sizeof segment);
        }
        first[m++] = i;
        i = j;
    }
    first[m] = count;
    return m;
}

static int
gso_refused(int error)
{
    return error == EINVAL || error == EMSGSIZE || error == EIO || error == ENOPROTOOPT || error == EOPNOTSUPP;
}

/* Send datagrams[0..count) (count <= BATCH) in order through fd with sendmmsg, GSO runs where
 * possible, until all are sent or the socket buffer is full (the rest dropped, as UDP drops). A
 * GSO message the kernel refuses goes again datagram by datagram (EIO, ENOPROTOOPT, EOPNOTSUPP:
 * GSO cannot work here, and this splice stops asking). On a connected pod socket another error
 * (ECONNREFUSED) fails the flow; to a client it drops that message only. Returns the bytes sent. */
static unsigned long long
send_datagrams(Splicer *self, int fd, Datagram *d, int count, int gso, Slot *pod_slot)
{
    struct mmsghdr msgs[BATCH];
    struct iovec iovs[BATCH];
    char cmsgs[BATCH][CMSG_SPACE(sizeof(uint16_t))];
    int first[BATCH + 1];
    int messages = plan(self, d, count, gso, msgs, iovs, cmsgs, first);
    unsigned long long bytes = 0;
    int sent = 0;
    while (sent < messages) {
        int n = sendmmsg(fd, msgs + sent, (unsigned int)(messages - sent), MSG_DONTWAIT);
        if (n < 0) {
            int error = errno;
            if (error == EINTR)
                continue;
            if (error == EAGAIN || error == EWOULDBLOCK || error == ENOBUFS)
                break;
            int run = first[sent + 1] - first[sent];
            if (run > 1 && gso_refused(error)) {
                if (error == EIO || error == ENOPROTOOPT || error == EOPNOTSUPP)
                    self->gso = 0;
                if (pod_slot)
                    pod_slot->no_gso = 1;
                bytes += send_datagrams(self, fd, d + first[sent], run, 0, pod_slot);
            } else if (pod_slot) {
                fail(self, pod_slot, error);
                break;
            }
            sent++; /* this message is done with: the others still go */
            continue;
        }
        for (int i = sent; i < sent + n; i++)
            bytes += msgs[i].msg_len;
        sent += n;
    }
    return bytes;
}

/* One flow's datagrams of a client batch: out[first .. first + count), in arrival order. */
typedef struct {
    Slot *slot;
    int first;
    int count;
} PodSends;

static void
credit_to_pod(Splicer *self, Slot *slot, unsigned long long bytes)
{
    slot->client_bytes += bytes;
    self->to_pod_bytes += bytes;
    touch(self, slot);
}

/* After a message of a flow failed in the ring (the flow's later messages were cancelled by the
 * link), do what send_datagrams does with that error, for d[0..count): the failed message's
 * datagrams and the rest of the flow's. Returns the bytes sent. */
static unsigned long long
after_ring_failure(Splicer *self, Slot *slot, int result, int run, Datagram *d, int count)
{
    int error = -result;
    if (send_ring_untried(result)) /* never sent: send now */
        return send_datagrams(self, slot->fd, d, count, self->gso && !slot->no_gso, slot);
    if (error == EAGAIN || error == EWOULDBLOCK || error == ENOBUFS)
        return 0; /* full: dropped, as UDP drops */
    if (run > 1 && gso_refused(error)) {
        if (error == EIO || error == ENOPROTOOPT || error == EOPNOTSUPP)
            self->gso = 0;
        slot->no_gso = 1;
        return send_datagrams(self, slot->fd, d, count, 0, slot); /* datagram by datagram */
    }
    fail(self, slot, error);
    return 0;
}

/* All flows' messages of one batch in one io_uring_enter, each flow's linked in order. */
static void
ring_to_pods(Splicer *self, Datagram *d, PodSends *sends, int flows)
{
    struct mmsghdr msgs[BATCH];
    struct iovec iovs[BATCH];
    char cmsgs[BATCH][CMSG_SPACE(sizeof(uint16_t))];
    int first[BATCH + 1], results[BATCH], start[BATCH + 1];
    int m = 0;
    for (int f = 0; f < flows; f++) {
        PodSends *s = &sends[f];
        int gso = self->gso && !s->slot->no_gso;
        int k = plan(self, d + s->first, s->count, gso, msgs + m, iovs + s->first, cmsgs + m, first + m);
        for (int j = 0; j < k; j++)
            send_ring_queue(&self->ring, s->slot->fd, &msgs[m + j].msg_hdr, (unsigned)(m + j), j + 1 < k);
        start[f] = m;
        m += k;
    }
    start[flows] = m;
    int broken = send_ring_run(&self->ring, results) < 0;
    self->ring_batches++;
    for (int f = 0; f < flows; f++) {
        PodSends *s = &sends[f];
        unsigned long long bytes = 0;
        for (int g = start[f]; g < start[f + 1]; g++) {
            if (results[g] >= 0) {
                bytes += (unsigned long long)results[g];
                continue;
            }
            if (results[g] == RING_UNSEEN)
                continue; /* the kernel took it; whether it left is unknown: never sent twice, not counted */
            int at = (int)(msgs[g].msg_hdr.msg_iov - (iovs + s->first)); /* its first datagram in the flow's */
            bytes += after_ring_failure(self, s->slot, results[g], (int)msgs[g].msg_hdr.msg_iovlen, d + s->first + at,
                                        s->count - at);
            break;
        }
        credit_to_pod(self, s->slot, bytes);
    }
    if (broken)
        send_ring_close(&self->ring); /* the kernel stopped taking entries: sendmmsg from now on */
}

/* Each flow's datagrams to its pod socket, in order: all flows in one io_uring_enter where the
 * ring is open (it pays from two flows on), otherwise one sendmmsg per flow. */
static void
send_to_pods(Splicer *self, Datagram *d, PodSends *sends, int flows)
{
    if (flows > 1 && send_ring_usable(&self->ring)) {
        ring_to_pods(self, d, sends, flows);
        return;
    }
    for (int f = 0; f < flows; f++) {
        Slot *slot = sends[f].slot;
        credit_to_pod(
            self, slot,
            send_datagrams(self, slot->fd, d + sends[f].first, sends[f].count, self->gso && !slot->no_gso, slot));
    }
}

/* -- the type ------------------------------------------------------------------------------- */

static int
Splicer_init(Splicer *self, PyObject *args, PyObject *kwds)
{
    static char *names[] = { "listener_fd", "batches", "per_pod", "io_uring", NULL };
    int listener, batches, per_pod, io_uring = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iii|$p", names, &listener, &batches, &per_pod, &io_uring))
        return -1;
    if (batches < 1 || batches > MAX_BATCHES || per_pod < 1 || per_pod > MAX_PER_POD) {
        PyErr_Format(PyExc_ValueError, "batches must be 1..%d and per_pod 1..%d", MAX_BATCHES, MAX_PER_POD);
        return -1;
    }
    if (self->by_key) {
        PyErr_SetString(PyExc_RuntimeError, "Splicer is already initialised");
        return -1;
    }
    struct sockaddr_storage bound;
    socklen_t bound_len = sizeof bound;
    if (getsockname(listener, (struct sockaddr *)&bound, &bound_len) < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    int type = 0;
    socklen_t type_len = sizeof type;
    if ((bound.ss_family != AF_INET && bound.ss_family != AF_INET6) ||
        getsockopt(listener, SOL_SOCKET, SO_TYPE, &type, &type_len) < 0 || type != SOCK_DGRAM) {
        PyErr_SetString(PyExc_ValueError, "the listener must be an IPv4 or IPv6 UDP socket");
        return -1;
    }
    self->listener = listener;
    self->family = bound.ss_family;
    self->batches = batches;
    self->per_pod = per_pod;
    int segment = 0;
    socklen_t segment_len = sizeof segment; /* a kernel before 4.18 lacks UDP_SEGMENT: no GSO */
    self->gso = getsockopt(listener, SOL_UDP, UDP_SEGMENT, &segment, &segment_len) == 0;
    self->epoll_fd = epoll_create1(EPOLL_CLOEXEC);
    if (self->epoll_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    size_t size = (size_t)BATCH * BUFFER_BYTES;
    self->client_buffers = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    self->pod_buffers = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (self->client_buffers == MAP_FAILED || self->pod_buffers == MAP_FAILED) {
        self->client_buffers = self->client_buffers == MAP_FAILED ? NULL : self->client_buffers;
        self->pod_buffers = self->pod_buffers == MAP_FAILED ? NULL : self->pod_buffers;
        PyErr_NoMemory();
        return -1;
    }
    self->pod_out = PyMem_Calloc(OUT_DATAGRAMS, sizeof(Datagram));
    self->by_key = PyDict_New();
    self->failures = PyList_New(0);
    self->handed = PyList_New(0);
    if (!self->pod_out || !self->by_key || !self->failures || !self->handed) {
        PyErr_NoMemory();
        return -1;
    }
    if (io_uring && send_ring_open(&self->ring) < 0)
        self->ring_errno = errno ? errno : EOPNOTSUPP;
    return 0;
}

static void
free_slot(Splicer *self, Slot *slot)
{
    if (slot->fd >= 0 && slot->fd < self->by_fd_len)
        self->by_fd[slot->fd] = NULL;
    if (self->epoll_fd >= 0)
        epoll_ctl(self->epoll_fd, EPOLL_CTL_DEL, slot->fd, NULL);
    Py_XDECREF(slot->flow);
    Py_XDECREF(slot->key);
    PyMem_Free(slot);
    self->flows--;
}

static void
release_all(Splicer *self)
{
    for (Py_ssize_t fd = 0; fd < self->by_fd_len; fd++)
        if (self->by_fd[fd])
            free_slot(self, self->by_fd[fd]);
    PyMem_Free(self->by_fd);
    self->by_fd = NULL;
    self->by_fd_len = 0;
    if (self->epoll_fd >= 0)
        close(self->epoll_fd);
    self->epoll_fd = -1;
    if (self->client_buffers)
        munmap(self->client_buffers, (size_t)BATCH * BUFFER_BYTES);
    if (self->pod_buffers)
        munmap(self->pod_buffers, (size_t)BATCH * BUFFER_BYTES);
    self->client_buffers = self->pod_buffers = NULL;
    if (self->by_key)
        PyDict_Clear(self->by_key);
    if (self->handed)
        PyList_SetSlice(self->handed, 0, PyList_GET_SIZE(self->handed), NULL);
    send_ring_close(&self->ring);
}

/* GC: the splice holds its flows, whose links (the router's PodLink) hold the splice: a splice
 * dropped without close() is a cycle, which the collector finds through here and breaks with
 * Splicer_clear (tests/udp/test_udp_splice_calls.py). */
static int
Splicer_traverse(Splicer *self, visitproc visit, void *arg)
{
    for (Py_ssize_t fd = 0; fd < self->by_fd_len; fd++) {
        if (self->by_fd[fd]) {
            Py_VISIT(self->by_fd[fd]->flow);
            Py_VISIT(self->by_fd[fd]->key);
        }
    }
    Py_VISIT(self->by_key);
    Py_VISIT(self->failures);
    Py_VISIT(self->handed);
    return 0;
}

static int
Splicer_clear(Splicer *self)
{
    release_all(self);
    Py_CLEAR(self->by_key);
    Py_CLEAR(self->failures);
    Py_CLEAR(self->handed);
    return 0;
}

static void
Splicer_dealloc(Splicer *self)
{
    PyObject_GC_UnTrack((PyObject *)self);
    Splicer_clear(self);
    PyMem_Free(self->touched);
    PyMem_Free(self->pod_out);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Splicer_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Splicer *self = (Splicer *)type->tp_alloc(type, 0);
    if (self)
        self->epoll_fd = self->ring.fd = -1;
    return (PyObject *)self;
}

static int
ready(Splicer *self)
{
    if (!self->by_key || self->epoll_fd < 0) {
        PyErr_SetString(PyExc_RuntimeError, "Splicer is closed");
        return 0;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Splicer re-entered");
        return 0;
    }
    return 1;
}

/* Room for a flow on `fd` (an open fd, so below INT_MAX: the doubling ends): in by_fd, and in
 * `touched`, which one call fills with each flow it counts once. 0, or -1 out of memory. */
static int
grow_for(Splicer *self, int fd)
{
    if (self->flows == self->touched_cap) {
        Py_ssize_t cap = self->touched_cap ? self->touched_cap * 2 : 64;
        Slot **grown = PyMem_Realloc(self->touched, (size_t)cap * sizeof(Slot *));
        if (!grown)
            return -1;
        self->touched = grown;
        self->touched_cap = cap;
    }
    if (fd >= self->by_fd_len) {
        Py_ssize_t length = self->by_fd_len ? self->by_fd_len : 64;
        while (length <= fd)
            length *= 2;
        Slot **grown = PyMem_Realloc(self->by_fd, (size_t)length * sizeof(Slot *));
        if (!grown)
            return -1;
        memset(grown + self->by_fd_len, 0, (size_t)(length - self->by_fd_len) * sizeof(Slot *));
        self->by_fd = grown;
        self->by_fd_len = length;
    }
    return 0;
}

/* -- several flows on one client address ------------------------------------------------------ */

/* The first flow at the client address `key`, or NULL (an error set only if the lookup failed). */
static Slot *
first_at(Splicer *self, PyObject *key)
{
    PyObject *fd = PyDict_GetItemWithError(self->by_key, key); /* borrowed */
    return fd ? slot_for_fd(self, (int)PyLong_AsLong(fd)) : NULL;
}

/* Put `slot` at its client address (slot->key): alone, by_key naming it; or after the flows there,
 * all of them shared from then on. 0, or -1 with an error set (and `slot` nowhere). */
static int
place(Splicer *self, Slot *slot)
{
    slot->next_here = NULL;
    Slot *last = first_at(self, slot->key);
    if (!last) {
        if (PyErr_Occurred())
            return -1;
        PyObject *fd = PyLong_FromLong(slot->fd);
        int rc = fd ? PyDict_SetItem(self->by_key, slot->key, fd) : -1;
        Py_XDECREF(fd);
        return rc;
    }
    slot->shared = last->shared = 1;
    while (last->next_here) {
        last = last->next_here;
        last->shared = 1;
    }
    last->next_here = slot;
    return 0;
}

/* Take `slot` from its client address; the next flow there, if any, becomes the first. Never
 * fails: without memory for the next one's entry the address is dropped from by_key, and its
 * flows' datagrams go to Python (which still knows them) instead of to a wrong pod. */
static void
unplace(Splicer *self, Slot *slot)
{
    Slot *first = first_at(self, slot->key);
    PyErr_Clear();
    if (first == slot) {
        PyObject *fd = slot->next_here ? PyLong_FromLong(slot->next_here->fd) : NULL;
        if (!fd || PyDict_SetItem(self->by_key, slot->key, fd) < 0) {
            PyErr_Clear();
            if (PyDict_DelItem(self->by_key, slot->key) < 0)
                PyErr_Clear();
        }
        Py_XDECREF(fd);
    } else {
        for (Slot *s = first; s; s = s->next_here) {
            if (s->next_here == slot) {
                s->next_here = slot->next_here;
                break;
            }
        }
    }
    slot->next_here = NULL;
}

static int to_learned_cid(Slot *slot, const unsigned char *data, unsigned int length);

/* The flow at a shared address (`first` and the flows after it) whose last learned pod CID a
 * client datagram carries as its DCID: where a short header's DCID starts (byte 1, its length
 * the CID's), or a long header's (byte 6, its length at byte 5); NULL when it names none. */
static Slot *
named_here(Slot *first, const unsigned char *data, unsigned int length)
{
    if (length == 0)
        return NULL;
    for (Slot *s = first; s; s = s->next_here) {
        if (s->scid_len <= 0)
            continue;
        if (data[0] & 0x80) {
            if (to_learned_cid(s, data, length))
                return s;
        } else if (length >= 1 + (unsigned int)s->scid_len && memcmp(data + 1, s->scid, (size_t)s->scid_len) == 0) {
            return s;
        }
    }
    return NULL;
}

static PyObject *
Splicer_attach(Splicer *self, PyObject *args)
{
    int fd, confirmed = 1;
    PyObject *address, *flow;
    if (!PyArg_ParseTuple(args, "iOO|p", &fd, &address, &flow, &confirmed) || !ready(self))
        return NULL;
    if (fd < 0 || fd == self->listener || slot_for_fd(self, fd)) {
        PyErr_Format(PyExc_ValueError, "pod fd %d is negative, the listener's or attached already", fd);
        return NULL;
    }
    struct sockaddr_in6 client;
    socklen_t client_len;
    if (parse_address(self, address, &client, &client_len) < 0)
        return NULL;
    PyObject *key = key_of((struct sockaddr *)&client); /* its address may have flows: it joins them */
    if (!key)
        return NULL;
    int type = 0;
    socklen_t type_len = sizeof type;
    int status = getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len); /* also: no fd too big to index */
    if (status < 0 || type != SOCK_DGRAM) {
        if (status < 0)
            PyErr_SetFromErrno(PyExc_OSError); /* EBADF, ENOTSOCK */
        else
            PyErr_Format(PyExc_ValueError, "pod fd %d is not a UDP socket", fd);
        Py_DECREF(key);
        return NULL;
    }
    if (grow_for(self, fd) < 0) {
        Py_DECREF(key);
        return PyErr_NoMemory();
    }
    Slot *slot = PyMem_Calloc(1, sizeof(Slot));
    struct epoll_event event = { .events = EPOLLIN, .data.fd = fd };
    if (!slot || epoll_ctl(self->epoll_fd, EPOLL_CTL_ADD, fd, &event) < 0) {
        if (slot)
            PyErr_SetFromErrno(PyExc_OSError);
        else
            PyErr_NoMemory();
        PyMem_Free(slot);
        Py_DECREF(key);
        return NULL;
    }
    slot->fd = fd;
    slot->key = key;
    if (place(self, slot) < 0) {
        epoll_ctl(self->epoll_fd, EPOLL_CTL_DEL, fd, NULL);
        PyMem_Free(slot);
        Py_DECREF(key);
        return NULL;
    }
    slot->scid_len = -1;
    slot->unconfirmed = !confirmed;
    slot->client = client;
    slot->client_len = client_len;
    slot->flow = Py_NewRef(flow);
    self->by_fd[fd] = slot;
    self->flows++;
    Py_RETURN_NONE;
}

static PyObject *
Splicer_detach(Splicer *self, PyObject *arg)
{
    long fd = PyLong_AsLong(arg);
    if ((fd == -1 && PyErr_Occurred()) || !ready(self))
        return NULL;
    Slot *slot = fd >= 0 && fd <= INT_MAX ? slot_for_fd(self, (int)fd) : NULL; /* no fd is truncated into another */
    if (slot) {
        unplace(self, slot);
        free_slot(self, slot);
    }
    Py_RETURN_NONE;
}

/* confirm(pod_fd): the flow's client and pod are talking (router/udp/handshake_watch.py): from now on
 * its datagrams are spliced both ways like any attached flow's. */
static PyObject *
Splicer_confirm(Splicer *self, PyObject *arg)
{
    long fd = PyLong_AsLong(arg);
    if ((fd == -1 && PyErr_Occurred()) || !ready(self))
        return NULL;
    Slot *slot = fd >= 0 && fd <= INT_MAX ? slot_for_fd(self, (int)fd) : NULL;
    if (!slot) {
        PyErr_Format(PyExc_KeyError, "pod fd %ld is not attached", fd);
        return NULL;
    }
    slot->unconfirmed = 0;
    Py_RETURN_NONE;
}

static PyObject *
Splicer_rekey(Splicer *self, PyObject *args)
{
    int fd;
    PyObject *address;
    if (!PyArg_ParseTuple(args, "iO", &fd, &address) || !ready(self))
        return NULL;
    Slot *slot = slot_for_fd(self, fd);
    if (!slot) {
        PyErr_Format(PyExc_KeyError, "pod fd %d is not attached", fd);
        return NULL;
    }
    struct sockaddr_in6 client;
    socklen_t client_len;
    if (parse_address(self, address, &client, &client_len) < 0)
        return NULL;
    PyObject *key = key_of((struct sockaddr *)&client);
    if (!key)
        return NULL;
    int same = PyObject_RichCompareBool(key, slot->key, Py_EQ); /* bytes: no Python code runs */
    if (same == 0) {
        /* a new address, or another flow's: then it joins the flows there, told apart by DCID, as
         * router/udp/flow_table.py's migrate does (one endpoint's connections follow it there) */
        PyObject *old_key = slot->key;
        unplace(self, slot);
        slot->key = key;
        if (place(self, slot) < 0) { /* out of memory: back where it was */
            slot->key = old_key;
            if (place(self, slot) < 0)
                PyErr_Clear();
            PyErr_NoMemory();
            Py_DECREF(key);
            return NULL;
        }
        Py_DECREF(old_key);
    } else {
        Py_DECREF(key); /* its own address (or a failed compare): the entry stays */
        if (same < 0)
            return NULL;
    }
    slot->client = client;
    slot->client_len = client_len;
    Py_RETURN_NONE;
}

/* learn(pod_fd, cid): `cid` is a connection ID the pod issued for the flow on pod_fd, learned
 * outside the pod's long headers (QUIC-LB: the DCID a joined flow came with, or a later one whose
 * server ID names the same pod, or one another worker learned; router/udp/joins.py). The flow is told apart by DCID
 * from then on, as at a shared address: its client's datagrams that carry `cid` are spliced, and any other (another
 * connection of the same client socket, which may name another pod) goes to Python instead of to this pod. */
static PyObject *
Splicer_learn(Splicer *self, PyObject *args)
{
    int fd;
    const char *cid;
    Py_ssize_t cid_len;
    if (!PyArg_ParseTuple(args, "iy#", &fd, &cid, &cid_len) || !ready(self))
        return NULL;
    Slot *slot = slot_for_fd(self, fd);
    if (!slot) {
        PyErr_Format(PyExc_KeyError, "pod fd %d is not attached", fd);
        return NULL;
    }
    if (cid_len < 1 || cid_len > MAX_CID_BYTES) {
        PyErr_Format(PyExc_ValueError, "a connection ID is 1 to %d bytes, got %zd", MAX_CID_BYTES, cid_len);
        return NULL;
    }
    memcpy(slot->scid, cid, (size_t)cid_len);
    slot->scid_len = (int)cid_len;
    slot->shared = 1;
    Py_RETURN_NONE;
}

/* The SCID of a pod's v1/v2 long header, when it is a new one for this flow (every handshake
 * datagram after the first carries the same): 1 with *scid and *scid_len set, and remembered. 0
 * for the same SCID again, an empty one, and anything Python would learn nothing from either
 * (another version, a header cut short: quic.packet.long_header_scid's None). Bounds-checked
 * against the datagram's length. */
static int
new_scid(Slot *slot, const unsigned char *data, unsigned int length, const unsigned char **scid, unsigned int *scid_len)
{
    if (length < 7)
        return 0;
    uint32_t version = ((uint32_t)data[1] << 24) | ((uint32_t)data[2] << 16) | ((uint32_t)data[3] << 8) | data[4];
    unsigned int dcid_len = data[5], at = 6 + dcid_len;
    if ((version != QUIC_V1 && version != QUIC_V2) || dcid_len > MAX_CID_BYTES || at >= length)
        return 0;
    unsigned int n = data[at];
    if (n == 0 || n > MAX_CID_BYTES || at + 1 + n > length)
        return 0;
    if (slot->scid_len == (int)n && memcmp(slot->scid, data + at + 1, n) == 0)
        return 0;
    memcpy(slot->scid, data + at + 1, n);
    slot->scid_len = (int)n;
    *scid = data + at + 1;
    *scid_len = n;
    return 1;
}

/* Whether a client long header names, as its DCID, the pod CID this flow last learned: then it is
 * one of the flow's own connections (its Initial ACKs and Handshake packets), which the edge
 * would forward unparsed (router/udp/verdicts.py, _known_dcid), so the splice sends it itself. */
static int
to_learned_cid(Slot *slot, const unsigned char *data, unsigned int length)
{
    return slot->scid_len > 0 && length >= 6 + (unsigned int)slot->scid_len && data[5] == slot->scid_len &&
           memcmp(data + 6, slot->scid, (size_t)slot->scid_len) == 0;
}

/* The UDP_GRO segment size of a read of `length` bytes (its cmsg), or `length`: one datagram. */
static unsigned int
gro_segment(struct msghdr *msg, unsigned int length)
{
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
            int size;
            memcpy(&size, CMSG_DATA(c), sizeof size);
            if (size > 0 && (unsigned int)size < length)
                return (unsigned int)size;
        }
    }
    return length;
}

/* One client datagram of a batch: a whole read, or one segment of a GRO read. */
typedef struct {
    unsigned char *data;
    unsigned int length;
    const struct sockaddr_in6 *name; /* the client address it came from (its read's) */
} Piece;

/* Up to BATCH client datagrams in arrival order: send the fast ones per flow, return the rest. */
static int
client_pieces(Splicer *self, PyObject *slow, Piece *pieces, int n)
{
    Slot *slots[BATCH];
    const struct sockaddr_in6 *looked_up = NULL; /* the segments of one read share its lookup */
    Slot *found = NULL;
    for (int i = 0; i < n; i++) {
        unsigned char *data = pieces[i].data;
        unsigned int length = pieces[i].length;
        if (pieces[i].name != looked_up) {
            looked_up = pieces[i].name;
            found = slot_for_address(self, (const struct sockaddr *)looked_up);
        }
        Slot *slot = found && found->shared ? named_here(found, data, length) : found;
        if (slot && length > 0 && slot->slow_call != self->call &&
            (!(data[0] & 0x80) ? !slot->unconfirmed : to_learned_cid(slot, data, length))) {
            slots[i] = slot;
            continue;
        }
        slots[i] = NULL;
        for (Slot *s = found && found->shared ? found : slot; s; s = s->shared ? s->next_here : NULL)
            s->slow_call = self->call; /* the rest of this flow's (a shared address's) datagrams follow it */
        PyObject *address = tuple_of((const struct sockaddr *)pieces[i].name);
        PyObject *item = address ? Py_BuildValue("(y#N)", (const char *)data, (Py_ssize_t)length, address) : NULL;
        if (!item || PyList_Append(slow, item) < 0) {
            Py_XDECREF(item);
            return -1;
        }
        Py_DECREF(item);
    }
    Datagram out[BATCH];
    PodSends sends[BATCH];
    int used = 0, flows = 0;
    for (int i = 0; i < n; i++) {
        Slot *slot = slots[i];
        if (!slot)
            continue;
        int count = 0;
        for (int j = i; j < n; j++) {
            if (slots[j] != slot)
                continue;
            out[used + count].iov.iov_base = pieces[j].data;
            out[used + count].iov.iov_len = pieces[j].length;
            out[used + count].name = NULL;
            out[used + count].name_len = 0;
            slots[j] = NULL;
            count++;
        }
        if (slot->failed)
            continue; /* its end is queued for Python: dropped */
        sends[flows].slot = slot;
        sends[flows].first = used;
        sends[flows++].count = count;
        used += count;
    }
    send_to_pods(self, out, sends, flows);
    return 0;
}

/* One batch read from the public socket, each GRO read cut at its segment size (a client's GSO
 * batch, glued by the kernel's GRO), handled BATCH datagrams at a time in arrival order. */
static int
client_batch(Splicer *self, PyObject *slow, struct mmsghdr *msgs, struct sockaddr_in6 *names, int n)
{
    Piece pieces[BATCH];
    int count = 0;
    for (int i = 0; i < n; i++) {
        unsigned char *data = (unsigned char *)msgs[i].msg_hdr.msg_iov->iov_base;
        unsigned int length = msgs[i].msg_len;
        unsigned int segment = gro_segment(&msgs[i].msg_hdr, length);
        unsigned int at = 0;
        do { /* an empty datagram is one piece too: Python counts it */
            if (count == BATCH) {
                if (client_pieces(self, slow, pieces, count) < 0)
                    return -1;
                count = 0;
            }
            unsigned int size = length - at < segment ? length - at : segment;
            pieces[count].data = data + at;
            pieces[count].length = size;
            pieces[count].name = &names[i];
            count++;
            at += size;
        } while (at < length);
    }
    return count ? client_pieces(self, slow, pieces, count) : 0;
}

static PyObject *
Splicer_from_clients(Splicer *self, PyObject *arg)
{
    double now = PyFloat_AsDouble(arg);
    if ((now == -1.0 && PyErr_Occurred()) || !ready(self))
        return NULL;
    PyObject *slow = PyList_New(0);
    if (!slow)
        return NULL;
    self->busy = 1;
    self->call++;
    struct mmsghdr msgs[BATCH];
    struct iovec iov[BATCH];
    struct sockaddr_in6 names[BATCH];
    char controls[BATCH][CMSG_SPACE(sizeof(int))];
    int failed = 0;
    for (int round = 0; round < self->batches && !failed; round++) {
        memset(msgs, 0, sizeof msgs);
        for (int i = 0; i < BATCH; i++) {
            iov[i].iov_base = self->client_buffers + (size_t)i * BUFFER_BYTES;
            iov[i].iov_len = BUFFER_BYTES;
            msgs[i].msg_hdr.msg_iov = &iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_name = &names[i];
            msgs[i].msg_hdr.msg_namelen = sizeof names[i];
            msgs[i].msg_hdr.msg_control = controls[i];
            msgs[i].msg_hdr.msg_controllen = sizeof controls[i];
        }
        int n = recvmmsg(self->listener, msgs, BATCH, MSG_DONTWAIT, NULL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break; /* EAGAIN, or an error the next readiness will show again */
        if (client_batch(self, slow, msgs, names, n) < 0)
            failed = 1;
        if (n < BATCH)
            break;
        /* GRO reads hold up to 64 datagrams each: once Python has a call's worth to judge, the
         * next batch waits for the next wake-up, so a flood of glued datagrams from strangers
         * cannot keep the loop from its timers and pods longer than before. */
        if (PyList_GET_SIZE(slow) >= (Py_ssize_t)self->batches * BATCH)
            break;
    }
    int counted = write_counts(self, now, 1); /* still busy: a flow's setter cannot detach a slot in use */
    self->busy = 0;
    if (counted < 0 || failed) {
        Py_DECREF(slow);
        return NULL;
    }
    return slow;
}

/* Send out[0..count) to their clients through the listener, BATCH datagrams per sendmmsg plan. */
static void
send_to_clients(Splicer *self, Datagram *out, int count)
{
    for (int at = 0; at < count; at += BATCH) {
        int n = count - at < BATCH ? count - at : BATCH;
        self->to_client_bytes += send_datagrams(self, self->listener, out + at, n, self->gso, NULL);
    }
}

static PyObject *
Splicer_from_pods(Splicer *self, PyObject *arg)
{
    double now = PyFloat_AsDouble(arg);
    if ((now == -1.0 && PyErr_Occurred()) || !ready(self))
        return NULL;
    struct epoll_event events[BATCH];
    int ready_count = epoll_wait(self->epoll_fd, events, BATCH, 0);
    PyObject *learned = PyList_New(0);
    if (!learned)
        return NULL;
    if (ready_count <= 0)
        return learned;
    self->busy = 1;
    self->call++;
    struct mmsghdr in[BATCH];
    struct iovec iov[BATCH];
    char controls[BATCH][CMSG_SPACE(sizeof(int))];
    Datagram *out = self->pod_out;
    int used = 0, queued = 0, failed = 0; /* buffers read into; datagrams queued to send */
    for (int e = 0; e < ready_count && !failed; e++) {
        Slot *slot = slot_for_fd(self, events[e].data.fd);
        if (!slot || slot->failed)
            continue;
        int budget = self->per_pod;
        while (budget > 0) {
            if (used == BATCH) { /* every buffer holds queued datagrams: send them, reuse the buffers */
                send_to_clients(self, out, queued);
                used = queued = 0;
            }
            int want = BATCH - used < budget ? BATCH - used : budget;
            memset(in + used, 0, (size_t)want * sizeof in[0]);
            for (int i = used; i < used + want; i++) {
                iov[i].iov_base = self->pod_buffers + (size_t)i * BUFFER_BYTES;
                iov[i].iov_len = BUFFER_BYTES;
                in[i].msg_hdr.msg_iov = &iov[i];
                in[i].msg_hdr.msg_iovlen = 1;
                in[i].msg_hdr.msg_control = controls[i];
                in[i].msg_hdr.msg_controllen = sizeof controls[i];
            }
            int n = recvmmsg(slot->fd, in + used, (unsigned int)want, MSG_DONTWAIT, NULL);
            if (n < 0) {
                if (errno == EINTR)
                    continue;
                if (errno != EAGAIN && errno != EWOULDBLOCK)
                    fail(self, slot, errno);
                break;
            }
            touch(self, slot);
            for (int i = used; i < used + n; i++) {
                unsigned int length = in[i].msg_len;
                if (!length || (in[i].msg_hdr.msg_flags & MSG_TRUNC))
                    continue;
                unsigned char *data = (unsigned char *)iov[i].iov_base;
                unsigned int segment = gro_segment(&in[i].msg_hdr, length);
                if (!slot->unconfirmed)
                    slot->pod_bytes += length; /* an unconfirmed flow's bytes are counted where they are sent */
                for (unsigned int at = 0; at < length; at += segment) { /* each datagram of a GRO read */
                    unsigned int size = length - at < segment ? length - at : segment;
                    unsigned char *datagram = data + at;
                    /* Python learns the pod's CIDs: each new SCID of its long headers */
                    const unsigned char *scid;
                    unsigned int scid_len;
                    if ((datagram[0] & 0x80) && new_scid(slot, datagram, size, &scid, &scid_len)) {
                        PyObject *item = Py_BuildValue("(Oy#)", slot->flow, (const char *)scid, (Py_ssize_t)scid_len);
                        if (!item || PyList_Append(learned, item) < 0)
                            failed = 1;
                        Py_XDECREF(item);
                    }
                    if (slot->unconfirmed) { /* Python sends it, and watches the flow's handshake */
                        PyObject *item = Py_BuildValue("(Oy#)", slot->flow, (const char *)datagram, (Py_ssize_t)size);
                        if (!item || PyList_Append(self->handed, item) < 0)
                            failed = 1;
                        Py_XDECREF(item);
                        continue;
                    }
                    if (queued == OUT_DATAGRAMS) { /* tiny segments: send what is queued (the buffers stay) */
                        send_to_clients(self, out, queued);
                        queued = 0;
                    }
                    out[queued].iov.iov_base = datagram;
                    out[queued].iov.iov_len = size;
                    out[queued].name = &slot->client;
                    out[queued].name_len = slot->client_len;
                    queued++;
                }
            }
            used += n;
            budget -= n;
            if (n < want)
                break; /* drained */
        }
    }
    if (queued)
        send_to_clients(self, out, queued);
    int counted = write_counts(self, now, 0);
    self->busy = 0;
    if (counted < 0 || failed) {
        Py_DECREF(learned);
        return NULL;
    }
    return learned;
}

static PyObject *
Splicer_take_failures(Splicer *self, PyObject *unused)
{
    if (!self->failures) {
        PyErr_SetString(PyExc_RuntimeError, "Splicer is not initialised");
        return NULL;
    }
    PyObject *failures = self->failures;
    self->failures = PyList_New(0);
    if (!self->failures) {
        self->failures = failures;
        return NULL;
    }
    return failures;
}

/* The unconfirmed flows' pod datagrams read since the last call, [(flow, datagram)], in order. */
static PyObject *
Splicer_take_handed(Splicer *self, PyObject *unused)
{
    if (!self->handed) {
        PyErr_SetString(PyExc_RuntimeError, "Splicer is not initialised");
        return NULL;
    }
    PyObject *handed = self->handed;
    self->handed = PyList_New(0);
    if (!self->handed) {
        self->handed = handed;
        return NULL;
    }
    return handed;
}

/* An exception a callback raised, taken off the thread state to be raised again once every item
 * of the call was delivered (PyErr_Fetch is deprecated from Python 3.12 on). */
typedef struct {
    PyObject *type, *value, *traceback;
    int set;
} Raised;

static void
keep_raised(Raised *raised)
{
#if PY_VERSION_HEX >= 0x030C0000
    raised->type = raised->traceback = NULL;
    raised->value = PyErr_GetRaisedException();
#else
    PyErr_Fetch(&raised->type, &raised->value, &raised->traceback);
#endif
    raised->set = 1;
}

static void
raise_kept(Raised *raised)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(raised->value);
#else
    PyErr_Restore(raised->type, raised->value, raised->traceback);
#endif
    raised->type = raised->value = raised->traceback = NULL;
    raised->set = 0;
}

static void
forget_raised(Raised *raised)
{
    Py_CLEAR(raised->type);
    Py_CLEAR(raised->value);
    Py_CLEAR(raised->traceback);
    raised->set = 0;
}

/* fn(a, b) for each (a, b) item of list, in order, whatever the others did: an item whose call
 * raises an Exception costs that item only (one client's datagram never costs another client
 * its own). The first such exception is kept in *raised, the later ones dropped: a flood of
 * raising items makes one report per call, never one per item. -1 only for what is no Exception
 * (KeyboardInterrupt, SystemExit), which stops the delivery at once, set, *raised forgotten. */
static int
call_each(PyObject *list, PyObject *fn, Raised *raised)
{
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++) {
        PyObject *item = PyList_GET_ITEM(list, i);
        PyObject *result = PyObject_CallFunctionObjArgs(fn, PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1), NULL);
        if (result) {
            Py_DECREF(result);
            continue;
        }
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            forget_raised(raised);
            return -1;
        }
        if (raised->set)
            PyErr_Clear();
        else
            keep_raised(raised);
    }
    return 0;
}

/* Hand each (a, b) item of list (stolen) to handler(a, b), then each queued failure to
 * on_failure(flow, errno): after the splice's own work, so Python may attach and detach flows.
 * Every item is delivered even if a call raises (call_each); the first exception is raised when
 * all are, so a bug is never silent (the loop reports it once for the call). */
static PyObject *
deliver(Splicer *self, PyObject *list, PyObject *handler, PyObject *on_failure)
{
    if (!list)
        return NULL;
    Raised raised = { NULL, NULL, NULL, 0 };
    int rc = call_each(list, handler, &raised);
    Py_DECREF(list);
    while (rc == 0 && self->failures && PyList_GET_SIZE(self->failures) > 0) {
        PyObject *failures = Splicer_take_failures(self, NULL);
        if (!failures) {
            forget_raised(&raised);
            return NULL;
        }
        rc = call_each(failures, on_failure, &raised);
        Py_DECREF(failures);
    }
    if (rc < 0)
        return NULL;
    if (raised.set) {
        raise_kept(&raised);
        return NULL;
    }
    Py_RETURN_NONE;
}

static int
all_callable(PyObject *const *args, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyCallable_Check(args[i]))
            return 0;
    return 1;
}

static PyObject *
now_from(PyObject *clock)
{
    return PyObject_CallNoArgs(clock);
}

static PyObject *Splicer_from_clients(Splicer *self, PyObject *arg);
static PyObject *Splicer_from_pods(Splicer *self, PyObject *arg);

/* The loop's reader callbacks (no Python frame of their own): clock() gives the time, the
 * datagrams the splice hands back go to on_datagram(data, address) in arrival order, new pod
 * SCIDs to on_learn(flow, scid), pod socket errors to on_failure(flow, errno); each of them even
 * if a call before it raised (deliver). */
static PyObject *
Splicer_pump_clients(Splicer *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !all_callable(args, 3)) { /* before any datagram is taken off a socket */
        PyErr_SetString(PyExc_TypeError, "pump_clients(clock, on_datagram, on_failure): three callables");
        return NULL;
    }
    PyObject *now = now_from(args[0]);
    if (!now)
        return NULL;
    PyObject *list = Splicer_from_clients(self, now);
    Py_DECREF(now);
    return deliver(self, list, args[1], args[2]);
}

static PyObject *
Splicer_pump_pods(Splicer *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !all_callable(args, 4)) { /* before any datagram is taken off a socket */
        PyErr_SetString(PyExc_TypeError, "pump_pods(clock, on_learn, on_failure, on_handed): four callables");
        return NULL;
    }
    PyObject *now = now_from(args[0]);
    if (!now)
        return NULL;
    PyObject *list = Splicer_from_pods(self, now);
    Py_DECREF(now);
    PyObject *done = deliver(self, list, args[1], args[2]);
    if (!done && !PyErr_ExceptionMatches(PyExc_Exception))
        return NULL; /* KeyboardInterrupt, SystemExit: at once */
    Raised raised = { NULL, NULL, NULL, 0 };
    if (!done)
        keep_raised(&raised); /* the handed datagrams still go out, the exception after them */
    Py_XDECREF(done);
    PyObject *rest = deliver(self, Splicer_take_handed(self, NULL), args[3], args[2]);
    if (!raised.set)
        return rest;
    if (!rest && !PyErr_ExceptionMatches(PyExc_Exception)) {
        forget_raised(&raised);
        return NULL;
    }
    PyErr_Clear();
    Py_XDECREF(rest);
    raise_kept(&raised);
    return NULL;
}

static PyObject *
Splicer_take_counts(Splicer *self, PyObject *unused)
{
    PyObject *counts = Py_BuildValue("(KK)", self->to_pod_bytes, self->to_client_bytes);
    if (counts)
        self->to_pod_bytes = self->to_client_bytes = 0;
    return counts;
}

static PyObject *
Splicer_close(Splicer *self, PyObject *unused)
{
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "Splicer re-entered");
        return NULL;
    }
    release_all(self);
    Py_RETURN_NONE;
}

static PyObject *
Splicer_get_epoll_fd(Splicer *self, void *closure)
{
    return PyLong_FromLong(self->epoll_fd);
}
static PyObject *
Splicer_get_flows(Splicer *self, void *closure)
{
    return PyLong_FromSsize_t(self->flows);
}
static PyObject *
Splicer_get_io_uring(Splicer *self, void *closure)
{
    return PyBool_FromLong(send_ring_usable(&self->ring));
}
static PyObject *
Splicer_get_io_uring_errno(Splicer *self, void *closure)
{
    return PyLong_FromLong(self->ring_errno);
}
static PyObject *
Splicer_get_ring_batches(Splicer *self, void *closure)
{
    return PyLong_FromUnsignedLongLong(self->ring_batches);
}
static PyObject *
Splicer_get_has_failures(Splicer *self, void *closure)
{
    return PyBool_FromLong(self->failures && PyList_GET_SIZE(self->failures) > 0);
}

static PyMethodDef Splicer_methods[] = {
    { "attach", (PyCFunction)Splicer_attach, METH_VARARGS,
      "attach(pod_fd, client_address, flow, confirmed=True): splice this flow here (unconfirmed: through Python)." },
    { "detach", (PyCFunction)Splicer_detach, METH_O, "detach(pod_fd): stop splicing it (before the fd is closed)." },
    { "rekey", (PyCFunction)Splicer_rekey, METH_VARARGS, "rekey(pod_fd, client_address): the client moved." },
    { "learn", (PyCFunction)Splicer_learn, METH_VARARGS,
      "learn(pod_fd, cid): a pod connection ID of this flow; its datagrams are told apart by DCID." },
    { "from_clients", (PyCFunction)Splicer_from_clients, METH_O,
      "from_clients(now) -> [(datagram, address)]: splice what the public socket holds; return the rest." },
    { "from_pods", (PyCFunction)Splicer_from_pods, METH_O,
      "from_pods(now) -> [(flow, new_pod_scid)]: splice what readable pod sockets hold." },
    { "pump_clients", (PyCFunction)(void (*)(void))Splicer_pump_clients, METH_FASTCALL,
      "pump_clients(clock, on_datagram, on_failure): from_clients(clock()), then the callbacks." },
    { "pump_pods", (PyCFunction)(void (*)(void))Splicer_pump_pods, METH_FASTCALL,
      "pump_pods(clock, on_learn, on_failure, on_handed): from_pods(clock()), then the callbacks." },
    { "take_failures", (PyCFunction)Splicer_take_failures, METH_NOARGS, "[(flow, errno)] since the last call." },
    { "take_handed", (PyCFunction)Splicer_take_handed, METH_NOARGS,
      "[(flow, datagram)]: unconfirmed flows' pod datagrams read since the last call, for Python to send." },
    { "confirm", (PyCFunction)Splicer_confirm, METH_O,
      "confirm(pod_fd): the flow's handshake is seen done: splice its datagrams both ways from now on." },
    { "take_counts", (PyCFunction)Splicer_take_counts, METH_NOARGS,
      "(bytes to pods, bytes to clients) since the last call." },
    { "close", (PyCFunction)Splicer_close, METH_NOARGS, "Forget every flow and close the epoll set." },
    { NULL, NULL, 0, NULL },
};

static PyGetSetDef Splicer_getset[] = {
    { "epoll_fd", (getter)Splicer_get_epoll_fd, NULL, "readable when an attached pod socket is", NULL },
    { "flows", (getter)Splicer_get_flows, NULL, "attached flows", NULL },
    { "has_failures", (getter)Splicer_get_has_failures, NULL, "whether take_failures has something", NULL },
    { "io_uring", (getter)Splicer_get_io_uring, NULL, "whether a batch's sends to many pods share one call", NULL },
    { "io_uring_errno", (getter)Splicer_get_io_uring_errno, NULL, "why io_uring did not open (0: it did, or unasked)",
      NULL },
    { "ring_batches", (getter)Splicer_get_ring_batches, NULL, "client batches sent to their pods through the ring",
      NULL },
    { NULL, NULL, NULL, NULL, NULL },
};

static PyTypeObject SplicerType = {
    .ob_base = { PyObject_HEAD_INIT(NULL) 0 },
    .tp_name = "router.udp._splice.Splicer",
    .tp_basicsize = sizeof(Splicer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Splices established QUIC flows' datagrams between the public socket and pod sockets.",
    .tp_traverse = (traverseproc)Splicer_traverse,
    .tp_clear = (inquiry)Splicer_clear,
    .tp_new = Splicer_new,
    .tp_init = (initproc)Splicer_init,
    .tp_dealloc = (destructor)Splicer_dealloc,
    .tp_methods = Splicer_methods,
    .tp_getset = Splicer_getset,
};

static struct PyModuleDef splice_module = {
    PyModuleDef_HEAD_INIT, "router.udp._splice", "Established QUIC flows spliced in C (optional).", -1, NULL,
};

PyMODINIT_FUNC
PyInit__splice(void)
{
    PyObject *attributes = PyTuple_New(ATTRIBUTE_COUNT);
    if (!attributes)
        return NULL;
    for (int i = 0; i < ATTRIBUTE_COUNT; i++) {
        if (!attribute[i] && !(attribute[i] = PyUnicode_InternFromString(attribute_table[i][1]))) {
            Py_DECREF(attributes);
            return NULL;
        }
        PyObject *pair = Py_BuildValue("(sO)", attribute_table[i][0], attribute[i]);
        if (!pair) {
            Py_DECREF(attributes);
            return NULL;
        }
        PyTuple_SET_ITEM(attributes, i, pair);
    }
    PyObject *module = NULL;
    if (PyType_Ready(&SplicerType) < 0)
        goto failed;
    if (send_ring_register_fork() != 0) {
        PyErr_NoMemory();
        goto failed;
    }
    module = PyModule_Create(&splice_module);
    if (!module || PyModule_AddObjectRef(module, "Splicer", (PyObject *)&SplicerType) < 0 ||
        PyModule_AddIntConstant(module, "BATCH", BATCH) < 0 ||
        PyModule_AddObjectRef(module, "ATTRIBUTES", attributes) < 0)
        goto failed;
    Py_DECREF(attributes);
    return module;
failed:
    Py_XDECREF(module);
    Py_DECREF(attributes);
    return NULL;
}
