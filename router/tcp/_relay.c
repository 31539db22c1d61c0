/* router.tcp._relay: the TCP relay's byte pump in C (the same pump as router/tcp/pump.py).
 *
 * What it owns: each engine's epoll set, scratch buffer and event array; each relay's pipes,
 * held bytes and counts while it runs, and the engine's reference to it (epoll names the relay).
 * The two fds of a relay stay Python's: they are closed here only when Python says so
 * (close_fds), after leaving the epoll set. Python is reached only through the callbacks handed
 * to start (no attribute is read or written by name: ATTRIBUTES is empty).
 * What it must never do: block (every socket call is non-blocking, epoll_wait does not wait),
 * keep a borrowed reference past a call into Python (a callback is held while it runs), touch a
 * relay's fds after a callback ended it (they may be another connection's by then: after each
 * callback the pump looks at `over`), leave a freed relay in the epoll set, or trust a caller's
 * fds, sizes or callbacks: every entry point checks its own arguments.
 *
 * Optional: built at install when a C compiler is there; without it (or with the
 * NO_EXTENSIONS_ENV variable set) router/tcp/relay.py runs its pure-Python pump, which the test
 * suite runs too. Why: a short connection's relay costs the Python pump ~20 us of interpreter
 * time (a readiness callback, a bound method and a few objects per wake-up, per direction);
 * here a wake-up is one C call for every relay that is ready.
 *
 * Only the pumping is here. The policy stays in Python (router/tcp/native_relay.py): the idle
 * timer, when a quiet pipe is given back, who ended the connection (termination causes from the
 * errno, the failing direction and the TCP states), when to close the sockets, the metrics.
 * Python is called back only when a relay ends
 * (on_end(relay, errno or 0, failing direction, first end of stream)),
 * has carried report_bytes more (on_bytes) or takes a pipe (on_acquired). A dispatch tells the ends
 * it found only once it has pumped every ready relay (see end()).
 *
 * Beside the pump, for router/tcp/fast_path.py: accept() and dial(), the edge's accept4(2) and
 * connect(2) handing over bare fds, without the Python socket objects whose constructor asks
 * getsockname(2) and whose mode needs an ioctl(2).
 *
 * A relay may start while the pod's connect(2) is still in progress (the fast path's dial,
 * router/tcp/fast_path.py): then only the pod's EPOLLOUT is watched and the peeked bytes wait in
 * the client->pod buffer; SO_ERROR says how the connect ended: on_connected, or on_end with the
 * direction CONNECT (the client's socket is then left to Python, which answers it).
 *
 * The pump, per direction, as in pump.py: write what is pending, then read more, up to `rounds`
 * rounds per wake-up; copy through the engine's one scratch buffer (a sink that cannot take it
 * all keeps only the rest), switch to splice(2) through a pipe of its own once the direction has
 * carried splice_after bytes; half-close the sink at the source's end. Level-triggered epoll,
 * an fd is watched only while one of its directions waits for it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "structmember.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { NONE = 0, READ = 1, WRITE = 2 };
enum { CLIENT_TO_POD = 0, POD_TO_CLIENT = 1, CONNECT = 2 }; /* directions, and the dial's failure */
enum { FIRST_EOF_NONE = -1 };

typedef struct {
    int src, dst;
    int want, done;
    int splice, to_splice;
    int pipe_r, pipe_w;
    Py_ssize_t pipe_cap;
    char *out; /* buffered mode: the bytes the sink could not take yet */
    Py_ssize_t out_off;
    Py_ssize_t pending; /* bytes read but not written (in the pipe or out) */
    unsigned long long sent, reported;
    double last; /* CLOCK_MONOTONIC seconds of the last pump (loop.time()'s clock) */
} Way;

typedef struct EngineObject EngineObject;

typedef struct {
    PyObject_HEAD
    EngineObject *engine;
    int cfd, pfd;
    uint32_t cmask, pmask; /* what epoll watches now on each fd */
    int over;
    int first_eof;          /* FIRST_EOF_NONE, CLIENT_TO_POD (client's FIN) or POD_TO_CLIENT */
    int connecting;         /* the pod's connect(2) is in progress: only its EPOLLOUT is watched */
    int end_error, end_way; /* an end held until its dispatch has pumped every ready relay */
    Way w[2];
    PyObject *on_end, *on_bytes, *on_acquired, *on_connected;
} RelayObject;

struct EngineObject {
    PyObject_HEAD
    int epfd;
    char *scratch;
    struct epoll_event *events; /* one dispatch's events: at most `batch` */
    int batch;
    Py_ssize_t chunk, splice_after, pipe_bytes;
    unsigned long long report_bytes;
    int rounds;
    int dispatching;
    RelayObject **graveyard; /* relays ended during a dispatch: released after it */
    Py_ssize_t dead, dead_cap;
    RelayObject **ending; /* relays ended during a dispatch: their on_end called after its pumping */
    Py_ssize_t ended, ending_cap;
    Py_ssize_t live;
    Py_ssize_t watched; /* fds in the epoll set (tests: nothing outlives its relay) */
};

static PyTypeObject RelayType;
static PyTypeObject EngineType;

