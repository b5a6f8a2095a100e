/* binding.h: shared declarations of the CPython binding (the C files in python/), the only code that includes
 * Python.h. It turns core status codes into exceptions, takes tensors in through DLPack, and exposes
 * the core as the module fuser._C. */
#ifndef FUSER_BINDING_H
#define FUSER_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdatomic.h>

#include "fuser/status.h"
#include "fuser/chain.h"
#include "fuser/tensor.h"

/* At most this many exact types are taken through a registered DLPack C exchange API. */
#define FUSER_EXCHANGE_TYPES 4

/* Per-module state (PEP 489 multi-phase init): the exception types, interned names and the tensor type
 * registered for the per-call entry points. */
typedef struct {
    PyObject *FuserError;       /* RuntimeError subclass: base of fuser's environment errors */
    PyObject *CudaError;        /* FuserError: driver / launch failures */
    PyObject *CompileError;     /* FuserError: NVRTC failures; has .log */
    PyObject *CacheError;       /* FuserError: kernel cache failures */
    PyObject *UnsupportedError; /* FuserError: valid input the fused path cannot run */
    PyObject *s_dlpack, *s_dlpack_device, *s_stream, *s_max_version, *max_version; /* (1, 0) */
    PyObject *kept_names; /* tuple of the interned names kept_eager reads (KEPT_NAMES, indexed by KN_*) */
    PyObject *plan_type;  /* _C.Plan (plan_type.c) */
    /* The registered tensor type (fuser_py_register_tensor_type): torch.Tensor, whose instances the
     * per-call entry points take without __dlpack__. NULL fields: nothing registered. Registered at
     * import (fuser.interop), not while other threads call in. */
    PyObject *tensor_type;        /* instances (subclasses too) are taken */
    PyObject *tensor_exporter;    /* instance -> DLPack capsule, for those not exchanged; or NULL */
    PyObject *exchange_types;     /* tuple: the types whose exact instances are exchanged; or NULL */
    PyTypeObject *exchange_exact[FUSER_EXCHANGE_TYPES]; /* borrowed from exchange_types, for a pointer test */
    int n_exchange;
    const struct DLPackExchangeAPI *exchange;           /* their DLPack C exchange API (major 1), or NULL */
    atomic_ullong n_exchanged, n_exported;              /* tensors taken each way (tensor_intake()) */
} fuser_state;

fuser_state *fuser_get_state(PyObject *module);

/* The attribute and method names eager_bind.c reads, in the order of fuser_state.kept_names. */
#define KEPT_NAMES "forward", "_compiled_call_impl", "_forward_hooks", "_forward_pre_hooks", "_backward_hooks", \
                   "_backward_pre_hooks", "training", "_modules", "stale", "_kept", "fast", "__call__", "chunk", "_base", "requires_grad", "shape", "reshape", "t", "view", "use_gelu", "fused", "run", "new_empty"
enum {
    KN_FORWARD, KN_COMPILED, KN_HOOKS, KN_TRAINING = KN_HOOKS + 4, KN_MODULES, KN_STALE, KN_KEPT, KN_FAST, KN_CALL,
    KN_CHUNK, KN_BASE, KN_REQUIRES_GRAD, KN_SHAPE, KN_RESHAPE, KN_T, KN_VIEW, KN_USE_GELU, KN_FUSED, KN_RUN, KN_NEW_EMPTY, KN_COUNT
};

/* The pointer in a capsule of type `name` (fuser's own handles), or NULL with a TypeError saying
 * "<what>: expected <expected>". */
void *fuser_capsule_get(PyObject *obj, const char *name, const char *what, const char *expected);

/* A capsule destructor that frees its pointer (handles whose struct was malloc'ed). */
void fuser_capsule_free(PyObject *cap);

/* Raise the Python exception for a failed core call; returns NULL for `return fuser_raise(...)`. */
PyObject *fuser_raise(fuser_state *st, const fuser_err *err);

/* ---- DLPack intake (intake.c) ---- */

