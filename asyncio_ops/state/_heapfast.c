/*
 * The heap backend's per-record hot path in C: the current key and value state.
 *
 * ``KeyContext.set_current_key(key)`` is one dict lookup of the backend's cache
 * of validated keys (key -> (key-group index in the backend's range, ...)); a
 * key not in it goes to the backend's Python validation (``on_new_key``: key
 * group, range, canonical encoding), which raises or adds it. The context keeps
 * the current key and its key-group index. ``ValueCell.value()`` / ``update(v)``
 * / ``clear()`` are one dict operation, with the current key, on the current
 * key group's dict of the state (a list of dicts, one per key group). With a set
 * in ``touched``, every key made current is added to it (the keys an incremental
 * snapshot writes). Semantics are
 * those of the pure-Python classes in ``_heap.py``, which remain the fallback
 * when this module is not built.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *key;         /* the current key (the backend's NO_KEY before the first) */
    Py_ssize_t kg;         /* its key-group index in the backend's range; -1: no key */
    PyObject *no_key;      /* NO_KEY */
    PyObject *cache;       /* dict: validated keys */
    PyObject *on_new_key;  /* callable(key): validate, add to cache, or raise */
    PyObject *no_key_error;/* callable() -> the StateError for "no current key" */
    PyObject *touched;     /* a set every current key is added to, or NULL: not tracking */
} KeyContext;

static int
KeyContext_traverse(KeyContext *self, visitproc visit, void *arg)
{
    Py_VISIT(self->key);
    Py_VISIT(self->no_key);
    Py_VISIT(self->cache);
    Py_VISIT(self->on_new_key);
    Py_VISIT(self->no_key_error);
    Py_VISIT(self->touched);
    return 0;
}

static int
KeyContext_clear(KeyContext *self)
{
    Py_CLEAR(self->key);
    Py_CLEAR(self->no_key);
    Py_CLEAR(self->cache);
    Py_CLEAR(self->on_new_key);
    Py_CLEAR(self->no_key_error);
    Py_CLEAR(self->touched);
    return 0;
}

static void
KeyContext_dealloc(KeyContext *self)
{
    PyObject_GC_UnTrack(self);
    KeyContext_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
KeyContext_init(KeyContext *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"no_key", "cache", "on_new_key", "no_key_error", NULL};
    PyObject *no_key, *cache, *on_new_key, *no_key_error;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!OO", kwlist, &no_key, &PyDict_Type,
                                     &cache, &on_new_key, &no_key_error)) {
        return -1;
    }
    Py_INCREF(no_key);
    Py_XSETREF(self->no_key, no_key);
    Py_INCREF(no_key);
    Py_XSETREF(self->key, no_key);
    self->kg = -1;
    Py_INCREF(cache);
    Py_XSETREF(self->cache, cache);
    Py_INCREF(on_new_key);
    Py_XSETREF(self->on_new_key, on_new_key);
    Py_INCREF(no_key_error);
    Py_XSETREF(self->no_key_error, no_key_error);
    return 0;
}

static PyObject *
KeyContext_set_current_key(KeyContext *self, PyObject *key)
{
    PyObject *entry = PyDict_GetItemWithError(self->cache, key);  /* borrowed */
    if (entry == NULL) {
        /* a new key, or an unhashable one: the Python side validates or raises */
        PyErr_Clear();
        PyObject *res = PyObject_CallOneArg(self->on_new_key, key);
        if (res == NULL) {
            return NULL;
        }
        Py_DECREF(res);
        entry = PyDict_GetItemWithError(self->cache, key);
        if (entry == NULL) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_SystemError, "on_new_key did not cache the key");
            }
            return NULL;
        }
    }
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) < 1) {
        PyErr_SetString(PyExc_SystemError, "key cache entries must be (index, ...) tuples");
        return NULL;
    }
    Py_ssize_t kg = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 0));
    if (kg < 0) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_SystemError, "negative key-group index in the key cache");
        }
        return NULL;
    }
    if (self->touched != NULL && PySet_Add(self->touched, key) < 0) {
        return NULL;
    }
    Py_INCREF(key);
    Py_SETREF(self->key, key);
    self->kg = kg;
    Py_RETURN_NONE;
}

static PyObject *
KeyContext_reset(KeyContext *self, PyObject *Py_UNUSED(ignored))
{
    Py_INCREF(self->no_key);
    Py_SETREF(self->key, self->no_key);
    self->kg = -1;
    Py_RETURN_NONE;
}

static PyObject *
KeyContext_get_key(KeyContext *self, void *closure)
{
    Py_INCREF(self->key);
    return self->key;
}

static PyObject *
KeyContext_get_kg(KeyContext *self, void *closure)
{
    if (self->kg < 0) {
        Py_RETURN_NONE;
    }
    return PyLong_FromSsize_t(self->kg);
}

static PyObject *
KeyContext_get_touched(KeyContext *self, void *closure)
{
    if (self->touched == NULL) {
        Py_RETURN_NONE;
    }
    Py_INCREF(self->touched);
    return self->touched;
}

static int
KeyContext_set_touched(KeyContext *self, PyObject *value, void *closure)
{
    if (value == NULL || value == Py_None) {
        Py_CLEAR(self->touched);
        return 0;
    }
    if (!PySet_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "touched must be a set or None");
        return -1;
    }
    Py_INCREF(value);
    Py_XSETREF(self->touched, value);
    return 0;
}

static PyMethodDef KeyContext_methods[] = {
    {"set_current_key", (PyCFunction)KeyContext_set_current_key, METH_O,
     "Make key the current key (validated once, then cached)."},
    {"reset", (PyCFunction)KeyContext_reset, METH_NOARGS, "No current key."},
    {NULL}
};

