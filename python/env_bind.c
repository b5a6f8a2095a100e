/* env_bind.c: _C.env (driver, GPU, NVRTC, cache, fused-path availability), _C.parse_flag (the one parser
 * of boolean environment variables, env.h) and _C.embedded_headers, and the str-sequence helper the
 * bindings share. */
#include "binding.h"

#include "fuser/cuda.h"
#include "fuser/embedded.h"
#include "fuser/env.h"

int fuser_str_list(PyObject *seq, const char *what, PyObject **keep, const char ***out, int *n)
{
    *keep = NULL;
    *out = NULL;
    if (PyUnicode_Check(seq) || PyBytes_Check(seq)) { /* a lone string is a sequence too, of letters */
        PyErr_Format(PyExc_TypeError, "%s: expected a sequence of str, got a single %s", what,
                     Py_TYPE(seq)->tp_name);
        return -1;
    }
    *keep = PySequence_List(seq);
    if (!*keep)
        return -1;
    Py_ssize_t len = PyList_GET_SIZE(*keep);
    *out = PyMem_Calloc((size_t)len + 1, sizeof(char *));
    if (!*out) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *s = PyList_GET_ITEM(*keep, i);
        if (!PyUnicode_Check(s)) {
            PyErr_Format(PyExc_TypeError, "%s: expected str entries, got %s", what, Py_TYPE(s)->tp_name);
            return -1;
        }
        (*out)[i] = PyUnicode_AsUTF8(s);
        if (!(*out)[i])
            return -1;
    }
    *n = (int)len;
    return 0;
}

PyObject *fuser_py_env(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"device", "nvrtc_dirs", NULL};
    int device = 0;
    PyObject *dirs_obj = NULL, *keep = NULL, *res = NULL;
    const char **dirs = NULL;
    int ndirs = 0;
    (void)module;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|iO:env", kwlist, &device, &dirs_obj))
        return NULL;
    if (dirs_obj && fuser_str_list(dirs_obj, "nvrtc_dirs", &keep, &dirs, &ndirs))
        goto done;
    fuser_env e;
    Py_BEGIN_ALLOW_THREADS
    fuser_env_query(device, dirs, ndirs, &e);
    Py_END_ALLOW_THREADS
    res = Py_BuildValue(
        "{s:O,s:s,s:i,s:i,s:i,s:s,s:(ii),s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:O,s:O,s:s,s:(ii),s:s,s:O,s:s}",
        "driver_found", e.driver_found ? Py_True : Py_False, "driver_path", e.driver_path, "driver_version",
        e.driver_version, "device_count", e.device_count, "device", e.device, "gpu_name", e.gpu_name,
        "compute_capability", e.cc_major, e.cc_minor, "sm_count", e.sm_count, "smem_per_block_optin",
        e.smem_per_block_optin, "smem_per_sm", e.smem_per_sm, "l2_bytes", e.l2_bytes, "clock_khz", e.clock_khz,
        "mem_clock_khz", e.mem_clock_khz, "mem_bus_bits", e.mem_bus_bits, "cluster_launch",
        e.cluster_launch ? Py_True : Py_False, "nvrtc_found", e.nvrtc_found ? Py_True : Py_False, "nvrtc_path",
        e.nvrtc_path, "nvrtc_version", e.nvrtc_major, e.nvrtc_minor, "cache_dir", e.cache_dir,
        "fused_available", e.fused_available ? Py_True : Py_False, "why", e.why);
done:
    PyMem_Free(dirs);
    Py_XDECREF(keep);
    return res;
}

PyObject *fuser_py_parse_flag(PyObject *module, PyObject *args)
{
    const char *name, *value;
    int on;
    fuser_err err;
    fuser_err_clear(&err);
    if (!PyArg_ParseTuple(args, "sz:parse_flag", &name, &value))
        return NULL;
    if (fuser_parse_flag(name, value, &on, &err) != FUSER_OK)
        return fuser_raise(fuser_get_state(module), &err);
    return PyBool_FromLong(on);
}

PyObject *fuser_py_embedded_headers(PyObject *module, PyObject *noargs)
{
    (void)module;
    (void)noargs;
    PyObject *d = PyDict_New();
    for (int i = 0; d && i < fuser_embedded_header_count; i++) {
        const fuser_embedded_file *f = &fuser_embedded_headers[i];
        PyObject *b = PyBytes_FromStringAndSize(f->data, (Py_ssize_t)f->size);
        if (!b || PyDict_SetItemString(d, f->name, b)) {
            Py_XDECREF(b);
            Py_CLEAR(d);
            break;
        }
        Py_DECREF(b);
    }
    return d;
}
