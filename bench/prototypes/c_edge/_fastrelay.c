/* A MEASUREMENT PROTOTYPE, not part of the router (see README.md beside it).
 *
 * How much CPU per new TCP connection a TCP edge in C would save, measured before building one:
 * an epoll set of its own (watched by the event loop as one fd) that can take over
 *   - the relay (Engine.start: buffered copy both ways, half-close, end),
 *   - the dial too (Engine.dial: socket, TCP_NODELAY, connect, the TCP_INFO check, then relay),
 *   - the accept and the first read too (Engine.listen: Python is called once to parse and route
 *     the first bytes, once to account at the end).
 * Deliberately left out, so it must not be used for traffic: splice, the idle and quiet-pipe
 * timers, the connect timeout, termination causes (every end is "client_close"), the live view's
 * byte probe, drain, IPv6, PROXY headers, per-client limits, h2c, rejections, and any bound but
 * the 256 events per wake-up. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <errno.h>
#include <unistd.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>

#define BUF 65536
static char scratch[BUF];

typedef struct {
    int src, dst, done;
    char *out;
    size_t off, len;
    unsigned long long sent;
} Way;
typedef struct Conn {
    Way w[2];
    int cfd, pfd, cmask, pmask, closed, connecting, owns;
    PyObject *cb;
    PyObject *ctx;
    struct Conn *self;
} Conn;

typedef struct {
    PyObject_HEAD
    int epfd;
    int lfd;
    PyObject *route, *done, *fallback;
} Engine;
static Conn *freelist[256];
static int nfree;

static int
set_mask(Engine *e, Conn *c, int fd, int *cur, int mask, uintptr_t tag)
{
    if (mask == *cur)
        return 0;
    struct epoll_event ev = { .events = (uint32_t)mask, .data.u64 = (uint64_t)((uintptr_t)c | tag) };
    int op = *cur == 0 ? EPOLL_CTL_ADD : mask == 0 ? EPOLL_CTL_DEL : EPOLL_CTL_MOD;
    *cur = mask;
    return epoll_ctl(e->epfd, op, fd, &ev);
}

static void
masks(Engine *e, Conn *c)
{
    if (c->connecting) {
        set_mask(e, c, c->pfd, &c->pmask, EPOLLOUT, 1);
        return;
    }
    /* client: IN if c2p reading (no pending, not done); OUT if p2c has pending. pod: symmetric */
    int cm = 0, pm = 0;
    if (!c->w[0].done && !c->w[0].len)
        cm |= EPOLLIN;
    if (c->w[1].len)
        cm |= EPOLLOUT;
    if (!c->w[1].done && !c->w[1].len)
        pm |= EPOLLIN;
    if (c->w[0].len)
        pm |= EPOLLOUT;
    set_mask(e, c, c->cfd, &c->cmask, cm, 0);
    set_mask(e, c, c->pfd, &c->pmask, pm, 1);
}

static void
finish(Engine *e, Conn *c, int err)
{
    if (c->closed)
        return;
    c->closed = 1;
    set_mask(e, c, c->cfd, &c->cmask, 0, 0);
    if (c->pfd >= 0)
        set_mask(e, c, c->pfd, &c->pmask, 0, 1);
    PyMem_Free(c->w[0].out);
    PyMem_Free(c->w[1].out);
    if (c->owns) {
        close(c->cfd);
        if (c->pfd >= 0)
            close(c->pfd);
    }
    PyObject *r = c->ctx ? PyObject_CallFunction(c->cb, "OKKi", c->ctx, c->w[0].sent, c->w[1].sent, err)
                         : PyObject_CallFunction(c->cb, "KKi", c->w[0].sent, c->w[1].sent, err);
    Py_XDECREF(c->ctx);
    if (r == NULL)
        PyErr_WriteUnraisable(c->cb);
    else
        Py_DECREF(r);
    Py_DECREF(c->cb);
    if (nfree < 256)
        freelist[nfree++] = c; /* freed after the batch: later events may name it */
}

