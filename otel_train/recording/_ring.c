/* The hook's write into the shared-memory ring, in C (recording/ring.py is the
 * reference, and the fallback where this does not build).
 *
 * A raw hand-over writes one fixed slot per boundary into a ring its sidecar maps
 * (ring.py: SLOT, the layout). In Python that write costs more than the tuple it
 * replaces (struct.pack_into: ~1,760 instructions a call under callgrind); here an
 * adapter's boundary is one C call: the calling thread's stack token from a one-entry
 * cache, the clock, one slot written. Anything this cannot do on its own (a boundary or
 * thread not seen yet, recording switched off, the ring closed or full) goes to the
 * Python callables it was given, so behaviour is ring.py's.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define SLOT_SIZE 48
#define HEADER 64 /* ring.py: HEADER_FIELDS; the slots follow */
#define NONE_VALUE INT64_MIN
#define CACHE 32

/* The header's fields (int64 each): what the writer published, and the reader's
 * acknowledgement (a seqlock: seq is odd while the reader writes the four after it). */
enum { H_POS, H_LAST_T, H_ACK_SEQ, H_ACK_SESSION, H_ACK_POS, H_ACK_NEXT, H_ACK_TOKEN };

typedef struct {
    uint32_t kind;
    uint32_t name;
    int64_t t;
    uint64_t stack;
    int64_t a, b, c;
} slot_t;

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    char *base;
    long long capacity; /* slots */
    long long pos;      /* slots written since the ring was made (the stream position) */
    long long acked;    /* the reader let go of slots before this one */
    long long due;      /* on_due() is called once pos reaches it */
    int open;
    int64_t last_t;
    uint64_t tid;       /* the last writing thread (PyThreadState id) and its stack token */
    uint64_t tstack;
    PyObject *flags;    /* the recorder's __dict__: "enabled" read there */
    PyObject *stack_of; /* () -> token of the calling thread's stack (registers it) */
    PyObject *code_of;  /* (boundary) -> its code (registers it) */
    PyObject *refused;  /* (boundary, samples, tokens, padded, t): the write that was not made */
    PyObject *on_due;   /* () */
    /* A GPU job's (ring.py: Ring.stamp_with): stamper() takes the boundary's stamp (the
     * C Stamper, stamps.py), kept in stamps (a list of capacity items) at the slot's
     * index until the training process lets go of it. NULL: a CPU job, no stamps. */
    PyObject *stamper;
    PyObject *stamps;
    PyObject *keys[CACHE];
    uint32_t codes[CACHE];
    int ncodes;
} Ring;

static PyObject *s_enabled;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* time.perf_counter_ns's clock on Linux */
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int enabled(Ring *self) {
    PyObject *v = PyDict_GetItemWithError(self->flags, s_enabled);
    return v == Py_True;
}

/* The code of boundary b, or -1 with an error set. */
static long long code_of(Ring *self, PyObject *b) {
    for (int i = 0; i < self->ncodes; i++)
        if (self->keys[i] == b) return self->codes[i];
    PyObject *r = PyObject_CallOneArg(self->code_of, b);
    if (r == NULL) return -1;
    long long code = PyLong_AsLongLong(r);
    Py_DECREF(r);
    if (code < 0 || code > UINT32_MAX) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "bad boundary code");
        return -1;
    }
    if (self->ncodes < CACHE) { /* (code_of keeps b alive: the ring's table holds it) */
        self->keys[self->ncodes] = b;
        self->codes[self->ncodes++] = (uint32_t)code;
    }
    return code;
}

/* The calling thread's stack token, or 0 with an error set. */
static uint64_t stack_token(Ring *self) {
    uint64_t tid = PyThreadState_GetID(PyThreadState_Get());
    if (tid == self->tid && self->tstack) return self->tstack;
    PyObject *r = PyObject_CallNoArgs(self->stack_of);
    if (r == NULL) return 0;
    uint64_t token = PyLong_AsUnsignedLongLong(r);
    Py_DECREF(r);
    if (PyErr_Occurred()) return 0;
    self->tid = tid;
    self->tstack = token;
    return token;
}