static double
monotonic_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* -- epoll watches ------------------------------------------------------------------------ */
/* 0, or -errno when the fd cannot be watched (then nothing would ever wake the relay) */
static int
watch(RelayObject *r, int fd, uint32_t *current, uint32_t mask, uintptr_t side)
{
    if (mask == *current)
        return 0;
    struct epoll_event ev = { .events = mask, .data.u64 = (uint64_t)((uintptr_t)r | side) };
    int epfd = r->engine->epfd, status = 0;
    if (mask == 0) {
        epoll_ctl(epfd, EPOLL_CTL_DEL, fd, &ev); /* ENOENT/EBADF: nothing to stop watching */
        r->engine->watched--;
    } else if (*current == 0) {
        status = epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
        if (status < 0 && errno == EEXIST)
            status = epoll_ctl(epfd, EPOLL_CTL_MOD, fd, &ev);
        if (status == 0)
            r->engine->watched++;
    } else {
        status = epoll_ctl(epfd, EPOLL_CTL_MOD, fd, &ev);
        if (status < 0 && errno == ENOENT)
            status = epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
    }
    if (status < 0)
        return -errno;
    *current = mask;
    return 0;
}

static int
update_watches(RelayObject *r)
{
    Way *up = &r->w[CLIENT_TO_POD], *down = &r->w[POD_TO_CLIENT];
    uint32_t client = (up->want == READ ? EPOLLIN : 0) | (down->want == WRITE ? EPOLLOUT : 0);
    uint32_t pod = (down->want == READ ? EPOLLIN : 0) | (up->want == WRITE ? EPOLLOUT : 0);
    if (r->connecting) {
        client = 0;
        pod = EPOLLOUT;
    }
    int status = watch(r, r->cfd, &r->cmask, client, 0);
    return status < 0 ? status : watch(r, r->pfd, &r->pmask, pod, 1);
}

static void end(RelayObject *r, int error, int way);
static void run_way(RelayObject *r, int way, double now);

/* Watch what the directions wait for; a socket that cannot be watched ends the relay. */
static void
rewatch(RelayObject *r, int way)
{
    int status = update_watches(r);
    if (status < 0)
        end(r, -status, way);
}

/* -- Python callbacks ------------------------------------------------------------------------ */
static void
call_or_report(PyObject *callable, PyObject *result)
{
    if (result == NULL)
        PyErr_WriteUnraisable(callable);
    else
        Py_DECREF(result);
}

/* callback(a, b), or callback() without `counts`, if there is one. Held for the call: the callback
 * may end the relay, which drops the relay's own reference to it. After it, the caller looks at
 * r->over before it touches the relay's fds again: an ended relay's fds may be another
 * connection's by then. */
static void
call_back(PyObject *callback, const unsigned long long *counts)
{
    if (callback == NULL || callback == Py_None)
        return;
    Py_INCREF(callback);
    PyObject *result =
        counts ? PyObject_CallFunction(callback, "KK", counts[0], counts[1]) : PyObject_CallNoArgs(callback);
    call_or_report(callback, result);
    Py_DECREF(callback);
}

static void
report(RelayObject *r)
{
    Way *up = &r->w[CLIENT_TO_POD], *down = &r->w[POD_TO_CLIENT];
    unsigned long long counts[2] = { up->sent - up->reported, down->sent - down->reported };
    up->reported = up->sent;
    down->reported = down->sent;
    if (counts[0] || counts[1])
        call_back(r->on_bytes, counts);
}

static void
count(RelayObject *r, Way *w, Py_ssize_t n)
{
    w->sent += (unsigned long long)n;
    if (w->sent - w->reported >= r->engine->report_bytes)
        report(r); /* on_bytes may end the relay: the caller looks at r->over next */
}

/* -- pipes and buffers ---------------------------------------------------------------------- */
static void
release(Way *w)
{
    if (w->pipe_r >= 0) {
        close(w->pipe_r);
        close(w->pipe_w);
        w->pipe_r = w->pipe_w = -1;
        w->pipe_cap = 0;
    }
    PyMem_Free(w->out);
    w->out = NULL;
    w->out_off = 0;
}

/* 1: a pipe; 0: no fds or memory for one (copy instead, for good); -errno: failure */
static int
open_pipe(RelayObject *r, Way *w)
{
    int fds[2];
    if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOMEM) {
            w->splice = w->to_splice = 0;
            return 0;
        }
        return -errno;
    }
    w->pipe_r = fds[0];
    w->pipe_w = fds[1];
    fcntl(w->pipe_w, F_SETPIPE_SZ, (int)r->engine->pipe_bytes); /* EPERM: over the soft limit, default size */
    int cap = fcntl(w->pipe_w, F_GETPIPE_SZ);
    w->pipe_cap = cap > 0 ? cap : 65536;
    call_back(r->on_acquired, NULL); /* may end the relay: the caller looks at r->over next */
    return 1;
}

/* -- the pump ------------------------------------------------------------------------------- */
/* 1: all pending bytes are out; 0: the sink is full (waiting for it); -errno: failure */
static int
flush(RelayObject *r, Way *w)
{
    ssize_t n;
    if (w->splice)
        n = splice(w->pipe_r, NULL, w->dst, NULL, (size_t)w->pending, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
    else
        n = send(w->dst, w->out + w->out_off, (size_t)w->pending, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) {
            w->want = WRITE;
            return 0;
        }
        return -errno;
    }
    w->pending -= n;
    count(r, w, n);
    if (r->over)
        return 0; /* on_bytes ended the relay: its fds may be another connection's already */
    if (w->pending) {
        if (!w->splice)
            w->out_off += n;
        w->want = WRITE;
        return 0;
    }
    if (!w->splice) {
        PyMem_Free(w->out);
        w->out = NULL;
        w->out_off = 0;
    }
    return 1;
}

