/* jit_bind.c: _C.jit_compile (source -> CUBIN through the disk cache, NVRTC run without the GIL),
 * _C.cache_key, _C.cache_dir and _C.cache_root. A compile error raises fuser.CompileError with the full
 * NVRTC log as its .log attribute; a cache directory fuser must not use raises fuser.CacheError. */
#include "binding.h"

#include "fuser/cache.h"
#include "fuser/cuda.h"

static const char *const cache_states[] = {
    [FUSER_CACHE_NONE] = "none",         [FUSER_CACHE_STORED] = "stored",
    [FUSER_CACHE_HIT] = "hit",           [FUSER_CACHE_DISABLED] = "disabled",
    [FUSER_CACHE_NOT_STORED] = "not_stored", [FUSER_CACHE_REFUSED] = "refused",
};

static PyObject *log_str(const fuser_cubin *c)
{
    return PyUnicode_DecodeUTF8(c->log ? c->log : "", c->log ? (Py_ssize_t)c->log_size : 0, "replace");
}

/* Raise for a failed compile; a CompileError carries the whole log as .log. */
static PyObject *raise_compile(fuser_state *st, const fuser_err *err, const fuser_cubin *c)
{
    if (err->code != FUSER_E_COMPILE)
        return fuser_raise(st, err);
    PyObject *exc = PyObject_CallFunction(st->CompileError, "s", err->msg), *log = log_str(c);
    if (exc && log && PyObject_SetAttrString(exc, "log", log) == 0)
        PyErr_SetObject(st->CompileError, exc);
    Py_XDECREF(exc);
    Py_XDECREF(log);
    return NULL;
}

static PyObject *kernel_list(const fuser_cubin *c)
{
    PyObject *list = PyList_New(c->n_kernels);
    for (int i = 0; list && i < c->n_kernels; i++) {
        const fuser_kernel_res *k = &c->kernels[i];
        PyObject *d = Py_BuildValue("{s:s,s:i,s:i,s:i,s:i,s:i}", "name", k->name, "registers", k->registers,
                                    "spill_store_bytes", k->spill_store_bytes, "spill_load_bytes",
                                    k->spill_load_bytes, "stack_bytes", k->stack_bytes, "shared_bytes",
                                    k->smem_bytes);
        if (!d)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, d);
    }
    return list;
}

static PyObject *result_dict(const fuser_cubin *c)
{
    PyObject *log = log_str(c), *kernels = kernel_list(c), *res = NULL;
    unsigned state = (unsigned)c->cache.state;
    if (log && kernels)
        res = Py_BuildValue("{s:y#,s:O,s:i,s:i,s:i,s:i,s:i,s:O,s:O,s:s,s:s,s:s}", "cubin", (const char *)c->data,
                            (Py_ssize_t)c->size, "log", log, "registers", c->registers, "spill_bytes",
                            c->spill_store_bytes + c->spill_load_bytes, "spill_store_bytes",
                            c->spill_store_bytes, "spill_load_bytes", c->spill_load_bytes, "shared_bytes",
                            c->smem_bytes, "kernels", kernels, "cache_hit",
                            state == FUSER_CACHE_HIT ? Py_True : Py_False, "cache_state",
                            state < sizeof cache_states / sizeof cache_states[0] ? cache_states[state] : "?",
                            "cache_note", c->cache.note, "key", c->cache.key);
    Py_XDECREF(log);
    Py_XDECREF(kernels);
    return res;
}

PyObject *fuser_py_jit_compile(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"source", "name", "options", "nvrtc_dirs", NULL};
    const char *source, *name, **opts = NULL, **dirs = NULL;
    PyObject *opts_obj = NULL, *dirs_obj = NULL, *keep_opts = NULL, *keep_dirs = NULL, *res = NULL;
    int nopts = 0, ndirs = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ss|OO:jit_compile", kwlist, &source, &name, &opts_obj,
                                     &dirs_obj))
        return NULL;
    if ((opts_obj && fuser_str_list(opts_obj, "options", &keep_opts, &opts, &nopts)) ||
        (dirs_obj && fuser_str_list(dirs_obj, "nvrtc_dirs", &keep_dirs, &dirs, &ndirs)))
        goto done;
    fuser_cubin cubin;
    fuser_err err;
    int rc;
    fuser_err_clear(&err);
    /* the strings stay alive: args hold the source and name, the keep lists the options and dirs */
    Py_BEGIN_ALLOW_THREADS
    rc = fuser_compile_cached(source, name, opts, nopts, dirs, ndirs, &cubin, NULL, &err);
    Py_END_ALLOW_THREADS
    res = rc == FUSER_OK ? result_dict(&cubin) : raise_compile(fuser_get_state(module), &err, &cubin);
    fuser_cubin_free(&cubin);