static PyGetSetDef KeyContext_getset[] = {
    {"key", (getter)KeyContext_get_key, NULL, "the current key", NULL},
    {"kg", (getter)KeyContext_get_kg, NULL,
     "the current key's key-group index in the backend's range (None: no key)", NULL},
    {"touched", (getter)KeyContext_get_touched, (setter)KeyContext_set_touched,
     "a set every key made current is added to (None: not tracking)", NULL},
    {NULL}
};

static PyTypeObject KeyContextType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncio_ops.state._heapfast.KeyContext",
    .tp_basicsize = sizeof(KeyContext),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The current key of a heap backend.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)KeyContext_init,
    .tp_dealloc = (destructor)KeyContext_dealloc,
    .tp_traverse = (traverseproc)KeyContext_traverse,
    .tp_clear = (inquiry)KeyContext_clear,
    .tp_methods = KeyContext_methods,
    .tp_getset = KeyContext_getset,
};

typedef struct {
    PyObject_HEAD
    KeyContext *ctx;
    PyObject *groups;      /* list of dicts key -> value, one per key group, of one
                              (state, namespace) */
} ValueCell;

static int
ValueCell_traverse(ValueCell *self, visitproc visit, void *arg)
{
    Py_VISIT(self->ctx);
    Py_VISIT(self->groups);
    return 0;
}

static int
ValueCell_clear_refs(ValueCell *self)
{
    Py_CLEAR(self->ctx);
    Py_CLEAR(self->groups);
    return 0;
}

static void
ValueCell_dealloc(ValueCell *self)
{
    PyObject_GC_UnTrack(self);
    ValueCell_clear_refs(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
ValueCell_init(ValueCell *self, PyObject *args, PyObject *kwds)
{
    PyObject *ctx, *groups;
    if (!PyArg_ParseTuple(args, "O!O!", &KeyContextType, &ctx, &PyList_Type, &groups)) {
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(groups);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyDict_CheckExact(PyList_GET_ITEM(groups, i))) {
            PyErr_SetString(PyExc_TypeError, "groups must be a list of dicts");
            return -1;
        }
    }
    Py_INCREF(ctx);
    Py_XSETREF(self->ctx, (KeyContext *)ctx);
    Py_INCREF(groups);
    Py_XSETREF(self->groups, groups);
    return 0;
}

/* The current key group's dict (borrowed), or NULL with "no current key" set. */
static PyObject *
current_dict(ValueCell *self)
{
    Py_ssize_t kg = self->ctx->kg;
    if (kg < 0 || kg >= PyList_GET_SIZE(self->groups)) {
        if (kg < 0) {
            PyObject *exc = PyObject_CallNoArgs(self->ctx->no_key_error);
            if (exc != NULL) {
                PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
                Py_DECREF(exc);
            }
        } else {
            PyErr_SetString(PyExc_SystemError, "key-group index outside the state's groups");
        }
        return NULL;
    }
    return PyList_GET_ITEM(self->groups, kg);
}

static PyObject *
ValueCell_value(ValueCell *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *d = current_dict(self);
    if (d == NULL) {
        return NULL;
    }
    PyObject *v = PyDict_GetItemWithError(d, self->ctx->key);
    if (v == NULL) {
        if (PyErr_Occurred()) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    Py_INCREF(v);
    return v;
}

static PyObject *
ValueCell_remove(ValueCell *self)
{
    PyObject *d = current_dict(self);
    if (d == NULL) {
        return NULL;
    }
    PyObject *key = self->ctx->key;
    int r = PyDict_Contains(d, key);
    if (r < 0) {
        return NULL;
    }
    if (r == 1 && PyDict_DelItem(d, key) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
ValueCell_update(ValueCell *self, PyObject *value)
{
    if (value == Py_None) {
        return ValueCell_remove(self);
    }
    PyObject *d = current_dict(self);
    if (d == NULL || PyDict_SetItem(d, self->ctx->key, value) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
ValueCell_clear(ValueCell *self, PyObject *Py_UNUSED(ignored))
{
    return ValueCell_remove(self);
}

static PyMethodDef ValueCell_methods[] = {
    {"value", (PyCFunction)ValueCell_value, METH_NOARGS,
     "The current key's value, or None."},
    {"update", (PyCFunction)ValueCell_update, METH_O,
     "Set the current key's value (None clears it)."},
    {"clear", (PyCFunction)ValueCell_clear, METH_NOARGS, "Clear the current key's value."},
    {NULL}
};

static PyTypeObject ValueCellType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncio_ops.state._heapfast.ValueCell",
    .tp_basicsize = sizeof(ValueCell),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Value state without TTL of a heap backend.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)ValueCell_init,
    .tp_dealloc = (destructor)ValueCell_dealloc,
    .tp_traverse = (traverseproc)ValueCell_traverse,
    .tp_clear = (inquiry)ValueCell_clear_refs,
    .tp_methods = ValueCell_methods,
};

static struct PyModuleDef heapfast_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "asyncio_ops.state._heapfast",
    .m_doc = "The heap backend's per-record hot path in C (optional; _heap.py is the fallback).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__heapfast(void)
{
    if (PyType_Ready(&KeyContextType) < 0 || PyType_Ready(&ValueCellType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&heapfast_module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&KeyContextType);
    if (PyModule_AddObject(m, "KeyContext", (PyObject *)&KeyContextType) < 0) {
        Py_DECREF(&KeyContextType);
        Py_DECREF(m);
        return NULL;
    }
    Py_INCREF(&ValueCellType);
    if (PyModule_AddObject(m, "ValueCell", (PyObject *)&ValueCellType) < 0) {
        Py_DECREF(&ValueCellType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
