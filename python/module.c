/* module.c: the extension module fuser._C: multi-phase initialisation (PEP 489), module state holding
 * the exception types, the method table, and the mapping from core status codes to exceptions. */
#include "binding.h"
#include "fuser/ffn_launch.h"

#include <stdlib.h>

PyDoc_STRVAR(module_doc,
             "fuser._C: the C core of fuser (planner, code generator, NVRTC JIT, DLPack intake).\n\n"
             "Use the Python package `fuser`; this module is its implementation detail.");

fuser_state *fuser_get_state(PyObject *module)
{
    return (fuser_state *)PyModule_GetState(module);
}

PyObject *fuser_raise(fuser_state *st, const fuser_err *err)
{
    PyObject *type;
    switch (err->code) {
    case FUSER_E_TYPE: type = PyExc_TypeError; break;
    case FUSER_E_VALUE: type = PyExc_ValueError; break;
    case FUSER_E_NOMEM: type = PyExc_MemoryError; break;
    case FUSER_E_UNSUPPORTED: type = st->UnsupportedError; break;
    case FUSER_E_CUDA: type = st->CudaError; break;
    case FUSER_E_COMPILE: type = st->CompileError; break;
    case FUSER_E_CACHE: type = st->CacheError; break;
    default: type = st->FuserError; break;
    }
    PyErr_SetString(type, err->msg[0] ? err->msg : "fuser: unknown error");
    return NULL;
}

void *fuser_capsule_get(PyObject *obj, const char *name, const char *what, const char *expected)
{
    void *p = PyCapsule_IsValid(obj, name) ? PyCapsule_GetPointer(obj, name) : NULL;
    if (!p)
        PyErr_Format(PyExc_TypeError, "%s: expected %s", what, expected);
    return p;
}

void fuser_capsule_free(PyObject *cap)
{
    free(PyCapsule_GetPointer(cap, PyCapsule_GetName(cap)));
}

PyDoc_STRVAR(dlpack_info_doc,
             "dlpack_info(obj, stream=None, writable=False) -> dict\n\n"
             "Take `obj` in through DLPack exactly as fuser's ops do (an object with __dlpack__, or a\n"
             "'dltensor'/'dltensor_versioned' capsule, which is consumed), validate it, release it, and\n"
             "describe it: data pointer, shape, dtype, device, whether the capsule was versioned.");
PyDoc_STRVAR(ffn_check_doc,
             "ffn_check(x, w_up, w_down, w_gate=None, b_up=None, b_gate=None, b_down=None,\n"
             "          activation='gelu', out=None, stream=None) -> dict\n\n"
             "Validate fuser.ffn's arguments through DLPack and return the chain they describe.");
PyDoc_STRVAR(env_doc,
             "env(device=0, nvrtc_dirs=()) -> dict\n\n"
             "Find the CUDA driver and NVRTC (loading them on first use) and describe the GPU `device`,\n"
             "the cache directory, and whether the fused path is available or exactly why not.");
PyDoc_STRVAR(embedded_headers_doc,
             "embedded_headers() -> dict[str, bytes]\n\n"
             "The kernel templates (include/fuser/device/*.cuh) embedded at build time, by include name.");
PyDoc_STRVAR(jit_compile_doc,
             "jit_compile(source, name, options=(), nvrtc_dirs=()) -> dict\n\n"
             "Compile CUDA `source` for sm_90a through the disk cache (NVRTC runs without the GIL). Returns\n"
             "cubin, log, registers, spill_bytes, shared_bytes, kernels, cache_hit, cache_state, cache_note\n"
             "and key. A compile error raises CompileError with the full log as .log.");
PyDoc_STRVAR(cache_key_doc,
             "cache_key(source, name, options=(), nvrtc_version=(13, 0), headers=None) -> str\n\n"
             "The kernel-cache key of a compile (nvrtc_version=None: the any-NVRTC alias key; headers: a\n"
             "{name: bytes} dict in place of the embedded kernel templates).");