done:
    PyMem_Free(opts);
    PyMem_Free(dirs);
    Py_XDECREF(keep_opts);
    Py_XDECREF(keep_dirs);
    return res;
}

/* A {name: bytes} mapping as a header table borrowed from *keep (its items). */
static int header_table(PyObject *obj, PyObject **keep, fuser_embedded_file **out, int *n)
{
    if (!PyDict_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "headers: expected a dict of str to bytes, got %s", Py_TYPE(obj)->tp_name);
        return -1;
    }
    *keep = PyDict_Items(obj);
    if (!*keep)
        return -1;
    Py_ssize_t len = PyList_GET_SIZE(*keep);
    *out = PyMem_Calloc((size_t)len + 1, sizeof **out);
    if (!*out) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < len; i++) {
        PyObject *item = PyList_GET_ITEM(*keep, i);
        PyObject *key = PyTuple_GET_ITEM(item, 0), *val = PyTuple_GET_ITEM(item, 1);
        char *data;
        Py_ssize_t size;
        if (!PyUnicode_Check(key) || !PyBytes_Check(val)) {
            PyErr_SetString(PyExc_TypeError, "headers: expected a dict of str to bytes");
            return -1;
        }
        if (!((*out)[i].name = PyUnicode_AsUTF8(key)) || PyBytes_AsStringAndSize(val, &data, &size))
            return -1;
        (*out)[i].data = data;
        (*out)[i].size = (size_t)size;
    }
    *n = (int)len;
    return 0;
}

PyObject *fuser_py_cache_key(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"source", "name", "options", "nvrtc_version", "headers", NULL};
    const char *source, *name, **opts = NULL;
    PyObject *opts_obj = NULL, *version = NULL, *headers_obj = Py_None, *keep_opts = NULL, *keep_hdr = NULL;
    PyObject *res = NULL;
    fuser_embedded_file *hdr = NULL;
    int nopts = 0, nhdr = 0, major = 13, minor = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "ss|OOO:cache_key", kwlist, &source, &name, &opts_obj, &version,
                                     &headers_obj))
        return NULL;
    if (version == Py_None)
        major = FUSER_CACHE_ANY_NVRTC;
    else if (version && !PyArg_ParseTuple(version, "ii;nvrtc_version: expected (major, minor) or None", &major,
                                          &minor))
        return NULL;
    if (opts_obj && fuser_str_list(opts_obj, "options", &keep_opts, &opts, &nopts))
        goto done;
    if (headers_obj != Py_None && header_table(headers_obj, &keep_hdr, &hdr, &nhdr))
        goto done;
    char key[FUSER_SHA256_HEX];
    fuser_err err;
    fuser_err_clear(&err);
    if (fuser_cache_key(source, name, opts, nopts, hdr ? hdr : fuser_embedded_headers,
                        hdr ? nhdr : fuser_embedded_header_count, major, minor, key, &err))
        fuser_raise(fuser_get_state(module), &err);
    else
        res = PyUnicode_FromString(key);
done:
    PyMem_Free(opts);
    PyMem_Free(hdr);
    Py_XDECREF(keep_opts);
    Py_XDECREF(keep_hdr);
    return res;
}

/* The directory as a str (the file system's encoding), or NULL with CacheError raised for err. */
static PyObject *dir_or_raise(PyObject *module, int rc, const char *dir, const fuser_err *err)
{
    return rc == FUSER_OK ? PyUnicode_DecodeFSDefault(dir) : fuser_raise(fuser_get_state(module), err);
}

PyObject *fuser_py_cache_dir(PyObject *module, PyObject *noargs)
{
    (void)noargs;
    char dir[FUSER_CACHE_DIR_MAX];
    fuser_err err;
    fuser_err_clear(&err);
    int rc = fuser_cache_dir(dir, NULL, &err);
    return dir_or_raise(module, rc, dir, &err);
}

PyObject *fuser_py_cache_root(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"create", NULL};
    int create = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|p:cache_root", kwlist, &create))
        return NULL;
    char dir[FUSER_CACHE_DIR_MAX];
    fuser_err err;
    fuser_err_clear(&err);
    int rc = fuser_cache_root(dir, create, &err);
    return dir_or_raise(module, rc, dir, &err);
}