/* returns errno on failure, 0 ok */
static int
pump(Engine *e, Conn *c, Way *w, Way *other)
{
    for (int round = 0; round < 8; round++) {
        if (w->len) {
            ssize_t n = send(w->dst, w->out + w->off, w->len, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n < 0) {
                if (errno == EAGAIN)
                    return 0;
                return errno;
            }
            w->off += n;
            w->len -= n;
            w->sent += n;
            if (w->len)
                return 0;
            PyMem_Free(w->out);
            w->out = NULL;
            w->off = 0;
        }
        if (w->done)
            return 0;
        ssize_t n = recv(w->src, scratch, BUF, MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN)
                return 0;
            return errno;
        }
        if (n == 0) {
            w->done = 1;
            if (!other->done && shutdown(w->dst, SHUT_WR) < 0)
                return errno;
            return 0;
        }
        ssize_t s = send(w->dst, scratch, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (s < 0) {
            if (errno != EAGAIN)
                return errno;
            s = 0;
        }
        w->sent += s;
        if (s < n) {
            w->out = PyMem_Malloc(n - s);
            memcpy(w->out, scratch + s, n - s);
            w->off = 0;
            w->len = n - s;
            return 0;
        }
        if (n < BUF)
            return 0;
    }
    return 0;
}

static PyObject *
eng_start(Engine *e, PyObject *args)
{
    int cfd, pfd;
    Py_buffer init;
    PyObject *cb;
    if (!PyArg_ParseTuple(args, "iiy*O", &cfd, &pfd, &init, &cb))
        return NULL;
    Conn *c = PyMem_Calloc(1, sizeof(Conn));
    c->cfd = cfd;
    c->pfd = pfd;
    c->cb = Py_NewRef(cb);
    c->w[0].src = cfd;
    c->w[0].dst = pfd;
    c->w[1].src = pfd;
    c->w[1].dst = cfd;
    int err = 0;
    if (init.len) {
        ssize_t s = send(pfd, init.buf, init.len, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (s < 0) {
            if (errno != EAGAIN)
                err = errno;
            s = 0;
        }
        c->w[0].sent = s;
        if (!err && s < init.len) {
            c->w[0].out = PyMem_Malloc(init.len - s);
            memcpy(c->w[0].out, (char *)init.buf + s, init.len - s);
            c->w[0].len = init.len - s;
        }
    }
    PyBuffer_Release(&init);
    if (err) {
        finish(e, c, err);
        Py_RETURN_NONE;
    }
    masks(e, c);
    Py_RETURN_NONE;
}

static void on_listener(Engine *e);
static PyObject *
eng_dispatch(Engine *e, PyObject *unused)
{
    struct epoll_event evs[256];
    int n = epoll_wait(e->epfd, evs, 256, 0);
    for (int i = 0; i < n; i++) {
        if (evs[i].data.u64 == 0) {
            on_listener(e);
            continue;
        }
        Conn *c = (Conn *)(uintptr_t)(evs[i].data.u64 & ~(uint64_t)1);
        /* a conn finished earlier in this batch was freed: the prototype registers no stale ptr check */
        if (c->closed)
            continue;
        if (c->connecting) {
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            getsockopt(c->pfd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
            if (soerr) {
                finish(e, c, soerr);
                continue;
            }
            c->connecting = 0;
        }
        int err = pump(e, c, &c->w[0], &c->w[1]);
        if (!err)
            err = pump(e, c, &c->w[1], &c->w[0]);
        if (err) {
            finish(e, c, err);
            continue;
        }
        if (c->w[0].done && c->w[1].done && !c->w[0].len && !c->w[1].len) {
            finish(e, c, 0);
            continue;
        }
        masks(e, c);
    }
    for (int i = 0; i < nfree; i++)
        PyMem_Free(freelist[i]);
    nfree = 0;
    Py_RETURN_NONE;
}

static void
dial_core(Engine *e, int cfd, const char *ip, int port, const char *init, size_t init_len, PyObject *cb, PyObject *ctx)
{
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    Conn *c = PyMem_Calloc(1, sizeof(Conn));
    c->cfd = cfd;
    c->cb = Py_NewRef(cb);
    c->ctx = ctx ? Py_NewRef(ctx) : NULL;
    c->owns = 1;
    int pfd = -1;
    if (inet_pton(AF_INET, ip, &sa.sin_addr) != 1) {
        c->pfd = -1;
        finish(e, c, EINVAL);
        return;
    }
    pfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    c->pfd = pfd;
    if (pfd < 0) {
        finish(e, c, errno);
        return;
    }
    int one = 1;
    setsockopt(pfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    c->w[0].src = cfd;
    c->w[0].dst = pfd;
    c->w[1].src = pfd;
    c->w[1].dst = cfd;
    if (init_len) {
        c->w[0].out = PyMem_Malloc(init_len);
        memcpy(c->w[0].out, init, init_len);
        c->w[0].len = init_len;
    }
    if (connect(pfd, (struct sockaddr *)&sa, sizeof sa) < 0 && errno != EINPROGRESS) {
        finish(e, c, errno);
        return;
    }
    struct tcp_info ti;
    socklen_t tl = sizeof ti;
    if (getsockopt(pfd, IPPROTO_TCP, TCP_INFO, &ti, &tl) == 0 && ti.tcpi_state == TCP_ESTABLISHED) {
        int err = pump(e, c, &c->w[0], &c->w[1]);
        if (err) {
            finish(e, c, err);
            return;
        }
    } else {
        c->connecting = 1;
    }
    masks(e, c);
}

static void
on_listener(Engine *e)
{
    static char hello[16384];
    for (int i = 0; i < 64; i++) {
        struct sockaddr_storage peer;
        socklen_t pl = sizeof peer;
        int fd = accept4(e->lfd, (struct sockaddr *)&peer, &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        ssize_t n = recv(fd, hello, sizeof hello, 0);
        if (n <= 0) {
            PyObject *r = PyObject_CallFunction(e->fallback, "i", fd);
            if (!r)
                PyErr_WriteUnraisable(e->fallback);
            else
                Py_DECREF(r);
            continue;
        }
        char ipbuf[64] = "?";
        int pport = 0;
        if (peer.ss_family == AF_INET) {
            struct sockaddr_in *p4 = (struct sockaddr_in *)&peer;
            inet_ntop(AF_INET, &p4->sin_addr, ipbuf, sizeof ipbuf);
            pport = ntohs(p4->sin_port);
        }
        PyObject *r = PyObject_CallFunction(e->route, "iy#si", fd, hello, (Py_ssize_t)n, ipbuf, pport);
        if (!r) {
            PyErr_WriteUnraisable(e->route);
            close(fd);
            continue;
        }
        if (r == Py_None) {
            Py_DECREF(r);
            continue;
        } /* Python took the fd */
        const char *ip;
        int port;
        PyObject *ctx;
        if (!PyArg_ParseTuple(r, "siO", &ip, &port, &ctx)) {
            PyErr_WriteUnraisable(e->route);
            Py_DECREF(r);
            close(fd);
            continue;
        }
        dial_core(e, fd, ip, port, hello, (size_t)n, e->done, ctx);
        Py_DECREF(r);
    }
}

static PyObject *
eng_listen(Engine *e, PyObject *args)
{
    if (!PyArg_ParseTuple(args, "iOOO", &e->lfd, &e->route, &e->done, &e->fallback))
        return NULL;
    Py_INCREF(e->route);
    Py_INCREF(e->done);
    Py_INCREF(e->fallback);
    struct epoll_event ev = { .events = EPOLLIN, .data.u64 = 0 };
    if (epoll_ctl(e->epfd, EPOLL_CTL_ADD, e->lfd, &ev) < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *
eng_dial(Engine *e, PyObject *args)
{
    int cfd, port;
    const char *ip;
    Py_buffer init;
    PyObject *cb;
    if (!PyArg_ParseTuple(args, "isiy*O", &cfd, &ip, &port, &init, &cb))
        return NULL;
    dial_core(e, cfd, ip, port, init.buf, (size_t)init.len, cb, NULL);
    PyBuffer_Release(&init);
    Py_RETURN_NONE;
}

static PyObject *
eng_fileno(Engine *e, PyObject *unused)
{
    return PyLong_FromLong(e->epfd);
}

static PyMethodDef eng_methods[] = { { "start", (PyCFunction)eng_start, METH_VARARGS, NULL },
                                     { "dispatch", (PyCFunction)eng_dispatch, METH_NOARGS, NULL },
                                     { "dial", (PyCFunction)eng_dial, METH_VARARGS, NULL },
                                     { "listen", (PyCFunction)eng_listen, METH_VARARGS, NULL },
                                     { "fileno", (PyCFunction)eng_fileno, METH_NOARGS, NULL },
                                     { NULL } };

static PyObject *
eng_new(PyTypeObject *t, PyObject *a, PyObject *k)
{
    Engine *e = (Engine *)t->tp_alloc(t, 0);
    e->epfd = epoll_create1(EPOLL_CLOEXEC);
    return (PyObject *)e;
}

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "_fastrelay.Engine",
    .tp_basicsize = sizeof(Engine),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = eng_new,
    .tp_methods = eng_methods,
};

static struct PyModuleDef mod = { PyModuleDef_HEAD_INIT, "_fastrelay", NULL, -1, NULL };
PyMODINIT_FUNC
PyInit__fastrelay(void)
{
    if (PyType_Ready(&EngineType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&mod);
    PyModule_AddObject(m, "Engine", Py_NewRef((PyObject *)&EngineType));
    return m;
}