static int count_value(PyObject *v, int64_t *out) {
    if (v == Py_None) { *out = NONE_VALUE; return 0; }
    if (!PyLong_CheckExact(v)) return -1;
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow || x == NONE_VALUE || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return -1;
    }
    *out = x;
    return 0;
}

static int64_t *header(Ring *self) { return (int64_t *)self->base; }

/* Whether a slot is free: the reader let go of one a ring ago (its acknowledgement in
 * the header, or the one the training process was told another way: acked). */
static int has_room(Ring *self) {
    long long acked = __atomic_load_n(&header(self)[H_ACK_POS], __ATOMIC_ACQUIRE);
    if (acked < self->acked) acked = self->acked;
    return self->pos - acked < self->capacity;
}

/* Store slot s at pos and publish the new position (release: a reader that sees it sees
 * the slot). */
static void store(Ring *self, const slot_t *s) {
    memcpy(self->base + HEADER + (self->pos % self->capacity) * SLOT_SIZE, s, SLOT_SIZE);
    self->pos++;
    if (s->t > self->last_t) self->last_t = s->t;
    __atomic_store_n(&header(self)[H_LAST_T], self->last_t, __ATOMIC_RELAXED);
    __atomic_store_n(&header(self)[H_POS], self->pos, __ATOMIC_RELEASE);
}

/* Write one boundary slot; 1 written, 0 refused (caller falls back), -1 error. */
static int write_boundary(Ring *self, PyObject *b, int64_t a, int64_t bb, int64_t c, int64_t t) {
    if (!self->open || !enabled(self)) return 0;
    if (!has_room(self)) return 0;
    long long code = code_of(self, b);
    if (code < 0) return -1;
    uint64_t stack = stack_token(self);
    if (!stack) return -1;
    int64_t when = t ? t : now_ns();
    if (self->stamper != NULL) { /* the stamp after the clock, as the stamped log's append */
        PyObject *stamp = PyObject_CallNoArgs(self->stamper);
        if (stamp == NULL) return -1;
        Py_ssize_t at = (Py_ssize_t)(self->pos % self->capacity);
        if (!PyList_CheckExact(self->stamps) || at >= PyList_GET_SIZE(self->stamps)) {
            Py_DECREF(stamp);
            PyErr_SetString(PyExc_ValueError, "stamps: a list of capacity items");
            return -1;
        }
        PyObject *old = PyList_GET_ITEM(self->stamps, at);
        PyList_SET_ITEM(self->stamps, at, stamp);
        Py_XDECREF(old);
    }
    slot_t s;
    s.kind = (uint32_t)code;
    s.name = 0;
    s.t = when;
    s.stack = stack;
    s.a = a;
    s.b = bb;
    s.c = c;
    store(self, &s);
    return 1;
}

static PyObject *after_write(Ring *self) {
    if (self->pos >= self->due) {
        self->due = LLONG_MAX; /* (on_due sets the next) */
        PyObject *r = PyObject_CallNoArgs(self->on_due);
        if (r == NULL) PyErr_Clear(); /* telemetry never raises into training */
        Py_XDECREF(r);
    }
    Py_RETURN_NONE;
}

static PyObject *refuse(Ring *self, PyObject *b, PyObject *s, PyObject *tk, PyObject *p, PyObject *t) {
    PyErr_Clear(); /* (an error here: the Python path logs it once and disables) */
    PyObject *args[5] = {b, s, tk, p, t};
    return PyObject_Vectorcall(self->refused, args, 5, NULL);
}