static int
end_of_stream(RelayObject *r, Way *w)
{
    Way *other = w == &r->w[0] ? &r->w[1] : &r->w[0];
    w->want = NONE;
    w->done = 1;
    release(w);
    if (r->first_eof == FIRST_EOF_NONE)
        r->first_eof = w == &r->w[0] ? CLIENT_TO_POD : POD_TO_CLIENT;
    /* both done: Python closes both sockets, which sends the FIN */
    if (!other->done && shutdown(w->dst, SHUT_WR) < 0)
        return -errno;
    return 0;
}

/* After a read of the source: 1 with bytes to pass on, else what the pump returns (0: waiting
 * for the source, or its end of stream handled; -errno: a failure). */
static int
after_read(RelayObject *r, Way *w, ssize_t n)
{
    if (n > 0)
        return 1;
    if (n == 0)
        return end_of_stream(r, w); /* 0 or -errno, never 1 */
    if (errno == EAGAIN || errno == EINTR) {
        w->want = READ;
        return 0;
    }
    return -errno;
}

static int pump_buffered(RelayObject *r, Way *w);

static int
pump_splice(RelayObject *r, Way *w)
{
    int drained = 0; /* the last read was short: the source is empty for now */
    for (int round = 0; round < r->engine->rounds && !r->over; round++) {
        if (w->pending) {
            int f = flush(r, w);
            if (f <= 0)
                return f;
        }
        if (drained)
            break;
        if (w->pipe_w < 0) {
            int p = open_pipe(r, w);
            if (p < 0)
                return p;
            if (p == 0)
                return pump_buffered(r, w);
            if (r->over)
                return 0; /* on_acquired ended the relay */
        }
        ssize_t n = splice(w->src, NULL, w->pipe_w, NULL, (size_t)w->pipe_cap, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        int got = after_read(r, w, n);
        if (got <= 0)
            return got;
        w->pending = n;
        drained = n < w->pipe_cap;
    }
    if (!r->over)
        w->want = w->pending ? WRITE : READ;
    return 0;
}

static int
pump_buffered(RelayObject *r, Way *w)
{
    EngineObject *e = r->engine;
    for (int round = 0; round < e->rounds && !r->over; round++) { /* over: a callback ended it */
        if (w->pending) {
            int f = flush(r, w);
            if (f <= 0)
                return f;
        }
        if (w->to_splice && w->sent >= (unsigned long long)e->splice_after) {
            w->splice = 1;
            release(w);
            return pump_splice(r, w);
        }
        ssize_t n = recv(w->src, e->scratch, (size_t)e->chunk, MSG_DONTWAIT);
        int got = after_read(r, w, n);
        if (got <= 0)
            return got;
        /* The scratch buffer is every relay's: write it out now, keep only what the sink refused. */
        ssize_t s = send(w->dst, e->scratch, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (s < 0) {
            if (errno != EAGAIN && errno != EINTR)
                return -errno;
            s = 0;
        }
        count(r, w, s);
        if (r->over)
            return 0; /* on_bytes ended the relay */
        if (s < n) {
            w->out = PyMem_Malloc((size_t)(n - s));
            if (w->out == NULL)
                return -ENOMEM;
            memcpy(w->out, e->scratch + s, (size_t)(n - s));
            w->out_off = 0;
            w->pending = n - s;
            w->want = WRITE;
            return 0;
        }
        if (n < e->chunk)
            break; /* a short read drained the source: wait for more rather than read EAGAIN */
    }
    if (!r->over)
        w->want = w->pending ? WRITE : READ;
    return 0;
}

static int
pump(RelayObject *r, Way *w, double now)
{
    w->last = now;
    return w->splice ? pump_splice(r, w) : pump_buffered(r, w);
}

/* -- the end ---------------------------------------------------------------------------------- */
static void
bury(RelayObject *r)
{
    EngineObject *e = r->engine;
    e->live--;
    if (!e->dispatching) {
        Py_DECREF(r);
        return;
    }
    if (e->dead == e->dead_cap) {
        Py_ssize_t cap = e->dead_cap ? e->dead_cap * 2 : 64;
        RelayObject **grown = PyMem_Realloc(e->graveyard, (size_t)cap * sizeof *grown);
        if (grown == NULL) {
            /* cannot defer: leak this one reference rather than free what the batch may name */
            return;
        }
        e->graveyard = grown;
        e->dead_cap = cap;
    }
    e->graveyard[e->dead++] = r;
}

/* Give back pipes and buffers, report the last bytes; the fds stay in the epoll set (unwatch). */
static void
stop(RelayObject *r)
{
    r->over = 1;
    r->w[0].want = r->w[1].want = NONE;
    r->w[0].pending = r->w[1].pending = 0;
    release(&r->w[0]);
    release(&r->w[1]);
    report(r);
}

static void
unwatch(RelayObject *r)
{
    if (r->cfd >= 0)
        watch(r, r->cfd, &r->cmask, 0, 0);
    if (r->pfd >= 0)
        watch(r, r->pfd, &r->pmask, 0, 1);
}

static void
drop_callbacks(RelayObject *r)
{
    Py_CLEAR(r->on_end);
    Py_CLEAR(r->on_bytes);
    Py_CLEAR(r->on_acquired);
    Py_CLEAR(r->on_connected);
}

/* The end's Python side: on_end, then the fds out of the epoll set unless on_end closed them. */
static void
finish_end(RelayObject *r, int error, int way)
{
    PyObject *on_end = r->on_end;
    r->on_end = NULL;
    if (on_end != NULL) {
        call_or_report(on_end, PyObject_CallFunction(on_end, "Oiii", (PyObject *)r, error, way, r->first_eof));
        Py_DECREF(on_end);
    }
    unwatch(r);
    drop_callbacks(r);
    bury(r);
}

/* error: 0 when both directions ended, else the errno of direction `way`'s failure. During a
 * dispatch, on_end waits until every ready relay has been pumped: the accounting of the relays
 * that end (tens of microseconds of Python each) does not delay the bytes of the others. */
static void
end(RelayObject *r, int error, int way)
{
    if (r->over)
        return;
    stop(r);
    /* A failure's on_end may close one fd itself (a dial's failure keeps the client's to answer):
     * out of the set first. A clean end's on_end closes both through close_fds, which takes them
     * out of the set itself: nothing is left to unwatch after it then. */
    if (error)
        unwatch(r);
    EngineObject *e = r->engine;
    if (e->dispatching) {
        if (e->ended == e->ending_cap) {
            Py_ssize_t cap = e->ending_cap ? e->ending_cap * 2 : 64;
            RelayObject **grown = PyMem_Realloc(e->ending, (size_t)cap * sizeof *grown);
            if (grown == NULL) {
                finish_end(r, error, way); /* no room to hold it: ended now */
                return;
            }
            e->ending = grown;
            e->ending_cap = cap;
        }
        r->end_error = error;
        r->end_way = way;
        e->ending[e->ended++] = r;
        return;
    }
    finish_end(r, error, way);
}

/* The pod's connect finished: a failure ends the relay (way CONNECT), else both ways start. */
static void
connected(RelayObject *r, double now)
{
    int error = 0;
    socklen_t size = sizeof error;
    if (getsockopt(r->pfd, SOL_SOCKET, SO_ERROR, &error, &size) < 0)
        error = errno;
    if (error) {
        end(r, error, CONNECT);
        return;
    }
    r->connecting = 0;
    r->w[0].last = r->w[1].last = now;
    call_back(r->on_connected, NULL);
    if (r->over)
        return; /* on_connected aborted it */
    r->w[POD_TO_CLIENT].want = READ;
    r->w[CLIENT_TO_POD].want = READ;
    if (r->w[CLIENT_TO_POD].pending)
        run_way(r, CLIENT_TO_POD, now); /* the peeked bytes, held while connecting */
}

static void
run_way(RelayObject *r, int way, double now)
{
    int status = pump(r, &r->w[way], now);
    if (status < 0)
        end(r, -status, way);
    else if (r->w[0].done && r->w[1].done)
        end(r, 0, way);
}

/* -- Engine ------------------------------------------------------------------------------- */
static PyObject *
engine_dispatch(EngineObject *e, PyObject *Py_UNUSED(ignored))
{
    if (e->dispatching || e->epfd < 0) /* called back into from a callback, or closed: not now */
        Py_RETURN_NONE;
    struct epoll_event *events = e->events;
    int n = epoll_wait(e->epfd, events, e->batch, 0); /* more stay pending (level-triggered) */
    if (n <= 0)
        Py_RETURN_NONE;
    double now = monotonic_now();
    e->dispatching++;
    for (int i = 0; i < n; i++) {
        uint64_t tag = events[i].data.u64;
        RelayObject *r = (RelayObject *)(uintptr_t)(tag & ~(uint64_t)1);
        uint32_t ev = events[i].events;
        int pod_side = (int)(tag & 1);
        /* the client's fd feeds client->pod and drains pod->client; the pod's, the other way */
        int reads = pod_side ? POD_TO_CLIENT : CLIENT_TO_POD;
        int writes = pod_side ? CLIENT_TO_POD : POD_TO_CLIENT;
        if (r->connecting) {
            if (pod_side && !r->over)
                connected(r, now);
            if (!r->over)
                rewatch(r, CLIENT_TO_POD);
            continue;
        }
        if (!r->over && (ev & (EPOLLIN | EPOLLERR | EPOLLHUP)) && r->w[reads].want == READ)
            run_way(r, reads, now);
        if (!r->over && (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP)) && r->w[writes].want == WRITE)
            run_way(r, writes, now);
        if (!r->over)
            rewatch(r, reads);
    }
    for (Py_ssize_t i = 0; i < e->ended; i++) { /* an end queued meanwhile is taken in its turn */
        RelayObject *r = e->ending[i];
        finish_end(r, r->end_error, r->end_way);
    }
    e->ended = 0;
    e->dispatching--;
    for (Py_ssize_t i = 0; i < e->dead; i++)
        Py_DECREF(e->graveyard[i]);
    e->dead = 0;
    Py_RETURN_NONE;
}

static void
init_way(Way *w, int src, int dst, int to_splice, int splice_now, double now)
{
    w->src = src;
    w->dst = dst;
    w->want = NONE;
    w->done = 0;
    w->to_splice = to_splice;
    w->splice = to_splice && splice_now; /* else copies its first splice_after bytes */
    w->pipe_r = w->pipe_w = -1;
    w->last = now;
}

static int
callable_or_none(PyObject *callback)
{
    return callback == Py_None || PyCallable_Check(callback);
}

static PyObject *
engine_start(EngineObject *e, PyObject *args)
{
    int cfd, pfd, to_splice, connecting;
    Py_buffer initial;
    PyObject *on_end, *on_bytes, *on_acquired, *on_connected;
    if (!PyArg_ParseTuple(args, "iiy*ppOOOO", &cfd, &pfd, &initial, &to_splice, &connecting, &on_end, &on_bytes,
                          &on_acquired, &on_connected))
        return NULL;
    const char *refused = NULL;
    if (e->epfd < 0)
        refused = "the relay engine is closed";
    else if (cfd < 0 || pfd < 0 || cfd == pfd)
        refused = "a relay's client and pod fds are two different fds, neither negative";
    else if (!PyCallable_Check(on_end) || !callable_or_none(on_bytes) || !callable_or_none(on_acquired) ||
             !callable_or_none(on_connected))
        refused = "on_end is callable; on_bytes, on_acquired and on_connected callable or None";
    if (refused != NULL) {
        PyBuffer_Release(&initial);
        PyErr_SetString(PyExc_ValueError, refused);
        return NULL;
    }
    RelayObject *r = PyObject_GC_New(RelayObject, &RelayType);
    if (r == NULL) {
        PyBuffer_Release(&initial);
        return NULL;
    }
    double now = monotonic_now();
    r->engine = (EngineObject *)Py_NewRef((PyObject *)e);
    r->cfd = cfd;
    r->pfd = pfd;
    r->cmask = r->pmask = 0;
    r->over = 0;
    r->first_eof = FIRST_EOF_NONE;
    memset(r->w, 0, sizeof r->w);
    /* the peeked bytes go out through the buffer: client->pod splices only after them */
    init_way(&r->w[CLIENT_TO_POD], cfd, pfd, to_splice, e->splice_after == 0 && initial.len == 0, now);
    init_way(&r->w[POD_TO_CLIENT], pfd, cfd, to_splice, e->splice_after == 0, now);
    r->on_end = Py_NewRef(on_end);
    r->on_bytes = Py_NewRef(on_bytes);
    r->on_acquired = Py_NewRef(on_acquired);
    r->on_connected = Py_NewRef(on_connected);
    r->connecting = connecting;
    PyObject_GC_Track((PyObject *)r);
    /* the engine's reference while the relay runs (epoll names it): given up by end() or abort() */
    Py_INCREF(r);
    e->live++;

    Way *up = &r->w[CLIENT_TO_POD];
    int status = 0;
    if (initial.len > 0) {
        /* the peeked bytes: usually written at once, no epoll round */
        up->out = PyMem_Malloc((size_t)initial.len);
        if (up->out == NULL) {
            status = -ENOMEM;
        } else {
            memcpy(up->out, initial.buf, (size_t)initial.len);
            up->pending = initial.len;
            if (!connecting) {
                int f = flush(r, up);
                if (f < 0)
                    status = f;
                else if (f == 1)
                    up->want = READ;
            }
        }
    } else if (!connecting) {
        up->want = READ;
    }
    PyBuffer_Release(&initial);
    if (r->over)
        return (PyObject *)r; /* on_bytes ended it during the first flush */
    if (status < 0) {
        end(r, -status, CLIENT_TO_POD);
    } else {
        if (!connecting)
            r->w[POD_TO_CLIENT].want = READ;
        rewatch(r, POD_TO_CLIENT);
    }
    return (PyObject *)r;
}

static PyObject *
engine_fileno(EngineObject *e, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLong(e->epfd);
}

static PyObject *
engine_close(EngineObject *e, PyObject *Py_UNUSED(ignored))
{
    if (e->epfd >= 0) {
        close(e->epfd);
        e->epfd = -1;
    }
    Py_RETURN_NONE;
}

static PyObject *
engine_live(EngineObject *e, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(e->live);
}

static PyObject *
engine_watched(EngineObject *e, void *Py_UNUSED(closure))
{
    return PyLong_FromSsize_t(e->watched);
}

static int
engine_init(EngineObject *e, PyObject *args, PyObject *kwds)
{
    static char *names[] = { "chunk_bytes", "splice_after_bytes",  "pipe_bytes", "report_bytes",
                             "rounds",      "events_per_dispatch", NULL };
    Py_ssize_t chunk, splice_after, pipe_bytes;
    long long report_bytes;
    int rounds, batch;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "$nnnLii", names, &chunk, &splice_after, &pipe_bytes, &report_bytes,
                                     &rounds, &batch))
        return -1;
    /* a read or a pipe's size is an int to the kernel (F_SETPIPE_SZ) */
    if (chunk <= 0 || chunk > INT_MAX || splice_after < 0 || pipe_bytes <= 0 || pipe_bytes > INT_MAX ||
        report_bytes <= 0 || rounds <= 0 || batch <= 0) {
        PyErr_SetString(PyExc_ValueError,
                        "relay engine sizes must be positive (splice_after_bytes: >= 0; chunk and pipe bytes: an int)");
        return -1;
    }
    if (e->epfd >= 0 || e->scratch != NULL || e->events != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the relay engine is initialised once");
        return -1;
    }
    e->scratch = PyMem_Malloc((size_t)chunk);
    e->events = PyMem_Calloc((size_t)batch, sizeof *e->events);
    if (e->scratch == NULL || e->events == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    e->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (e->epfd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    e->chunk = chunk;
    e->splice_after = splice_after;
    e->pipe_bytes = pipe_bytes;
    e->report_bytes = (unsigned long long)report_bytes;
    e->rounds = rounds;
    e->batch = batch;
    return 0;
}

static PyObject *
engine_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    EngineObject *e = (EngineObject *)type->tp_alloc(type, 0);
    if (e != NULL)
        e->epfd = -1;
    return (PyObject *)e;
}

