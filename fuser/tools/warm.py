"""Ahead-of-time compilation: ``fuser.warmup(model)`` compiles, before the first forward, every fused
kernel the model's FFNs could need at the token counts given (``python -m fuser warmup`` on the command
line), so no request pays for NVRTC. ``ffn_shapes(model)`` lists the distinct FFN shapes of a model
(what ``python -m fuser explain`` plans).

Kernels land in the on-disk kernel cache (``fuser.jit.cache_dir()``) and in this process's kernel table,
so later processes find them on disk and this one does not look again. Compiling needs NVRTC, not a GPU.
"""
from __future__ import annotations

import operator
import time

from fuser import planner, runtime
from fuser.module import FusedFFN

__all__ = ["ffn_shapes", "token_counts", "warmup"]


def ffn_shapes(model):
    """The distinct FFN shapes among the ``FusedFFN`` modules of ``model`` (after ``fuser.optimize``), in
    model order: a list of ``(plan_args, paths)``, where ``plan_args`` are the keyword arguments of
    ``fuser.plan`` for that shape (``FusedFFN.plan_args()``) and ``paths`` the modules that have it.

    Example:
        >>> import fuser
        >>> from torch import nn
        >>> ffn = lambda: nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
        >>> model = fuser.optimize(nn.Sequential(ffn(), nn.LayerNorm(64), ffn()).bfloat16())
        >>> from fuser.tools.warm import ffn_shapes
        >>> [(args["d_ff"], paths) for args, paths in ffn_shapes(model)]
        [(256, ['0', '2'])]
    """
    shapes = {}
    for path, module in model.named_modules():
        if isinstance(module, FusedFFN):
            args = module.plan_args()
            shapes.setdefault(tuple(args.items()), (args, []))[1].append(path or "(model)")
    return list(shapes.values())


def describe(args):
    """A short name for an FFN shape given as ``fuser.plan`` keyword arguments.

    Example:
        >>> from fuser.tools.warm import describe
        >>> describe(dict(d_model=4096, d_ff=14336, d_out=4096, gated=True, activation="silu", bias=(), dtype="bfloat16"))
        'FFN 4096 -> 14336 -> 4096, gated silu, bfloat16, no bias'
    """
    bias = "bias " + "+".join(args["bias"]) if args["bias"] else "no bias"
    return (f"FFN {args['d_model']} -> {args['d_ff']} -> {args['d_out']}, "
            f"{'gated ' if args['gated'] else ''}{args['activation']}, {args['dtype']}, {bias}")


def token_counts(tokens):
    """`tokens` (a token count, or an iterable of them) as a tuple of ints, each at least 1.

    Example:
        >>> from fuser.tools.warm import token_counts
        >>> token_counts(16), token_counts([1, 16, 128])
        ((16,), (1, 16, 128))
    """
    if isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__iter__"):
        tokens = (tokens,)
    counts = []
    for m in tokens:
        try:
            if isinstance(m, bool):
                raise TypeError
            counts.append(operator.index(m))
        except TypeError:
            raise TypeError(f"tokens: expected integer token counts, got {type(m).__name__} {m!r}") from None
        if counts[-1] < 1:
            raise ValueError(f"tokens: expected token counts of at least 1, got {counts[-1]}")
    if not counts:
        raise ValueError("tokens: expected at least one token count, got none")
    return tuple(counts)


def warmup(model, tokens=(1, 16, 128), *, target=None, log=None):
    """Compile every fused kernel the FFNs of ``model`` could need at ``tokens`` token counts.

    For each distinct FFN shape (``ffn_shapes``) and token count: the plan ``fuser.ffn`` would pick
    (``fuser.plan`` on ``target``, default this machine's GPU or the H200 defaults) when it is fused,
    and the best fused plan (``fuser.plan(..., fused=True)``), so runs that force fusion are warm too, as
    are host-bound routes (the planner's best fused plan, launched outside CUDA graphs for a chain it runs
    eager in them: ``fuser.route.HostBoundRoute``).
    Each distinct kernel is compiled once (NVRTC, sm_90a) into the on-disk cache and this process's
    kernel table. float32 FFNs always run PyTorch ops and need no kernel. A model with gated 16-bit FFNs also
    gets the eager route's gate kernel compiled (``runtime.gate_compile``; logged, not in the returned list).

    ``model`` must have been through ``fuser.optimize`` (a ``ValueError`` says so otherwise); ``tokens`` is
    a positive token count or an iterable of them (a ``TypeError`` or ``ValueError`` names it). ``log``, if
    given, is called with one line per kernel: shape, tokens, which plan, its summary, registers,
    spill bytes, whether the disk cache had it, seconds. Returns the list of :class:`fuser.Kernel`
    compiled (``kernel.plan`` is the first plan that needed it). Needs NVRTC
    (``fuser.env().nvrtc_found``), not a GPU.

    Example:
        >>> import fuser
        >>> from torch import nn
        >>> model = fuser.optimize(nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).bfloat16())
        >>> kernels = fuser.warmup(model, tokens=(16, 128))  # doctest: +SKIP
        >>> [k.spill_bytes for k in kernels]  # doctest: +SKIP
        [0, 0]
    """
    tokens = token_counts(tokens)
    shapes = ffn_shapes(model)
    if not shapes:
        raise ValueError("model: no FusedFFN modules in it; call fuser.optimize(model) first")
    kernels, seen = [], set()
    for args, _paths in shapes:
        if args["dtype"] not in ("bfloat16", "float16"):
            if log:
                log(f"{describe(args)}: runs PyTorch eager ops at every token count; nothing to compile")
            continue
        for m in tokens:
            chosen = planner.plan(m, target=target, **args)
            wanted = [("chosen", chosen)] if chosen.fused else []
            try:
                wanted.append(("best fused", planner.plan(m, target=target, fused=True, **args)))
            except ValueError as e:   # no fused plan fits this shape (alignment, say)
                if log:
                    log(f"{describe(args)}  tokens {m}: no fused plan ({e})")
            for which, plan in wanted:
                known, start = runtime.has_kernel(plan), time.perf_counter()
                kernel = runtime.kernel_for(plan)
                seconds = time.perf_counter() - start
                if kernel.key in seen:
                    continue
                seen.add(kernel.key)
                kernels.append(kernel)
                if log:
                    how = ("already in this process" if known
                           else "cache hit" if kernel.cache_hit else "compiled")
                    log(f"{describe(args)}  tokens {m}  {which}: {plan.summary()}; {kernel.registers} registers, "
                        f"{kernel.spill_bytes} spill bytes, {how}, {seconds:.2f} s")
    if any(args["gated"] and args["dtype"] in ("bfloat16", "float16") for args, _paths in shapes):
        start = time.perf_counter()
        gate = runtime.gate_compile()
        if log:
            log(f"the eager route's gate kernel: {gate.registers} registers, {gate.spill_bytes} spill bytes, "
                f"{'cache hit' if gate.cache_hit else 'compiled'}, {time.perf_counter() - start:.2f} s")
    return kernels