static PyObject *Ring_transition(Ring *self, PyObject *b) {
    int r = write_boundary(self, b, NONE_VALUE, NONE_VALUE, NONE_VALUE, 0);
    if (r > 0) return after_write(self);
    PyObject *zero = PyLong_FromLong(0);
    PyObject *out = refuse(self, b, Py_None, Py_None, Py_None, zero);
    Py_XDECREF(zero);
    return out;
}

static PyObject *Ring_counted(Ring *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 4 || nargs > 5) {
        PyErr_SetString(PyExc_TypeError, "counted(b, samples, tokens, padded, t=0)");
        return NULL;
    }
    int64_t a, bb, c, t = 0;
    PyObject *tobj = nargs == 5 ? args[4] : NULL;
    int ok = count_value(args[1], &a) == 0 && count_value(args[2], &bb) == 0 &&
             count_value(args[3], &c) == 0;
    if (ok && tobj != NULL) {
        t = PyLong_AsLongLong(tobj);
        if (t == -1 && PyErr_Occurred()) { PyErr_Clear(); ok = 0; }
    }
    if (ok) {
        int r = write_boundary(self, args[0], a, bb, c, t);
        if (r > 0) return after_write(self);
    }
    PyObject *zero = NULL;
    if (tobj == NULL) tobj = zero = PyLong_FromLong(0);
    PyObject *out = refuse(self, args[0], args[1], args[2], args[3], tobj);
    Py_XDECREF(zero);
    return out;
}

/* put(kind, name, stack, t, a, b, c) -> the slot's position, or -1 if refused. */
static PyObject *Ring_put(Ring *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "put(kind, name, stack, t, a, b, c)");
        return NULL;
    }
    if (!self->open || !has_room(self)) return PyLong_FromLong(-1);
    slot_t s;
    s.kind = (uint32_t)PyLong_AsUnsignedLong(args[0]);
    s.name = (uint32_t)PyLong_AsUnsignedLong(args[1]);
    s.stack = PyLong_AsUnsignedLongLong(args[2]);
    s.t = PyLong_AsLongLong(args[3]);
    s.a = PyLong_AsLongLong(args[4]);
    s.b = PyLong_AsLongLong(args[5]);
    s.c = PyLong_AsLongLong(args[6]);
    if (PyErr_Occurred()) return NULL;
    long long at = self->pos;
    store(self, &s);
    PyObject *r = after_write(self);
    if (r == NULL) return NULL;
    Py_DECREF(r);
    return PyLong_FromLongLong(at);
}

static int Ring_init(Ring *self, PyObject *args, PyObject *kw) {
    static char *names[] = {"buffer", "capacity", "flags", "stack_of", "code_of", "refused",
                            "on_due", NULL};
    PyObject *buffer, *flags, *stack_of, *code_of, *refused, *on_due;
    long long capacity;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OLOOOOO", names, &buffer, &capacity, &flags,
                                     &stack_of, &code_of, &refused, &on_due))
        return -1;
    if (!PyDict_Check(flags)) {
        PyErr_SetString(PyExc_TypeError, "flags: the recorder's __dict__");
        return -1;
    }
    if (PyObject_GetBuffer(buffer, &self->view, PyBUF_WRITABLE) < 0) return -1;
    if (capacity <= 0 || self->view.len < HEADER + capacity * SLOT_SIZE) {
        PyBuffer_Release(&self->view);
        PyErr_SetString(PyExc_ValueError, "buffer smaller than capacity slots");
        return -1;
    }
    self->base = self->view.buf;
    self->capacity = capacity;
    self->due = LLONG_MAX;
    Py_INCREF(flags); self->flags = flags;
    Py_INCREF(stack_of); self->stack_of = stack_of;
    Py_INCREF(code_of); self->code_of = code_of;
    Py_INCREF(refused); self->refused = refused;
    Py_INCREF(on_due); self->on_due = on_due;
    return 0;
}