static void
engine_dealloc(EngineObject *e)
{
    if (e->epfd >= 0)
        close(e->epfd);
    PyMem_Free(e->scratch);
    PyMem_Free(e->events);
    PyMem_Free(e->graveyard);
    PyMem_Free(e->ending);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static PyMethodDef engine_methods[] = {
    { "start", (PyCFunction)engine_start, METH_VARARGS,
      "start(client_fd, pod_fd, initial, splice, connecting, on_end, on_bytes, on_acquired, on_connected) -> Relay" },
    { "dispatch", (PyCFunction)engine_dispatch, METH_NOARGS, "pump every relay that is ready" },
    { "fileno", (PyCFunction)engine_fileno, METH_NOARGS, "the epoll fd the event loop watches" },
    { "close", (PyCFunction)engine_close, METH_NOARGS, "close the epoll fd" },
    { NULL, NULL, 0, NULL },
};

static PyGetSetDef engine_getset[] = {
    { "live", (getter)engine_live, NULL, "relays running on this engine", NULL },
    { "watched", (getter)engine_watched, NULL, "fds in the engine's epoll set", NULL },
    { NULL, NULL, NULL, NULL, NULL },
};

static PyTypeObject EngineType = {
    .ob_base = { PyObject_HEAD_INIT(NULL) 0 },
    .tp_name = "router.tcp._relay.Engine",
    .tp_basicsize = sizeof(EngineObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One epoll set of relays per event loop, pumped in C.",
    .tp_new = engine_new,
    .tp_init = (initproc)engine_init,
    .tp_dealloc = (destructor)engine_dealloc,
    .tp_methods = engine_methods,
    .tp_getset = engine_getset,
};

/* -- the dial -------------------------------------------------------------------------------- */
/* tcpi_state values (linux/tcp_states.h): connected, and refused already (a loopback RST) */
enum { STATE_ESTABLISHED = 1, STATE_CLOSE = 7 };

/* dial(address, port) -> (fd, connected): a non-blocking, close-on-exec, TCP_NODELAY socket
 * connecting to an IPv4 or IPv6 literal; connected when the handshake is done already (a loopback
 * or same-host pod usually is: one TCP_INFO read, as router/tcp/dial.py does). OSError when the
 * connect failed at once or was refused by then (the socket closed); ValueError when `address`
 * is no IP literal. The caller owns the fd. Why in C: the same four system calls without a Python
 * socket object, its address tuple and its close (~3-4 us of interpreter time per connection). */
static PyObject *
module_dial(PyObject *Py_UNUSED(module), PyObject *args)
{
    const char *address;
    int port;
    if (!PyArg_ParseTuple(args, "si", &address, &port))
        return NULL;
    if (port < 0 || port > 65535) {
        PyErr_SetString(PyExc_ValueError, "port out of range");
        return NULL;
    }
    struct sockaddr_storage to;
    socklen_t to_len;
    memset(&to, 0, sizeof to);
    struct sockaddr_in *v4 = (struct sockaddr_in *)&to;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&to;
    if (inet_pton(AF_INET, address, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
        to_len = sizeof *v4;
    } else if (inet_pton(AF_INET6, address, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        to_len = sizeof *v6;
    } else {
        PyErr_SetString(PyExc_ValueError, "not an IP address literal");
        return NULL;
    }
    int fd = socket(to.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    int one = 1, connected = 0;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) < 0)
        goto failed;
    if (connect(fd, (struct sockaddr *)&to, to_len) == 0) {
        connected = 1;
    } else if (errno == EINPROGRESS || errno == EAGAIN || errno == EINTR) { /* EINTR: it goes on */
        unsigned char state = 0;
        socklen_t size = sizeof state; /* the kernel copies TCP_INFO's first byte only */
        if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &state, &size) == 0 && size >= 1) {
            connected = state == STATE_ESTABLISHED;
            int error = 0;
            socklen_t error_size = sizeof error;
            if (state == STATE_CLOSE && getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &error_size) == 0 && error) {
                errno = error; /* refused by the time connect() returned: said now, not after a wait */
                goto failed;
            }
        }
    } else {
        goto failed;
    }
    PyObject *result = Py_BuildValue("(iO)", fd, connected ? Py_True : Py_False);
    if (result == NULL)
        close(fd); /* not handed over: not leaked either */
    return result;
failed : {
    int error = errno;
    close(fd);
    errno = error;
    return PyErr_SetFromErrno(PyExc_OSError);
}
}

