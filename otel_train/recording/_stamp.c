/* A GPU job's boundary stamp in C (recording/stamps.py: BoundaryStamps.take_stamp is
 * the reference, and the fallback where this does not build).
 *
 * Once the device is timed, every boundary with a time takes a stamp on the training
 * thread: whether the thread runs on the bound device, one pooled CUDA event recorded on
 * that device's current stream, and one allocator sample (peak allocated and reserved
 * since the last reset, retries, OOMs; then a peak reset). In Python the bookkeeping
 * around those calls (the pool's pop, the nested statistics' lookups and int()s, the
 * tuples) cost more instructions than the CUDA calls' own bindings; here it is one C
 * call. The CUDA calls themselves are torch's, made through the callables given, so a
 * stand-in runtime (tests/unit/cuda_standin.py) or a newer torch sees the same calls.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *pool;       /* device.EventPool: "free" (a list used as a stack), "device" */
    PyObject *free;       /* the pool's free list */
    PyObject *make;       /* () -> a new event (the pool counts it) */
    PyObject *capture;    /* the capture module: "active" (CUDA-graph captures live) */
    PyObject *stream_of;  /* (device) -> that device's current stream */
    PyObject *get_device; /* () -> the calling thread's current device */
    PyObject *stats;      /* (device) -> the allocator's nested statistics; None: memory off */
    PyObject *reset;      /* (device) -> None; None: peaks are not reset */
    PyObject *mem_device; /* the memory tracker's device */
    long long taken;      /* stamps taken */
} Stamper;

static PyObject *s_active, *s_device, *s_record, *s_allocated, *s_reserved, *s_all, *s_peak,
    *s_retries, *s_ooms;

static int Stamper_init(Stamper *self, PyObject *args, PyObject *kwds) {
    static char *kw[] = {"pool", "make", "capture", "stream_of", "get_device", "stats",
                         "reset", "mem_device", NULL};
    PyObject *pool, *make, *capture, *stream_of, *get_device, *stats, *reset, *mem_device;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOOO", kw, &pool, &make, &capture,
                                     &stream_of, &get_device, &stats, &reset, &mem_device))
        return -1;
    PyObject *free = PyObject_GetAttrString(pool, "free");
    if (free == NULL) return -1;
    if (!PyList_CheckExact(free)) {
        Py_DECREF(free);
        PyErr_SetString(PyExc_TypeError, "Stamper: pool.free must be a list");
        return -1;
    }
    PyObject *fields[] = {pool, make, capture, stream_of, get_device, stats, reset, mem_device};
    PyObject **slots[] = {&self->pool, &self->make, &self->capture, &self->stream_of,
                          &self->get_device, &self->stats, &self->reset, &self->mem_device};
    for (int i = 0; i < 8; i++) {
        Py_INCREF(fields[i]);
        Py_XSETREF(*slots[i], fields[i]);
    }
    Py_XSETREF(self->free, free);
    return 0;
}

static int Stamper_traverse(Stamper *self, visitproc visit, void *arg) {
    Py_VISIT(self->pool);
    Py_VISIT(self->free);
    Py_VISIT(self->make);
    Py_VISIT(self->capture);
    Py_VISIT(self->stream_of);
    Py_VISIT(self->get_device);
    Py_VISIT(self->stats);
    Py_VISIT(self->reset);
    Py_VISIT(self->mem_device);
    return 0;
}

static int Stamper_clear(Stamper *self) {
    Py_CLEAR(self->pool);
    Py_CLEAR(self->free);
    Py_CLEAR(self->make);
    Py_CLEAR(self->capture);
    Py_CLEAR(self->stream_of);
    Py_CLEAR(self->get_device);
    Py_CLEAR(self->stats);
    Py_CLEAR(self->reset);
    Py_CLEAR(self->mem_device);
    return 0;
}

static void Stamper_dealloc(Stamper *self) {
    PyObject_GC_UnTrack(self);
    Stamper_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* d[k1][k2][k3] as a new reference to an int, or NULL with an error set. */
static PyObject *nested(PyObject *d, PyObject *k1, PyObject *k2, PyObject *k3) {
    PyObject *v = d;
    PyObject *keys[] = {k1, k2, k3};
    for (int i = 0; i < 3 && keys[i] != NULL; i++) {
        v = PyDict_Check(v) ? PyDict_GetItemWithError(v, keys[i]) : NULL;
        if (v == NULL) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, keys[i]);
            return NULL;
        }
    }
    return PyNumber_Long(v);
}