static void Ring_dealloc(Ring *self) {
    if (self->base != NULL) PyBuffer_Release(&self->view);
    Py_XDECREF(self->flags);
    Py_XDECREF(self->stack_of);
    Py_XDECREF(self->code_of);
    Py_XDECREF(self->refused);
    Py_XDECREF(self->on_due);
    Py_XDECREF(self->stamper);
    Py_XDECREF(self->stamps);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* stamp_with(stamper, stamps): every boundary written from now on takes a stamp into
 * stamps (ring.py: Ring.stamp_with); stamp_with(None, None): no more. */
static PyObject *Ring_stamp_with(Ring *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "stamp_with(stamper, stamps)");
        return NULL;
    }
    PyObject *stamper = args[0] == Py_None ? NULL : args[0];
    PyObject *stamps = args[1] == Py_None ? NULL : args[1];
    if ((stamper == NULL) != (stamps == NULL) ||
        (stamps != NULL && (!PyList_CheckExact(stamps) ||
                            PyList_GET_SIZE(stamps) < self->capacity))) {
        PyErr_SetString(PyExc_ValueError, "stamp_with(stamper, a list of capacity items)");
        return NULL;
    }
    Py_XINCREF(stamper);
    Py_XINCREF(stamps);
    Py_XSETREF(self->stamper, stamper);
    Py_XSETREF(self->stamps, stamps);
    Py_RETURN_NONE;
}

static PyObject *Ring_forget_thread(Ring *self, PyObject *unused) {
    self->tid = 0;
    self->tstack = 0;
    Py_RETURN_NONE;
}

static PyObject *Ring_release(Ring *self, PyObject *unused) {
    /* Let go of the shared memory (the mmap can close only once no view is held). */
    self->open = 0;
    if (self->base != NULL) {
        PyBuffer_Release(&self->view);
        self->base = NULL;
        self->capacity = 1;
        self->acked = self->pos; /* (refuses every write from now on: open is 0 too) */
    }
    Py_RETURN_NONE;
}

static PyMethodDef Ring_methods[] = {
    {"transition", (PyCFunction)Ring_transition, METH_O, "An adapter boundary, now."},
    {"counted", (PyCFunction)(void (*)(void))Ring_counted, METH_FASTCALL,
     "A counted boundary: counted(b, samples, tokens, padded, t=0)."},
    {"put", (PyCFunction)(void (*)(void))Ring_put, METH_FASTCALL,
     "put(kind, name, stack, t, a, b, c) -> position, or -1 if refused."},
    {"stamp_with", (PyCFunction)(void (*)(void))Ring_stamp_with, METH_FASTCALL,
     "stamp_with(stamper, stamps): each boundary's stamp into stamps at its index."},
    {"forget_thread", (PyCFunction)Ring_forget_thread, METH_NOARGS,
     "Look the calling thread's stack up again at the next write."},
    {"release", (PyCFunction)Ring_release, METH_NOARGS, "Close for good; let go of the buffer."},
    {NULL},
};

#include <structmember.h>
static PyMemberDef Ring_members[] = {
    {"pos", T_LONGLONG, offsetof(Ring, pos), 0, "slots written"},
    {"acked", T_LONGLONG, offsetof(Ring, acked), 0, "slots the reader let go of"},
    {"due", T_LONGLONG, offsetof(Ring, due), 0, "position at which on_due() is called"},
    {"capacity", T_LONGLONG, offsetof(Ring, capacity), READONLY, "slots"},
    {"open", T_INT, offsetof(Ring, open), 0, "whether writes are taken"},
    {"last_t", T_LONGLONG, offsetof(Ring, last_t), 0, "the newest slot's time"},
    {NULL},
};

static PyTypeObject RingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train.recording._ring.Ring",
    .tp_basicsize = sizeof(Ring),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The ring's writer in C (recording/ring.py: Ring, the reference).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Ring_init,
    .tp_dealloc = (destructor)Ring_dealloc,
    .tp_methods = Ring_methods,
    .tp_members = Ring_members,
};