/* -- the accept ------------------------------------------------------------------------------ */
/* accept(listen_fd, max) -> ([(fd, host, port), ...], errno): up to `max` connections, each a
 * non-blocking, close-on-exec fd (accept4 flags: no ioctl after, and no socket object, whose
 * constructor asks getsockname) with its peer's address as text. errno is 0 once the queue is
 * empty, else what stopped the batch (EMFILE...: the caller pauses); a connection the client gave
 * up while queued (ECONNABORTED) is skipped. The caller owns the fds. */
static PyObject *
module_accept(PyObject *Py_UNUSED(module), PyObject *args)
{
    int listener, most;
    if (!PyArg_ParseTuple(args, "ii", &listener, &most))
        return NULL;
    if (most < 0) { /* the listener is the kernel's to judge: a bad one is the EBADF returned */
        PyErr_SetString(PyExc_ValueError, "accept's batch is not negative");
        return NULL;
    }
    PyObject *accepted = PyList_New(0);
    if (accepted == NULL)
        return NULL;
    int error = 0;
    for (int i = 0; i < most; i++) {
        struct sockaddr_storage from;
        socklen_t from_len = sizeof from;
        int fd = accept4(listener, (struct sockaddr *)&from, &from_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == ECONNABORTED || errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                error = errno;
            break;
        }
        char host[INET6_ADDRSTRLEN] = "";
        int port = 0;
        if (from.ss_family == AF_INET) {
            struct sockaddr_in *v4 = (struct sockaddr_in *)&from;
            inet_ntop(AF_INET, &v4->sin_addr, host, sizeof host);
            port = ntohs(v4->sin_port);
        } else if (from.ss_family == AF_INET6) {
            struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&from;
            inet_ntop(AF_INET6, &v6->sin6_addr, host, sizeof host);
            port = ntohs(v6->sin6_port);
        }
        PyObject *item = Py_BuildValue("(isi)", fd, host, port);
        if (item == NULL || PyList_Append(accepted, item) < 0) {
            Py_XDECREF(item);
            close(fd);
            Py_ssize_t n = PyList_GET_SIZE(accepted); /* the fds handed over so far: not leaked either */
            for (Py_ssize_t j = 0; j < n; j++)
                close((int)PyLong_AsLong(PyTuple_GET_ITEM(PyList_GET_ITEM(accepted, j), 0)));
            Py_DECREF(accepted);
            return NULL;
        }
        Py_DECREF(item);
    }
    PyObject *result = Py_BuildValue("(Oi)", accepted, error);
    Py_DECREF(accepted);
    return result;
}