/* The recorded event, a new reference: None while a CUDA graph is captured. */
static PyObject *event_now(Stamper *self, PyObject *device) {
    PyObject *active = PyObject_GetAttr(self->capture, s_active);
    if (active == NULL) return NULL;
    int live = PyObject_IsTrue(active);
    Py_DECREF(active);
    if (live < 0) return NULL;
    if (live) Py_RETURN_NONE;
    PyObject *ev;
    Py_ssize_t n = PyList_GET_SIZE(self->free);
    if (n > 0) {
        ev = PyList_GET_ITEM(self->free, n - 1);
        Py_INCREF(ev);
        if (PyList_SetSlice(self->free, n - 1, n, NULL) < 0) {
            Py_DECREF(ev);
            return NULL;
        }
    } else {
        ev = PyObject_CallNoArgs(self->make);
        if (ev == NULL) return NULL;
    }
    PyObject *stream = PyObject_CallOneArg(self->stream_of, device);
    PyObject *r = stream ? PyObject_CallMethodOneArg(ev, s_record, stream) : NULL;
    Py_XDECREF(stream);
    if (r == NULL) {
        Py_DECREF(ev);
        return NULL;
    }
    Py_DECREF(r);
    return ev;
}

/* The allocator sample, a new reference: None with memory off. */
static PyObject *sample_now(Stamper *self) {
    if (self->stats == Py_None) Py_RETURN_NONE;
    PyObject *s = PyObject_CallOneArg(self->stats, self->mem_device);
    if (s == NULL) return NULL;
    PyObject *a = nested(s, s_allocated, s_all, s_peak);
    PyObject *r = a ? nested(s, s_reserved, s_all, s_peak) : NULL;
    PyObject *t = r ? nested(s, s_retries, NULL, NULL) : NULL;
    PyObject *o = t ? nested(s, s_ooms, NULL, NULL) : NULL;
    Py_DECREF(s);
    if (o != NULL && self->reset != Py_None) {
        PyObject *done = PyObject_CallOneArg(self->reset, self->mem_device);
        if (done == NULL) Py_CLEAR(o);
        Py_XDECREF(done);
    }
    if (o == NULL) {
        Py_XDECREF(a);
        Py_XDECREF(r);
        Py_XDECREF(t);
        return NULL;
    }
    PyObject *out = PyTuple_Pack(4, a, r, t, o);
    Py_DECREF(a);
    Py_DECREF(r);
    Py_DECREF(t);
    Py_DECREF(o);
    return out;
}

static PyObject *Stamper_call(Stamper *self, PyObject *args, PyObject *kwds) {
    PyObject *device = PyObject_GetAttr(self->pool, s_device);
    if (device == NULL) return NULL;
    PyObject *current = PyObject_CallNoArgs(self->get_device);
    int on = current ? PyObject_RichCompareBool(current, device, Py_EQ) : -1;
    Py_XDECREF(current);
    PyObject *ev = on >= 0 ? event_now(self, device) : NULL;
    Py_DECREF(device);
    if (ev == NULL) return NULL;
    PyObject *sample = sample_now(self);
    if (sample == NULL) {
        Py_DECREF(ev); /* (an event recorded and not kept: it is simply not reused) */
        return NULL;
    }
    self->taken++;
    PyObject *out = PyTuple_Pack(3, ev, sample, on ? Py_True : Py_False);
    Py_DECREF(ev);
    Py_DECREF(sample);
    return out;
}

static PyMemberDef Stamper_members[] = {
    {"taken", T_LONGLONG, offsetof(Stamper, taken), 0, "stamps taken"},
    {NULL},
};

static PyTypeObject StamperType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "otel_train.recording._stamp.Stamper",
    .tp_basicsize = sizeof(Stamper),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Stamper(pool, make, capture, stream_of, get_device, stats, reset, mem_device)"
              "() -> (event, sample, on_device): stamps.py's take_stamp in one call.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Stamper_init,
    .tp_dealloc = (destructor)Stamper_dealloc,
    .tp_traverse = (traverseproc)Stamper_traverse,
    .tp_clear = (inquiry)Stamper_clear,
    .tp_call = (ternaryfunc)Stamper_call,
    .tp_members = Stamper_members,
};

