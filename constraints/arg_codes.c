/* The type code of each argument of an ahead-of-time kernel call, in one C call (constraints/
 * arg_codes.py): what native.Kernel checks before every call, where Python's per-argument check
 * costs about 0.2 us an argument. A code is a small int that determines the argument's numba
 * type as native._arg_type writes it:
 *   an ndarray of a built-in numeric or bool dtype in native byte order: from its type number,
 *     dimensions, layout (C, else F, else A) and whether it is read-only;
 *   Python's bool, int and float: 1, 2, 3; a numpy scalar of a numeric or bool type: 8 + its
 *     type number.
 * Anything else (another type, a subclass, a byte-swapped or flexible dtype) has no code: codes()
 * returns None for the call, and the caller checks it in Python. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <numpy/arrayscalars.h>

static int numeric(int type_num) { return (type_num >= NPY_BOOL && type_num <= NPY_CLONGDOUBLE) || type_num == NPY_HALF; }

static long code_of(PyObject *x) {
    if (PyArray_CheckExact(x)) {
        PyArrayObject *a = (PyArrayObject *)x;
        PyArray_Descr *d = PyArray_DESCR(a);
        int nd = PyArray_NDIM(a), flags = PyArray_FLAGS(a);
        if (!numeric(d->type_num) || PyArray_ISBYTESWAPPED(a) || nd > 32) return -1;
        int layout = (flags & NPY_ARRAY_C_CONTIGUOUS) ? 0 : ((flags & NPY_ARRAY_F_CONTIGUOUS) ? 1 : 2);
        int ro = (flags & NPY_ARRAY_WRITEABLE) ? 0 : 1;
        return 1024 + (((long)d->type_num * 33 + nd) * 3 + layout) * 2 + ro;
    }
    if (PyBool_Check(x)) return 1;
    if (PyLong_CheckExact(x)) return 2;
    if (PyFloat_CheckExact(x)) return 3;
    if (PyArray_IsScalar(x, Generic)) {
        PyArray_Descr *d = PyArray_DescrFromScalar(x);
        if (d == NULL) {
            PyErr_Clear();
            return -1;
        }
        long c = (numeric(d->type_num) && PyArray_ISNBO(d->byteorder)) ? 8 + d->type_num : -1;
        Py_DECREF(d);
        return c;
    }
    return -1;
}

static PyObject *codes(PyObject *self, PyObject *args) {
    if (!PyTuple_Check(args)) {
        PyErr_SetString(PyExc_TypeError, "codes() takes a tuple");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    PyObject *out = PyTuple_New(n);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        long c = code_of(PyTuple_GET_ITEM(args, i));
        if (c < 0) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        PyObject *v = PyLong_FromLong(c);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, v);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"codes", codes, METH_O, "codes(args: tuple) -> tuple of ints, or None where an argument has no code"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, NULL, NULL, -1, methods};

PyMODINIT_FUNC ARG_CODES_INIT(void) {
    import_array();
    module.m_name = ARG_CODES_NAME;
    return PyModule_Create(&module);
}