/* -- Relay ---------------------------------------------------------------------------------- */
static PyObject *
relay_abort(RelayObject *r, PyObject *Py_UNUSED(ignored))
{
    if (!r->over) {
        stop(r);
        unwatch(r);
        drop_callbacks(r);
        bury(r);
    }
    Py_RETURN_NONE;
}

/* close_fds(reset): stop (as abort) and close both fds, which the caller gives up (a socket object
 * detached first). A watched fd leaves the epoll set first: close() drops a registration only with
 * the last fd of its file, and a dup (or a forked child) keeps the file open, with the
 * registration naming this relay after it is freed. reset: RST, not FIN. In on_end too: end()
 * then leaves the closed fds alone. */
static PyObject *
relay_close_fds(RelayObject *r, PyObject *arg)
{
    int reset = PyObject_IsTrue(arg);
    if (reset < 0)
        return NULL;
    int was_over = r->over;
    if (!was_over)
        stop(r);
    struct linger now = { .l_onoff = 1, .l_linger = 0 };
    int fds[2] = { r->cfd, r->pfd };
    for (int i = 0; i < 2; i++) {
        if (fds[i] < 0)
            continue;
        if (reset)
            setsockopt(fds[i], SOL_SOCKET, SO_LINGER, &now, sizeof now); /* failing: a FIN instead */
        if ((i == 0 ? r->cmask : r->pmask) != 0) {
            epoll_ctl(r->engine->epfd, EPOLL_CTL_DEL, fds[i], NULL); /* EBADF: the engine is closed */
            r->engine->watched--;
        }
        close(fds[i]);
    }
    r->cfd = r->pfd = -1;
    r->cmask = r->pmask = 0;
    if (!was_over) {
        drop_callbacks(r);
        bury(r);
    }
    Py_RETURN_NONE;
}