/* A tensor taken in through DLPack: the validated view plus the managed tensor we now own. */
typedef struct {
    fuser_tensor t;
    void *managed;  /* DLManagedTensor* or DLManagedTensorVersioned*; NULL: nothing to delete */
    int versioned;
    uint64_t flags;
} fuser_held;

enum {
    FUSER_TAKE_WRITABLE = 1,  /* the tensor will be written (out=): refuse read-only or copied exports */
    FUSER_TAKE_NO_CAPSULE = 2, /* refuse raw capsules (the caller needs to read the object again) */
    FUSER_TAKE_BORROW = 4,     /* read a raw capsule without consuming it: it stays usable, and its own
                                  destructor deletes it if nobody consumes it (capsules fuser exported) */
    FUSER_TAKE_REGISTERED = 8  /* take an instance of the registered tensor type without __dlpack__: its
                                  exact exchange types through the DLPack C exchange API (no capsule),
                                  others as a capsule of the registered exporter; refuse any other object
                                  but a raw capsule (TypeError) */
};

/* Take `obj` (an object with __dlpack__, or a "dltensor"/"dltensor_versioned" capsule) and validate
 * it. `stream` (None or int) is passed to __dlpack__ for CUDA tensors; 0 means the legacy default
 * stream and is sent as 1, as the protocol requires. On success returns 0 and fills h; on failure
 * returns -1 with an exception set. Either way the caller must call fuser_release(h) exactly once.
 * A tensor taken through the exchange API (FUSER_TAKE_REGISTERED) is described, not owned: h->t is valid
 * while `obj` is alive and unchanged, that is until the calling function returns to Python. */
int fuser_take(fuser_state *st, PyObject *obj, const char *name, PyObject *stream, int opts, fuser_held *h);

/* Describe `obj` through the registered DLPack C exchange API when its type is exactly one of the
 * exchange types (exchange.c): 1 with *out filled (where the producer has no describing function, a copy of
 * the DLTensor of h->managed, an owned DLManagedTensorVersioned, with h->versioned and h->flags set); 0 when it is not
 * such an object or the producer could not describe it (no exception set; the exporter then says why). */
int fuser_exchange_describe(fuser_state *st, PyObject *obj, DLTensor *out, fuser_held *h);

/* Call the managed tensor's deleter (once) and forget it. Safe on a zeroed or released fuser_held. */
void fuser_release(fuser_held *h);

/* A quantized FFN's scales argument: None (none), or a sequence of FUSER_NUM_SCALES entries (x, up, gate,
 * down, h: include/fuser/chain.h), each a tensor or None, taken like fuser_take's tensors (with `opts`, and
 * FUSER_TAKE_BORROW for entry i where bit i of `borrow` is set: a capsule the caller exported) into held[]
 * with their views in t[] (NULL where absent). 0, or -1 with an exception set; the caller releases held[]
 * either way. */
int fuser_take_scales(fuser_state *st, PyObject *scales, PyObject *stream, int opts, unsigned borrow,
                      fuser_held *held, const fuser_tensor **t);

/* Convert a sequence of str (argument `what`) into a NULL-terminated C array whose strings are borrowed
 * from *keep (a new list). Returns 0, or -1 with an exception set. Either way the caller releases
 * *out with PyMem_Free and *keep with Py_XDECREF (env_bind.c). */
int fuser_str_list(PyObject *seq, const char *what, PyObject **keep, const char ***out, int *n);

/* v's UTF-8 text when v is a str without NUL characters (so it is compared whole, never cut at a NUL);
 * else NULL with a TypeError or ValueError naming "<what>: '<key>'" (or "<what>" for a NULL key). */
const char *fuser_exact_str(PyObject *v, const char *what, const char *key);