/* -- the stamped log's append (stamps.py: StampedLog, a subclass of this) ------------
 * A collections.deque whose append adds the stamp to an entry with a time (its second
 * field, non-zero): ``take_stamp`` is read from the instance, deque's own append does
 * the rest. One C call where a Python ``append`` would be a frame a boundary. */

static PyObject *deque_append; /* collections.deque.append, the method descriptor */
static PyObject *s_take_stamp;

static PyObject *StampedDeque_append(PyObject *self, PyObject *item) {
    if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) < 2) {
        PyErr_SetString(PyExc_TypeError, "a log entry is a tuple (stack, time, ...)");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(item);
    int timed = PyObject_IsTrue(PyTuple_GET_ITEM(item, 1));
    if (timed < 0) return NULL;
    PyObject *stamp;
    if (timed) {
        PyObject *take = PyObject_GetAttr(self, s_take_stamp);
        if (take == NULL) return NULL;
        stamp = PyObject_CallNoArgs(take);
        Py_DECREF(take);
        if (stamp == NULL) return NULL;
    } else {
        stamp = Py_NewRef(Py_None);
    }
    PyObject *entry = PyTuple_New(n + 1);
    if (entry == NULL) {
        Py_DECREF(stamp);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyTuple_GET_ITEM(item, i);
        Py_INCREF(v);
        PyTuple_SET_ITEM(entry, i, v);
    }
    PyTuple_SET_ITEM(entry, n, stamp);
    PyObject *args[2] = {self, entry};
    PyObject *r = PyObject_Vectorcall(deque_append, args, 2, NULL);
    Py_DECREF(entry);
    return r;
}

static PyMethodDef StampedDeque_methods[] = {
    {"append", (PyCFunction)StampedDeque_append, METH_O,
     "append(entry): the entry with its stamp (self.take_stamp()) when it has a time."},
    {NULL},
};

static PyType_Slot StampedDeque_slots[] = {
    {Py_tp_methods, StampedDeque_methods},
    {Py_tp_doc, "A deque whose append stamps entries with a time (stamps.py: StampedLog)."},
    {0, NULL},
};

static PyType_Spec StampedDeque_spec = {
    .name = "otel_train.recording._stamp.StampedDeque",
    .basicsize = 0,
    .itemsize = 0,
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .slots = StampedDeque_slots,
};

static int add_stamped_deque(PyObject *m) {
    PyObject *collections = PyImport_ImportModule("collections");
    if (collections == NULL) return -1;
    PyObject *deque = PyObject_GetAttrString(collections, "deque");
    Py_DECREF(collections);
    if (deque == NULL) return -1;
    deque_append = PyObject_GetAttrString(deque, "append");
    PyObject *type = deque_append ? PyType_FromSpecWithBases(&StampedDeque_spec, deque) : NULL;
    Py_DECREF(deque);
    if (type == NULL) return -1;
    if (PyModule_AddObject(m, "StampedDeque", type) < 0) {
        Py_DECREF(type);
        return -1;
    }
    return 0;
}

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_stamp", "A boundary's stamp in C (see stamps.py).", -1, NULL,
};

PyMODINIT_FUNC PyInit__stamp(void) {
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&s_active, "active"},       {&s_device, "device"},   {&s_record, "record"},
        {&s_allocated, "allocated_bytes"}, {&s_reserved, "reserved_bytes"},
        {&s_all, "all"},             {&s_peak, "peak"},       {&s_retries, "num_alloc_retries"},
        {&s_ooms, "num_ooms"},       {&s_take_stamp, "take_stamp"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        *names[i].slot = PyUnicode_InternFromString(names[i].text);
        if (*names[i].slot == NULL) return NULL;
    }
    if (PyType_Ready(&StamperType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&StamperType);
    if (PyModule_AddObject(m, "Stamper", (PyObject *)&StamperType) < 0) {
        Py_DECREF(&StamperType);
        Py_DECREF(m);
        return NULL;
    }
    if (add_stamped_deque(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