static PyObject *
relay_probe(RelayObject *r, PyObject *Py_UNUSED(ignored))
{
    double last = r->w[0].last > r->w[1].last ? r->w[0].last : r->w[1].last;
    return Py_BuildValue("KKd", r->w[0].sent, r->w[1].sent, last);
}

static PyObject *
relay_next_release(RelayObject *r, PyObject *arg)
{
    double quiet = PyFloat_AsDouble(arg);
    if (quiet == -1.0 && PyErr_Occurred())
        return NULL;
    double at = INFINITY;
    for (int i = 0; i < 2; i++) {
        Way *w = &r->w[i];
        if (w->pipe_cap && !w->pending && w->last + quiet < at)
            at = w->last + quiet;
    }
    return PyFloat_FromDouble(at);
}

static PyObject *
relay_release_quiet(RelayObject *r, PyObject *args)
{
    double now, quiet;
    if (!PyArg_ParseTuple(args, "dd", &now, &quiet))
        return NULL;
    for (int i = 0; i < 2; i++) {
        Way *w = &r->w[i];
        if (w->pipe_cap && !w->pending && now - w->last >= quiet)
            release(w);
    }
    Py_RETURN_NONE;
}

static PyObject *
relay_state(RelayObject *r, PyObject *Py_UNUSED(ignored))
{
    Way *up = &r->w[0], *down = &r->w[1];
    Py_ssize_t held =
        up->pipe_cap + down->pipe_cap + (up->splice ? 0 : up->pending) + (down->splice ? 0 : down->pending);
    return Py_BuildValue("ssnnnKK", up->splice ? "splice" : "buffered", down->splice ? "splice" : "buffered",
                         up->pending, down->pending, held, up->sent, down->sent);
}