/* ---- module functions, one file each ---- */
PyObject *fuser_py_dlpack_info(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fuser_py_register_tensor_type(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fuser_py_tensor_intake(PyObject *module, PyObject *noargs);
PyObject *fuser_py_tensor_layout(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fuser_py_tensor_signature(PyObject *module, PyObject *x);
PyObject *fuser_py_kept_match(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fuser_py_eager(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fuser_py_kept_eager(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fuser_py_kept_launch(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fuser_py_zero_bias_setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fuser_py_zero_bias(PyObject *module, PyObject *w_up);
PyObject *fuser_py_zero_bias_info(PyObject *module, PyObject *noargs);
PyObject *fuser_py_after_ffn(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fuser_py_install_call(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fuser_py_gate_setup(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fuser_py_gate(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fuser_py_thread_prepared(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fuser_py_gate_info(PyObject *module, PyObject *noargs);
PyObject *fuser_py_gate_source(PyObject *module, PyObject *noargs);

/* 1 where obj's attribute `name` is `want` (Py_True or Py_False), 0 otherwise, an exception cleared
 * (eager_bind.c). */
int fuser_attr_is(PyObject *obj, PyObject *name, PyObject *want);

/* The eager route's gate step act(g) * u as fuser's gate kernel, in place of g, where it applies (gate_bind.c):
 * 1 when it ran, 0 where the caller runs PyTorch's ops, -1 with an exception set. */
int fuser_gate_try(fuser_state *st, PyObject *act, PyObject *g, PyObject *u);

/* 1 where autograd would record a call on the n tensors ts (None allowed): grad mode on and one of them
 * requires grad, or the predicates gate_setup registers are not there yet; 0 where not; -1 with an exception
 * set (gate_bind.c). */
int fuser_gate_records(PyObject *const *ts, int n);

/* The FUSER_ACT_* of act, one of the activation functions gate_setup registered, or -1 (gate_bind.c). */
int fuser_act_index(PyObject *act);

/* The activation function gate_setup registered for FUSER_ACT_* a (borrowed), or NULL where nothing is
 * registered (gate_bind.c). */
PyObject *fuser_act_function(int a);

/* The eager route's ops as fuser.ffn runs them (eager_bind.c): linear and act called on t (x, w_up, w_down, w_gate,
 * b_up, b_gate, b_down; None where absent), gate and up weights that are the two row halves of one tensor packed
 * as that tensor; the down projection written into `out` where it can be (NULL or None: none). y (out where
 * written there), or NULL with an exception set. */
PyObject *fuser_eager_call(fuser_state *st, PyObject *linear, PyObject *act, PyObject *const *t, PyObject *out);

/* fuser_eager_call's ops with the packed gate-and-up weights pk given (NULL: none; see eager_bind.c's run_eager),
 * no out: y, or NULL with an exception set (eager_bind.c). */
PyObject *fuser_eager_run(fuser_state *st, PyObject *linear, PyObject *act, PyObject *const *t, PyObject *const *pk);

/* torch._addmm_activation as gate_setup registered it (borrowed), or NULL where torch has none or nothing is
 * registered (gate_bind.c). */
PyObject *fuser_addmm_activation(void);

/* 1 where no torch dispatch or function mode is active and gate_setup has registered its predicates; 0 where
 * not, -1 with an exception set (gate_bind.c). */
int fuser_no_mode(void);

/* The linear gate_setup registered for writing the down projection into a given output with its out= form
 * (borrowed), or NULL (gate_bind.c). */
PyObject *fuser_down_out_linear(void);

/* act(h) as the activation's in-place form (h overwritten, bitwise the same values, no new tensor allocated)
 * where gate_setup registered one for act, h records no autograd (h.requires_grad is False) and no torch
 * dispatch or function mode is active: the result (new reference); Py_None (new reference) where not, for the
 * caller to call act; NULL with an exception set (gate_bind.c). h must be a tensor no one else holds (an op's
 * fresh result). The in-place form is PyTorch's own op, so FUSER_DISABLE, which asks for PyTorch's ops, leaves
 * it on. */
PyObject *fuser_act_in_place(PyObject *act, PyObject *h);

/* 1 where a kept launch prepared for CUDA device `device` and raw stream `stream` (ints) may launch now: that
 * device current, its current stream that one, no torch dispatch or function mode, FUSER_DISABLE unset, and where
 * `graphs_eager` this thread prepared for the device (`_C.thread_prepared`) and no CUDA graph being captured;
 * 0 where not, -1 with an exception set (gate_bind.c). */
int fuser_launch_may_run(PyObject *device, PyObject *stream, int graphs_eager);

/* The raw stream (an int, new reference) a fused route prepared for CUDA device `device` (an int) launches on
 * now: that device current, FUSER_DISABLE unset, and where `graphs_eager` this thread prepared for the device and
 * no CUDA graph being captured; Py_None where not (the route's Python run then decides), NULL with an exception
 * set (gate_bind.c). */
PyObject *fuser_route_stream(PyObject *device, int graphs_eager);

/* 1 where the eager route may run a step of a call on x as other ops than PyTorch's reference ones: x a CUDA
 * tensor, no torch dispatch or function mode, FUSER_DISABLE unset, and autograd recording nothing on x and
 * the n tensors ts (None allowed); 0 where not, -1 with an exception set (gate_bind.c). */
int fuser_eager_may_fuse(PyObject *x, PyObject *const *ts, int n);
PyObject *fuser_py_ffn_check(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fuser_py_ffn_key(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fuser_py_ffn_kept(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fuser_py_env(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fuser_py_embedded_headers(PyObject *module, PyObject *noargs);
PyObject *fuser_py_search(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fuser_py_derive(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fuser_py_simulate(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fuser_py_targets(PyObject *module, PyObject *noargs);
PyObject *fuser_py_target_for_device(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fuser_py_rules(PyObject *module, PyObject *noargs);
PyObject *fuser_py_codegen(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fuser_py_jit_compile(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fuser_py_cache_key(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fuser_py_cache_dir(PyObject *module, PyObject *noargs);
PyObject *fuser_py_cache_root(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fuser_py_parse_flag(PyObject *module, PyObject *args);
PyObject *fuser_py_probe_load(PyObject *module, PyObject *args);
PyObject *fuser_py_probe_launch(PyObject *module, PyObject *args);
PyObject *fuser_py_probe_clusters(PyObject *module, PyObject *args);

/* ---- plans and targets from Python objects (plan_bind.c); -1 with an exception set on failure ---- */
struct fuser_plan;
struct fuser_target;
int fuser_target_from_obj(PyObject *obj, struct fuser_target *t);
int fuser_plan_from_dict(PyObject *d, const struct fuser_target *t, struct fuser_plan *p);
/* p (its chain and searched fields set) derived, checked against t and costed on it: 0, or -1 with a ValueError
 * naming the first rule or limit it breaks (plan_bind.c). */
int fuser_plan_finish(struct fuser_plan *p, const struct fuser_target *t);
/* A plan given as a _C.Plan (plan_type.c) or a dict, derived, checked and costed on t. */
int fuser_plan_from_obj(fuser_state *st, PyObject *obj, const struct fuser_target *t, struct fuser_plan *p);
/* New _C.Plan holding p, derived on t (plan_type.c); NULL with an exception set. */
PyObject *fuser_plan_object_new(fuser_state *st, const struct fuser_plan *p, const struct fuser_target *t);
/* Add the _C.Plan type to the module (its module state's plan_type); -1 with an exception set. */
int fuser_plan_type_add(PyObject *module, fuser_state *st);
/* A plan's and a target's fields as dicts (plan_bind.c). */
PyObject *fuser_plan_to_dict(const struct fuser_plan *p);
PyObject *fuser_target_to_dict(const struct fuser_target *t);

PyObject *fuser_py_load_kernel(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fuser_py_ffn_launch(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fuser_py_ffn_prepare(PyObject *module, PyObject *args, PyObject *kwargs);
PyObject *fuser_py_ffn_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fuser_py_kernel_info(PyObject *module, PyObject *args);
PyObject *fuser_py_scratch_need(PyObject *module, PyObject *args);
PyObject *fuser_py_stream_exact_boxes(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fuser_py_stream_lead_bytes(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fuser_py_gemm_launch(PyObject *module, PyObject *args);
PyObject *fuser_py_scratch_alloc(PyObject *module, PyObject *args);

#endif /* FUSER_BINDING_H */