PyDoc_STRVAR(cache_dir_doc, "cache_dir() -> str\n\nThe kernel cache directory chosen by the environment (entries live\n"
             "under its v2/). A path too long to use raises CacheError naming the variable and the length.");
PyDoc_STRVAR(cache_root_doc,
             "cache_root(create=False) -> str\n\nThe kernel cache directory if fuser may read and write it (with\n"
             "create, a missing one is made, mode 0700). CacheError says why not: its path is too long, or it is\n"
             "not a directory, belongs to another user, or group or others may write it.");
PyDoc_STRVAR(parse_flag_doc,
             "parse_flag(name, value) -> bool\n\nThe value of boolean environment variable `name` (None: unset):\n"
             "1/0, true/false, yes/no, on/off in any case, empty = off. Anything else raises ValueError naming\n"
             "the variable, the value and the spellings.");

static PyObject *fuser_py_fp8_rowwise(PyObject *self, PyObject *arg)
{
    (void)self;
    const long long m = PyLong_AsLongLong(arg);
    if (m == -1 && PyErr_Occurred())
        return NULL;
    return PyBool_FromLong(fuser_fp8_rowwise(m));
}

static PyMethodDef module_methods[] = {
    {"dlpack_info", (PyCFunction)(void (*)(void))fuser_py_dlpack_info, METH_VARARGS | METH_KEYWORDS,
     dlpack_info_doc},
    {"ffn_check", (PyCFunction)(void (*)(void))fuser_py_ffn_check, METH_VARARGS | METH_KEYWORDS, ffn_check_doc},
    {"ffn_key", (PyCFunction)(void (*)(void))fuser_py_ffn_key, METH_FASTCALL,
     "ffn_key(x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation[, scales]) -> bytes: validate\n"
     "fuser.ffn's tensors (instances of the registered tensor type, or None; a quantized chain's scales\n"
     "(x, up, gate, down, h) likewise) as ffn_check does and return what the call's route depends on (the\n"
     "chain and the device), to key a dict of routes."},
    {"ffn_kept", (PyCFunction)(void (*)(void))fuser_py_ffn_kept, METH_FASTCALL,
     "ffn_kept(routes, linear, x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation) -> y or None: fuser.ffn's\n"
     "call by the fresh route `routes` keeps under its route key (ffn_key's), in one crossing: an eager route's ops\n"
     "run here (eager's, with `linear` and the registered activation), any other route's run(...) gets the call;\n"
     "None where no fresh route is kept for the key or ffn_key refuses the arguments."},
    {"register_tensor_type", (PyCFunction)(void (*)(void))fuser_py_register_tensor_type,
     METH_VARARGS | METH_KEYWORDS,
     "register_tensor_type(type, exporter=None, exchange=()) -> (major, minor) or None: let ffn_key take\n"
     "instances of `type` (torch.Tensor) directly: exact instances of the `exchange` types (type or its\n"
     "subclasses, carrying the same __dlpack_c_exchange_api__) through that DLPack C exchange API, without\n"
     "a capsule; other instances as the capsule `exporter(obj)` returns. Returns the exchange API's version\n"
     "(None: none used). register_tensor_type(None) forgets the type."},
    {"tensor_layout", (PyCFunction)(void (*)(void))fuser_py_tensor_layout, METH_FASTCALL,
     "tensor_layout(*tensors) -> bytes or None: each tensor's data address, device, dtype, shape and strides\n"
     "(None: a marker), read through the registered DLPack C exchange API; None where a tensor is not of an\n"
     "exchange type or cannot be described. Equal bytes: the same memory seen the same way."},
    {"tensor_signature", fuser_py_tensor_signature, METH_O,
     "tensor_signature(x) -> bytes or None: x's exact type, device, dtype and shape as tensor_layout reads\n"
     "them (no address, no strides); None where tensor_layout would give None."},
    {"kept_match", (PyCFunction)(void (*)(void))fuser_py_kept_match, METH_FASTCALL,
     "kept_match(x, signature, held, layout, laid=-1) -> int or None: the check of FusedFFN's kept routes.\n"
     "None unless x has tensor_signature `signature`, every row (registry, name, owner, parameters, pname,\n"
     "p, ...) of `held` still holds (registry[name] is owner, parameters[pname] is p) and the p's of the rows\n"
     "in the bit mask `laid` (bit i: row i; -1: all) have tensor_layout `layout`; then x's data address where\n"
     "x is contiguous row-major, else 0."},
    {"eager", (PyCFunction)(void (*)(void))fuser_py_eager, METH_FASTCALL,
     "eager(linear, act, x, w_up, w_down, w_gate, b_up, b_gate, b_down[, packed, packed_bias, pack]) -> y: the\n"
     "eager route's ops, fuser.reference.eager's calls in its order (linear: torch.nn.functional.linear; act: a\n"
     "value of fuser.reference.ACTIVATIONS; absent tensors None). packed: a gated chain's gate and up weights as\n"
     "one tensor (packed_bias: their biases, or None), one GEMM for both; pack: 1 where the gate's rows come\n"
     "first, + 2 where packed is a detached view (used only where autograd records nothing)."},
    {"zero_bias_setup", (PyCFunction)(void (*)(void))fuser_py_zero_bias_setup, METH_FASTCALL,
     "zero_bias_setup(make, min_tokens) -> (make, min_tokens) as they were: a plain chain without b_up whose\n"
     "activation is ReLU or tanh GELU runs eager with it in the up GEMM's epilogue over a zero bias from\n"
     "min_tokens token rows on (0: never; else at least 2), the bias made once per device, dtype and d_ff by\n"
     "make(w_up) (a zero tensor of w_up's rows, dtype and device, or None to run the ops) and kept for the\n"
     "process, across setups (fuser.runtime registers its maker at import)."},
    {"zero_bias", fuser_py_zero_bias, METH_O,
     "zero_bias(w_up) -> the zero bias kept for w_up's rows, dtype and device (made now by the registered maker\n"
     "where none is kept: not while a graph is captured), or None where there is none to take."},
    {"zero_bias_info", fuser_py_zero_bias_info, METH_NOARGS,
     "zero_bias_info() -> {'min_tokens': n, 'kept': the zero biases made and kept}"},
    {"kept_eager", (PyCFunction)(void (*)(void))fuser_py_kept_eager, METH_FASTCALL,
     "kept_eager(d, x, k) -> y or None: FusedFFN's kept eager route in one call. d: the module's __dict__;\n"
     "k: the route's fields (fuser.module's _KeptEagerFast). None where nn.Module.__call__ would do more\n"
     "than call forward, the route is stale, a dropout between the GEMMs or the module's own training\n"
     "forward is active, or kept_match(x, ...) fails; else the eager ops' output."},
    {"kept_launch", (PyCFunction)(void (*)(void))fuser_py_kept_launch, METH_FASTCALL,
     "kept_launch(d, x, k) -> y or None: FusedFFN's kept launch in one call. d: the module's __dict__; k: the\n"
     "launch's fields (fuser.module's _KeptLaunchFast). None where kept_eager's module checks fail, kept_match(x,\n"
     "...) fails or x is not 16-byte aligned, the device, stream or scratch is not the one prepared for, a torch\n"
     "mode, autocast, FUSER_DISABLE or autograd applies, or a host-bound route's stream captures a graph; else a\n"
     "new y the prepared launch writes."},
    {"install_call", (PyCFunction)(void (*)(void))fuser_py_install_call, METH_FASTCALL,
     "install_call(cls, is_compiling, flag_owner, flag, nn_module): instances of cls (FusedFFN) called as m(x) run\n"
     "its kept route (the eager ops, or the kept launch) from C where FusedFFN.__call__ would run it; a call that\n"
     "route declines goes to\n"
     "nn_module.__call__ (as FusedFFN.__call__ sends it), every other call to cls.__call__ as written in Python.\n"
     "flag_owner.flag: what is_compiling() returns outside TorchScript (flag None: call is_compiling)."},
    {"gate_setup", (PyCFunction)(void (*)(void))fuser_py_gate_setup, METH_FASTCALL,
     "gate_setup(loader, acts, capturing, dispatch_len, function_mode, current_device, raw_stream, disabled,\n"
     "grad_enabled, addmm_activation, acts_in_place, down_out): what\n"
     "the eager route's gate kernel needs (fuser.runtime registers it at import): loader(device) -> the gate\n"
     "kernels' CUBIN (bytes) or why there is none (str); acts: the activation functions in FUSER_ACT_* order;\n"
     "then torch's predicates and fuser's FUSER_DISABLE, read at each call; torch._addmm_activation or None\n"
     "(the eager route's up projection with its ReLU or tanh GELU in cuBLASLt's epilogue); acts_in_place: the\n"
     "activations' in-place forms in FUSER_ACT_* order, each a function of one tensor or None (the eager route's\n"
     "activation on the up projection's own result, where no autograd records it); down_out: the linear whose out=\n"
     "form writes the eager route's down projection into a caller's out (torch.nn.functional.linear), or None."},
    {"gate", (PyCFunction)(void (*)(void))fuser_py_gate, METH_FASTCALL,
     "gate(g, u, act) -> bool: g = act(g) * u in place by fuser's gate kernel (bitwise PyTorch's two ops) where\n"
     "it applies: plain compact 16-bit CUDA tensors of one shape on the current device, no autograd, no torch\n"
     "mode, FUSER_DISABLE unset, act a value of fuser.reference.ACTIVATIONS. False (g untouched) elsewhere: run\n"
     "the ops."},
    {"thread_prepared", (PyCFunction)(void (*)(void))fuser_py_thread_prepared, METH_FASTCALL,
     "thread_prepared(device[, mark]) -> bool: whether this thread has made, on CUDA device `device`, what a\n"
     "host-bound route's graphs take and a capture cannot make (PyTorch's per-thread cuBLAS handles); `mark`\n"
     "True records that it has. Until then the C paths leave a host-bound route's launches to Python, which\n"
     "makes them (fuser.route). Devices outside 0-63 are not tracked: always True."},
    {"gate_info", fuser_py_gate_info, METH_NOARGS,
     "gate_info() -> {'launches': n, 'devices': {device: 'ready' | 'loading' | 'unavailable: why'}}"},
    {"gate_source", fuser_py_gate_source, METH_NOARGS,
     "gate_source() -> str: the CUDA translation unit of the gate kernels"},
    {"after_ffn", (PyCFunction)(void (*)(void))fuser_py_after_ffn, METH_FASTCALL,
     "after_ffn(d, name, dropouts, y) -> the output: the dropout `name` after a FusedFFN (d: its __dict__)\n"
     "applied to y, its call left out where it is exactly one of `dropouts`, not training, with no hook of\n"
     "its own and no forward or compiled call on the instance (the caller has checked the global hooks):\n"
     "the identity then."},
    {"tensor_intake", fuser_py_tensor_intake, METH_NOARGS,
     "tensor_intake() -> dict: the registered tensor type, exporter, exchange types and API version, and\n"
     "how many tensors were taken each way (exchanged, exported) since the module was loaded."},
    {"env", (PyCFunction)(void (*)(void))fuser_py_env, METH_VARARGS | METH_KEYWORDS, env_doc},
    {"embedded_headers", fuser_py_embedded_headers, METH_NOARGS, embedded_headers_doc},
    {"search", (PyCFunction)(void (*)(void))fuser_py_search, METH_VARARGS | METH_KEYWORDS,
     "search(chain, target, k=1, constraints=None) -> (plans, stats): the k best plans (_C.Plan objects)."},
    {"derive", (PyCFunction)(void (*)(void))fuser_py_derive, METH_VARARGS | METH_KEYWORDS,
     "derive(plan, target) -> Plan: validate, re-derive and re-cost a plan (a _C.Plan or a plan dict) on target."},
    {"simulate", (PyCFunction)(void (*)(void))fuser_py_simulate, METH_VARARGS | METH_KEYWORDS,
     "simulate(plan, target, x, w_up, w_down, w_gate, b_up, b_gate, b_down, y) -> (traffic, barriers, flops)."},
    {"targets", fuser_py_targets, METH_NOARGS, "targets() -> the built-in GPU targets."},
    {"target_for_device", (PyCFunction)(void (*)(void))fuser_py_target_for_device, METH_VARARGS | METH_KEYWORDS,
     "target_for_device(name, cc, sm_count, ...) -> a target built from a device's properties."},
    {"fp8_rowwise", fuser_py_fp8_rowwise, METH_O,
     "fp8_rowwise(m) -> bool: whether PyTorch's FP8 ops (fuser.fp8.eager) run, and the planner prices,\n"
     "rowwise GEMMs at m tokens (fuser_fp8_rowwise)."},
    {"rules", fuser_py_rules, METH_NOARGS, "rules() -> [(name, level, why)]: the pruning rules."},
    {"load_kernel", (PyCFunction)(void (*)(void))fuser_py_load_kernel, METH_VARARGS | METH_KEYWORDS,
     "load_kernel(plan, target, cubin, device) -> kernel: load a compiled plan onto a GPU."},
    {"ffn_launch", (PyCFunction)(void (*)(void))fuser_py_ffn_launch, METH_VARARGS | METH_KEYWORDS,
     "ffn_launch(kernel, x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation, y, scratch, stream, borrow=0,\n"
     "trace=None, overlap=True): validate the tensors against the kernel's chain and launch it on the stream.\n"
     "Capsules are consumed, except those whose bit is set in borrow (bit 0 = x ... bit 7 = y): read only,\n"
     "reusable. overlap=False: a stream kernel does not start before the stream's previous kernel ends."},
    {"ffn_prepare", (PyCFunction)(void (*)(void))fuser_py_ffn_prepare, METH_VARARGS | METH_KEYWORDS,
     "ffn_prepare(kernel, x, w_up, w_down, w_gate, b_up, b_gate, b_down, activation, y, scratch, stream, borrow=0,\n"
     "overlap=True, keep=True) -> prepared: validate as ffn_launch does and fill the launch once. It keeps the\n"
     "kernel, the scratch and (keep=True; weight capsules must then be borrowed) the weights alive; with\n"
     "keep=False every ffn_run passes the weights' addresses."},
    {"ffn_run", (PyCFunction)(void (*)(void))fuser_py_ffn_run, METH_FASTCALL,
     "ffn_run(prepared, x_ptr, y_ptr[, w_up, w_down, w_gate, b_up, b_gate, b_down]): launch a prepared launch\n"
     "at these addresses (None: the prepared one; a torch tensor: its data_ptr(), read in C) on its stream.\n"
     "Unchecked beyond presence and 16-byte alignment: the caller guarantees tensors of the prepared shapes,\n"
     "dtype and device."},
    {"kernel_info", fuser_py_kernel_info, METH_VARARGS, "kernel_info(kernel) -> dict of the loaded function."},
    {"scratch_need", fuser_py_scratch_need, METH_VARARGS,
     "scratch_need(kernel, m) -> (zeroed words, workspace floats) a launch with m tokens needs."},
    {"stream_exact_boxes", (PyCFunction)(void (*)(void))fuser_py_stream_exact_boxes, METH_FASTCALL,
     "stream_exact_boxes([on]) -> the setting before the call: stream launches prepared from now on read a ragged\n"
     "last row tile's token rows only (True, the default), or whole row tiles with TMA's zero fill past the last\n"
     "row (False, slower). Process-wide, for timing both; a prepared launch or a captured graph keeps what it was\n"
     "made with."},
    {"stream_lead_bytes", (PyCFunction)(void (*)(void))fuser_py_stream_lead_bytes, METH_FASTCALL,
     "stream_lead_bytes([bytes]) -> the setting before the call: stream launches prepared from now on keep about\n"
     "this many bytes per block in flight in the ring's first pass (131072, the default), or request the whole ring\n"
     "at once (0), in 16-bit single-block plans (cluster pairs and FP8 chains always take the whole ring; ungated\n"
     "swap-AB tiles of 16-32 token rows three quarters of the setting).\n"
     "Process-wide, for timing both; a prepared launch or a captured graph keeps what it was made with."},
    {"scratch_alloc", fuser_py_scratch_alloc, METH_VARARGS,
     "scratch_alloc(device, tickets_cap, ws_floats, stream) -> scratch: zeroed tickets + workspace, allocated\n"
     "with the driver's stream-ordered allocator (outside torch's, so CUDA-graph pools never see it)."},
    {"codegen", (PyCFunction)(void (*)(void))fuser_py_codegen, METH_VARARGS | METH_KEYWORDS,
     "codegen(plan, target) -> str: the CUDA specialisation of a fused plan."},
    {"jit_compile", (PyCFunction)(void (*)(void))fuser_py_jit_compile, METH_VARARGS | METH_KEYWORDS,
     jit_compile_doc},
    {"cache_key", (PyCFunction)(void (*)(void))fuser_py_cache_key, METH_VARARGS | METH_KEYWORDS, cache_key_doc},
    {"cache_dir", fuser_py_cache_dir, METH_NOARGS, cache_dir_doc},
    {"cache_root", (PyCFunction)(void (*)(void))fuser_py_cache_root, METH_VARARGS | METH_KEYWORDS, cache_root_doc},
    {"parse_flag", fuser_py_parse_flag, METH_VARARGS, parse_flag_doc},
    {"probe_load", fuser_py_probe_load, METH_VARARGS,
     "probe_load(cubin, name, device) -> probe: a microbenchmark kernel of fuser/device/probes.cuh."},
    {"probe_launch", fuser_py_probe_launch, METH_VARARGS,
     "probe_launch(probe, grid, block, cluster, smem, out, iters, stream): launch it; out is a CUDA\n"
     "float32 tensor of at least 2 x grid elements (cycles and a check value per block)."},
    {"gemm_launch", fuser_py_gemm_launch, METH_VARARGS,
     "gemm_launch(probe, a, b, c, bn, cm, smem, stream): the wgmma GEMM probe, c = a @ b.T."},
    {"probe_clusters", fuser_py_probe_clusters, METH_VARARGS,
     "probe_clusters(probe, block, cluster, smem) -> how many such clusters fit on the GPU at once."},
    {NULL, NULL, 0, NULL},
};

