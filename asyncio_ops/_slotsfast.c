/*
 * Constructors of slotted classes in C: ``Constructor(cls, fields)`` is a callable
 * that takes one positional argument per field and returns a new instance of
 * ``cls`` with those slots set, in order, without running ``cls.__new__`` or
 * ``__init__`` (``asyncio_ops._construct`` says when that is allowed, and is the
 * fallback when this module is not built).
 *
 * Checked once, when the constructor is made: ``cls`` is a type whose instances
 * have no ``__dict__``, and each field is a writable object slot of it
 * (a member descriptor of type T_OBJECT_EX). A call allocates the instance with
 * the type's own allocator (garbage-collected types come back tracked, their
 * slots NULL), then stores a new reference to each argument in its slot; it
 * allocates nothing else, so no collection can see a half-built instance.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define MAX_FIELDS 8

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyTypeObject *cls;
    Py_ssize_t n;
    Py_ssize_t offsets[MAX_FIELDS];
} Constructor;

static PyObject *
Constructor_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Constructor *c = (Constructor *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
        PyErr_Format(PyExc_TypeError, "a constructor of %s takes positional arguments only",
                     c->cls->tp_name);
        return NULL;
    }
    if (nargs != c->n) {
        PyErr_Format(PyExc_TypeError, "a constructor of %s takes %zd arguments, got %zd",
                     c->cls->tp_name, c->n, nargs);
        return NULL;
    }
    PyObject *obj = c->cls->tp_alloc(c->cls, 0);
    if (obj == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        PyObject **slot = (PyObject **)((char *)obj + c->offsets[i]);
        Py_INCREF(args[i]);
        *slot = args[i];
    }
    return obj;
}

static int
Constructor_traverse(Constructor *self, visitproc visit, void *arg)
{
    Py_VISIT(self->cls);
    return 0;
}

static int
Constructor_clear(Constructor *self)
{
    Py_CLEAR(self->cls);
    return 0;
}

static void
Constructor_dealloc(Constructor *self)
{
    PyObject_GC_UnTrack(self);
    Constructor_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Constructor_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *cls, *fields;
    static char *kwlist[] = {"cls", "fields", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!", kwlist, &PyType_Type, &cls,
                                     &PyTuple_Type, &fields)) {
        return NULL;
    }
    PyTypeObject *t = (PyTypeObject *)cls;
    Py_ssize_t n = PyTuple_GET_SIZE(fields);
    if (n > MAX_FIELDS) {
        PyErr_Format(PyExc_ValueError, "a constructor sets at most %d fields, got %zd",
                     MAX_FIELDS, n);
        return NULL;
    }
    if (t->tp_dictoffset != 0) {
        PyErr_Format(PyExc_TypeError, "%s has a __dict__: only slotted classes", t->tp_name);
        return NULL;
    }
    Constructor *self = (Constructor *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(fields, i);
        if (!PyUnicode_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "fields must be strings");
            Py_DECREF(self);
            return NULL;
        }
        /* the descriptor in the class's own namespace (a subclass's slot would be
           another offset) */
        PyObject *d = PyDict_GetItemWithError(t->tp_dict, name);
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type)) {
            if (!PyErr_Occurred()) {
                PyErr_Format(PyExc_TypeError, "%s has no slot %R", t->tp_name, name);
            }
            Py_DECREF(self);
            return NULL;
        }
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type != T_OBJECT_EX || (m->flags & READONLY)) {
            PyErr_Format(PyExc_TypeError, "%s.%U is not a writable object slot", t->tp_name,
                         name);
            Py_DECREF(self);
            return NULL;
        }
        self->offsets[i] = m->offset;
    }
    Py_INCREF(cls);
    self->cls = t;
    self->n = n;
    self->vectorcall = Constructor_vectorcall;
    return (PyObject *)self;
}

static PyObject *
Constructor_repr(Constructor *self)
{
    return PyUnicode_FromFormat("<constructor of %s>", self->cls->tp_name);
}

static PyTypeObject ConstructorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "asyncio_ops._slotsfast.Constructor",
    .tp_doc = "Constructor(cls, fields): a callable building cls with its slots set.",
    .tp_basicsize = sizeof(Constructor),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = Constructor_new,
    .tp_dealloc = (destructor)Constructor_dealloc,
    .tp_traverse = (traverseproc)Constructor_traverse,
    .tp_clear = (inquiry)Constructor_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Constructor, vectorcall),
    .tp_repr = (reprfunc)Constructor_repr,
};

static struct PyModuleDef slotsfast_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "asyncio_ops._slotsfast",
    .m_doc = "Constructors of slotted classes in C (see asyncio_ops._construct).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__slotsfast(void)
{
    if (PyType_Ready(&ConstructorType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&slotsfast_module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&ConstructorType);
    if (PyModule_AddObject(m, "Constructor", (PyObject *)&ConstructorType) < 0) {
        Py_DECREF(&ConstructorType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