/* -- the header, read and written across processes (ring.py: written, publish_ack,
 * read_ack): with acquire and release, so that on a weakly ordered CPU (aarch64) what
 * a position or an acknowledgement names is seen with it. */

static int64_t *header_of(PyObject *buffer, Py_buffer *view, int writable) {
    if (PyObject_GetBuffer(buffer, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0)
        return NULL;
    if (view->len < HEADER) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "buffer smaller than the ring's header");
        return NULL;
    }
    return (int64_t *)view->buf;
}

static PyObject *mod_written(PyObject *m, PyObject *buffer) {
    Py_buffer view;
    int64_t *h = header_of(buffer, &view, 0);
    if (h == NULL) return NULL;
    long long pos = __atomic_load_n(&h[H_POS], __ATOMIC_ACQUIRE);
    long long last_t = __atomic_load_n(&h[H_LAST_T], __ATOMIC_RELAXED);
    PyBuffer_Release(&view);
    return Py_BuildValue("(LL)", pos, last_t);
}

static PyObject *mod_publish_ack(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "publish_ack(buffer, session, pos, next_index, token)");
        return NULL;
    }
    int64_t v[4];
    for (int i = 0; i < 3; i++) {
        v[i] = (int64_t)PyLong_AsLongLong(args[i + 1]);
        if (v[i] == -1 && PyErr_Occurred()) return NULL;
    }
    v[3] = (int64_t)PyLong_AsUnsignedLongLong(args[4]); /* (a token: an unsigned id) */
    if (PyErr_Occurred()) return NULL;
    Py_buffer view;
    int64_t *h = header_of(args[0], &view, 1);
    if (h == NULL) return NULL;
    int64_t seq = __atomic_load_n(&h[H_ACK_SEQ], __ATOMIC_RELAXED);
    __atomic_store_n(&h[H_ACK_SEQ], seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
    __atomic_store_n(&h[H_ACK_SESSION], v[0], __ATOMIC_RELAXED);
    __atomic_store_n(&h[H_ACK_NEXT], v[2], __ATOMIC_RELAXED);
    __atomic_store_n(&h[H_ACK_TOKEN], v[3], __ATOMIC_RELAXED);
    __atomic_store_n(&h[H_ACK_POS], v[1], __ATOMIC_RELEASE);
    __atomic_store_n(&h[H_ACK_SEQ], seq + 2, __ATOMIC_RELEASE);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyObject *mod_read_ack(PyObject *m, PyObject *buffer) {
    Py_buffer view;
    int64_t *h = header_of(buffer, &view, 0);
    if (h == NULL) return NULL;
    int64_t s1, s2, session, pos, next, token;
    do {
        s1 = __atomic_load_n(&h[H_ACK_SEQ], __ATOMIC_ACQUIRE);
        session = __atomic_load_n(&h[H_ACK_SESSION], __ATOMIC_RELAXED);
        pos = __atomic_load_n(&h[H_ACK_POS], __ATOMIC_RELAXED);
        next = __atomic_load_n(&h[H_ACK_NEXT], __ATOMIC_RELAXED);
        token = __atomic_load_n(&h[H_ACK_TOKEN], __ATOMIC_RELAXED);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        s2 = __atomic_load_n(&h[H_ACK_SEQ], __ATOMIC_RELAXED);
    } while ((s1 & 1) || s1 != s2);
    PyBuffer_Release(&view);
    return Py_BuildValue("(LLLK)", (long long)session, (long long)pos, (long long)next,
                         (unsigned long long)token);
}

/* -- the reader's decode (ring.py: decode, the reference): slots back into the log
 * entries the state machine applies, the same tuples the Python decoder builds. In
 * Python a slot costs ~1,500 instructions to unpack and rebuild; here, the tuple. */

enum { K_ENTER = 0, K_EXIT = 1, K_STEP_BEGIN = 2, K_STEP_END = 3, K_COUNTS = 5 };
#define K_SIDE 15
#define K_FIRST_CODE 16

/* A count field as an object: None for NONE_VALUE. A new reference, NULL on error. */
static PyObject *count_object(int64_t v) {
    if (v == NONE_VALUE) Py_RETURN_NONE;
    return PyLong_FromLongLong(v);
}

/* A tuple of n items, each a new reference (any NULL: NULL, the others released). */
static PyObject *entry_of(Py_ssize_t n, PyObject **items) {
    PyObject *e = NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        if (items[i] == NULL) goto fail;
    e = PyTuple_New(n);
    if (e == NULL) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(e, i, items[i]);
    return e;
fail:
    for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(items[i]);
    return NULL;
}

static PyObject *new_ref(PyObject *o) {
    Py_INCREF(o);
    return o;
}

/* The entry of a slot that is not a side entry, or NULL: with an error set, or without
 * one where its code or name is not known yet (decoding stops there). */
static PyObject *slot_entry(const slot_t *s, PyObject *stack, PyObject *boundaries,
                            PyObject *counted, PyObject *names) {
    PyObject *items[6];
    if (s->kind >= K_FIRST_CODE) {
        Py_ssize_t i = (Py_ssize_t)(s->kind - K_FIRST_CODE);
        if (i >= PyList_GET_SIZE(boundaries) || i >= PyList_GET_SIZE(counted)) return NULL;
        int is_counted = PyObject_IsTrue(PyList_GET_ITEM(counted, i));
        if (is_counted < 0) return NULL;
        items[0] = new_ref(stack);
        items[1] = PyLong_FromLongLong(s->t);
        items[2] = new_ref(PyList_GET_ITEM(boundaries, i));
        if (!is_counted) return entry_of(3, items);
        items[3] = count_object(s->a);
        items[4] = count_object(s->b);
        items[5] = count_object(s->c);
        return entry_of(6, items);
    }
    if (s->kind == K_ENTER || s->kind == K_EXIT) {
        if ((Py_ssize_t)s->name >= PyList_GET_SIZE(names)) return NULL;
        items[0] = new_ref(stack);
        items[1] = PyLong_FromLongLong(s->t);
        items[2] = PyLong_FromLong(s->kind);
        items[3] = new_ref(PyList_GET_ITEM(names, s->name));
        if (s->kind == K_ENTER) return entry_of(4, items);
        items[4] = new_ref(Py_None);
        return entry_of(5, items);
    }
    if (s->kind == K_STEP_BEGIN || s->kind == K_STEP_END) {
        items[0] = new_ref(stack);
        items[1] = PyLong_FromLongLong(s->t);
        items[2] = PyLong_FromLong(s->kind);
        if (s->kind == K_STEP_END) return entry_of(3, items);
        items[3] = count_object(s->a);
        items[4] = count_object(s->b);
        return entry_of(5, items);
    }
    items[0] = new_ref(Py_None); /* COUNTS */
    items[1] = PyLong_FromLong(0);
    items[2] = PyLong_FromLong(K_COUNTS);
    items[3] = count_object(s->a);
    items[4] = count_object(s->b);
    items[5] = count_object(s->c);
    return entry_of(6, items);
}

/* The side entry at pos, popped from sides; NULL without an error where it is not there. */
static PyObject *pop_side(PyObject *sides, long long pos) {
    PyObject *key = PyLong_FromLongLong(pos);
    if (key == NULL) return NULL;
    PyObject *e = PyDict_GetItemWithError(sides, key);
    if (e != NULL) {
        Py_INCREF(e);
        if (PyDict_DelItem(sides, key) < 0) Py_CLEAR(e);
    }
    Py_DECREF(key);
    return e;
}

static PyObject *mod_decode(PyObject *m, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9 || !PyList_Check(args[4]) || !PyList_Check(args[5]) ||
        !PyList_Check(args[6]) || !PyDict_Check(args[8])) {
        PyErr_SetString(PyExc_TypeError, "decode(buffer, capacity, start, end, boundaries, "
                                         "counted, names, stack_for, sides)");
        return NULL;
    }
    long long capacity = PyLong_AsLongLong(args[1]);
    long long start = PyLong_AsLongLong(args[2]);
    long long end = PyLong_AsLongLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    PyObject *boundaries = args[4], *counted = args[5], *names = args[6];
    PyObject *stack_for = args[7], *sides = args[8];
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    if (capacity <= 0 || start < 0 || view.len < HEADER + capacity * SLOT_SIZE) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "buffer smaller than the ring's capacity");
        return NULL;
    }
    const char *slots = (const char *)view.buf + HEADER;
    PyObject *out = PyList_New(0);
    PyObject *stack = new_ref(Py_None);
    uint64_t last_token = 0;
    long long pos = start;
    for (; out != NULL && pos < end; pos++) {
        slot_t s;
        memcpy(&s, slots + (pos % capacity) * SLOT_SIZE, SLOT_SIZE);
        PyObject *e;
        if (s.kind == K_SIDE) {
            e = pop_side(sides, pos);
        } else {
            if (s.stack != last_token) {
                last_token = s.stack;
                Py_CLEAR(stack);
                if (s.stack) {
                    PyObject *token = PyLong_FromUnsignedLongLong(s.stack);
                    stack = token ? PyObject_CallOneArg(stack_for, token) : NULL;
                    Py_XDECREF(token);
                } else {
                    stack = new_ref(Py_None);
                }
                if (stack == NULL) {
                    Py_CLEAR(out);
                    break;
                }
            }
            e = slot_entry(&s, stack, boundaries, counted, names);
        }
        if (e == NULL) {
            if (PyErr_Occurred()) Py_CLEAR(out);
            break; /* (not known yet: the next hand-over has it) */
        }
        if (PyList_Append(out, e) < 0) Py_CLEAR(out);
        Py_DECREF(e);
    }
    Py_XDECREF(stack);
    PyBuffer_Release(&view);
    if (out == NULL) return NULL;
    return Py_BuildValue("(NL)", out, pos);
}