/* Create an exception type, store it in *slot and add it to the module under `name`. */
static int add_exception(PyObject *m, PyObject **slot, const char *qualname, const char *name, const char *doc,
                         PyObject *base)
{
    *slot = PyErr_NewExceptionWithDoc(qualname, doc, base, NULL);
    if (!*slot)
        return -1;
    return PyModule_AddObjectRef(m, name, *slot);
}

static int module_exec(PyObject *m)
{
    fuser_state *st = fuser_get_state(m);
    if (add_exception(m, &st->FuserError, "fuser.FuserError", "FuserError",
                      "Base class of fuser's environment and runtime errors (a RuntimeError).",
                      PyExc_RuntimeError) ||
        add_exception(m, &st->CudaError, "fuser.CudaError", "CudaError",
                      "The CUDA driver is missing or a CUDA call failed.", st->FuserError) ||
        add_exception(m, &st->CompileError, "fuser.CompileError", "CompileError",
                      "NVRTC failed to compile a generated kernel; the message holds the log.", st->FuserError) ||
        add_exception(m, &st->CacheError, "fuser.CacheError", "CacheError",
                      "The on-disk kernel cache could not be read or written.", st->FuserError) ||
        add_exception(m, &st->UnsupportedError, "fuser.UnsupportedError", "UnsupportedError",
                      "Valid input that the fused path cannot run (the caller may fall back).", st->FuserError))
        return -1;
    st->s_dlpack = PyUnicode_InternFromString("__dlpack__");
    st->s_dlpack_device = PyUnicode_InternFromString("__dlpack_device__");
    st->s_stream = PyUnicode_InternFromString("stream");
    st->s_max_version = PyUnicode_InternFromString("max_version");
    st->max_version = Py_BuildValue("(ii)", 1, 0);
    if (!st->s_dlpack || !st->s_dlpack_device || !st->s_stream || !st->s_max_version || !st->max_version)
        return -1;
    if (fuser_plan_type_add(m, st))
        return -1;
    static const char *const kept_names[KN_COUNT] = {KEPT_NAMES};
    if (!(st->kept_names = PyTuple_New(KN_COUNT)))
        return -1;
    for (int i = 0; i < KN_COUNT; i++) {
        PyObject *name = PyUnicode_InternFromString(kept_names[i]);
        if (!name)
            return -1;
        PyTuple_SET_ITEM(st->kept_names, i, name);
    }
    if (PyModule_AddIntConstant(m, "DLPACK_MAJOR", 1) || PyModule_AddIntConstant(m, "DLPACK_MINOR", 0) ||
        PyModule_AddIntConstant(m, "ALIGN_BYTES", FUSER_ALIGN_BYTES) ||
        PyModule_AddIntConstant(m, "STREAM_TRACE_WORDS", FUSER_STREAM_TRACE_WORDS) ||
        PyModule_AddIntConstant(m, "FP8_ROWWISE_TOKENS", FUSER_FP8_ROWWISE_TOKENS) ||
        PyModule_AddIntConstant(m, "EAGER_EPILOGUE_TOKENS", FUSER_EAGER_EPILOGUE_TOKENS))
        return -1;
    return 0;
}