static PyObject *
relay_done(RelayObject *r, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("(OO)", r->w[0].done ? Py_True : Py_False, r->w[1].done ? Py_True : Py_False);
}

static PyObject *
relay_is_connecting(RelayObject *r, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(r->connecting && !r->over);
}

static int
relay_traverse(RelayObject *r, visitproc visit, void *arg)
{
    Py_VISIT(r->on_end);
    Py_VISIT(r->on_bytes);
    Py_VISIT(r->on_acquired);
    Py_VISIT(r->on_connected);
    return 0;
}

static int
relay_clear(RelayObject *r)
{
    drop_callbacks(r);
    return 0;
}

static void
relay_dealloc(RelayObject *r)
{
    PyObject_GC_UnTrack((PyObject *)r);
    /* a running relay is referenced by its engine, so here it is over: its buffers are gone */
    release(&r->w[0]);
    release(&r->w[1]);
    drop_callbacks(r);
    Py_CLEAR(r->engine);
    PyObject_GC_Del(r);
}

static PyMethodDef relay_methods[] = {
    { "abort", (PyCFunction)relay_abort, METH_NOARGS, "stop at once, without on_end (the caller ends it)" },
    { "close_fds", (PyCFunction)relay_close_fds, METH_O, "abort, and close both fds (no epoll_ctl): RST if reset" },
    { "probe", (PyCFunction)relay_probe, METH_NOARGS, "(client->pod bytes, pod->client bytes, last activity)" },
    { "next_release", (PyCFunction)relay_next_release, METH_O, "when a held pipe will have been quiet long enough" },
    { "release_quiet", (PyCFunction)relay_release_quiet, METH_VARARGS, "give back the pipes quiet since now - quiet" },
    { "state", (PyCFunction)relay_state, METH_NOARGS, "modes, pending bytes, held bytes, sent bytes" },
    { "done", (PyCFunction)relay_done, METH_NOARGS, "(client->pod ended, pod->client ended)" },
    { "is_connecting", (PyCFunction)relay_is_connecting, METH_NOARGS, "the pod's connect is still in progress" },
    { NULL, NULL, 0, NULL },
};

static PyTypeObject RelayType = {
    .ob_base = { PyObject_HEAD_INIT(NULL) 0 },
    .tp_name = "router.tcp._relay.Relay",
    .tp_basicsize = sizeof(RelayObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One relayed connection (made by Engine.start).",
    .tp_traverse = (traverseproc)relay_traverse,
    .tp_clear = (inquiry)relay_clear,
    .tp_dealloc = (destructor)relay_dealloc,
    .tp_methods = relay_methods,
};

static PyMethodDef module_methods[] = {
    { "dial", module_dial, METH_VARARGS, "dial(address, port) -> (fd, connected): a non-blocking connect" },
    { "accept", module_accept, METH_VARARGS, "accept(listen_fd, max) -> ([(fd, host, port)...], errno)" },
    { NULL, NULL, 0, NULL },
};

static struct PyModuleDef relay_module = {
    PyModuleDef_HEAD_INIT, "router.tcp._relay", "The TCP relay's byte pump in C (see _relay.c).", -1, module_methods,
};

PyMODINIT_FUNC
PyInit__relay(void)
{
    if (PyType_Ready(&EngineType) < 0 || PyType_Ready(&RelayType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&relay_module);
    if (m == NULL)
        return NULL;
    PyObject *attributes = PyTuple_New(0); /* none: Python is reached through the callbacks only */
    if (attributes == NULL || PyModule_AddObjectRef(m, "ATTRIBUTES", attributes) < 0 ||
        PyModule_AddObjectRef(m, "Engine", (PyObject *)&EngineType) < 0 ||
        PyModule_AddObjectRef(m, "Relay", (PyObject *)&RelayType) < 0 ||
        PyModule_AddIntConstant(m, "CLIENT_TO_POD", CLIENT_TO_POD) < 0 ||
        PyModule_AddIntConstant(m, "POD_TO_CLIENT", POD_TO_CLIENT) < 0 ||
        PyModule_AddIntConstant(m, "CONNECT", CONNECT) < 0) {
        Py_XDECREF(attributes);
        Py_DECREF(m);
        return NULL;
    }
    Py_DECREF(attributes);
    return m;
}