static PyMethodDef module_methods[] = {
    {"written", (PyCFunction)mod_written, METH_O,
     "written(buffer) -> (position, newest time): what the writer published."},
    {"publish_ack", (PyCFunction)(void (*)(void))mod_publish_ack, METH_FASTCALL,
     "publish_ack(buffer, session, position, next_index, token): the reader's idle point."},
    {"read_ack", (PyCFunction)mod_read_ack, METH_O,
     "read_ack(buffer) -> (session, position, next_index, token)."},
    {"decode", (PyCFunction)(void (*)(void))mod_decode, METH_FASTCALL,
     "decode(buffer, capacity, start, end, boundaries, counted, names, stack_for, sides)"
     " -> (entries, position): ring.py's decode."},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ring", "The ring's writer in C (see ring.py).", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__ring(void) {
    s_enabled = PyUnicode_InternFromString("enabled");
    if (s_enabled == NULL || PyType_Ready(&RingType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&RingType);
    if (PyModule_AddObject(m, "Ring", (PyObject *)&RingType) < 0) {
        Py_DECREF(&RingType);
        Py_DECREF(m);
        return NULL;
    }
    PyModule_AddIntConstant(m, "SLOT_SIZE", SLOT_SIZE);
    PyModule_AddIntConstant(m, "HEADER", HEADER);
    PyObject *kinds = Py_BuildValue("(iiiiiii)", K_ENTER, K_EXIT, K_STEP_BEGIN, K_STEP_END,
                                    K_COUNTS, K_SIDE, K_FIRST_CODE);
    if (kinds == NULL || PyModule_AddObject(m, "KINDS", kinds) < 0) {
        Py_XDECREF(kinds);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