#define STATE_FIELDS(X)                                                                                      \
    X(FuserError) X(CudaError) X(CompileError) X(CacheError) X(UnsupportedError) X(s_dlpack)                 \
    X(s_dlpack_device) X(s_stream) X(s_max_version) X(max_version) X(kept_names) X(tensor_type)               \
    X(tensor_exporter) X(exchange_types) X(plan_type)

static int module_traverse(PyObject *m, visitproc visit, void *arg)
{
    fuser_state *st = fuser_get_state(m);
    if (!st)
        return 0;
#define VISIT(f) Py_VISIT(st->f);
    STATE_FIELDS(VISIT)
#undef VISIT
    return 0;
}

static int module_clear(PyObject *m)
{
    fuser_state *st = fuser_get_state(m);
    if (!st)
        return 0;
#define CLEAR(f) Py_CLEAR(st->f);
    STATE_FIELDS(CLEAR)
#undef CLEAR
    st->exchange = NULL; /* its exact types were borrowed from exchange_types */
    st->n_exchange = 0;
    return 0;
}

static void module_free(void *m)
{
    module_clear((PyObject *)m);
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
#if PY_VERSION_HEX >= 0x030C0000
    /* the core keeps no Python state outside module state; its process-wide tables are mutex-guarded */
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#if PY_VERSION_HEX >= 0x030D0000
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "fuser._C",
    .m_doc = module_doc,
    .m_size = sizeof(fuser_state),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__C(void)
{
    return PyModuleDef_Init(&module_def);
}
