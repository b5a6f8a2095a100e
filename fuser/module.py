"""``FusedFFN``: the module ``fuser.optimize`` swaps in for an FFN, and ``FusedInto``, the pass-through
left where a sibling's down projection was fused away (BERT's ``output.dense``).

A ``FusedFFN`` adopts the children of the module it replaces under the same names, so it holds the
same ``Parameter`` objects (no copy) and its ``state_dict`` keys are the original ones: a checkpoint
saved before optimizing loads after, and the other way round. It reads its weights at every call
through the spec's ``WeightRef``s (a fused gate/up weight is sliced by rows: a contiguous, zero-copy
view), so ``model.to(...)``, ``load_state_dict`` and optimizers keep working on the originals.

One layout change cannot be avoided: GPT-2's ``Conv1D`` stores its weight ``[in, out]``, and fuser
takes ``[out, in]`` row-major. The swap relays those Parameters out ONCE, in place (the same Parameter
objects, their data transposed into a new contiguous tensor; the old storage is freed), and the module
presents the original layout to the outside: ``state_dict()`` transposes those entries back (a copy per
call) and ``load_state_dict`` transposes what it loads. ``fuser.revert`` restores the original layout.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import fuser.custom_op  # noqa: F401  (registers torch.ops.fuser.ffn)
import fuser.ops
from fuser.custom_op import _c_ready, _ffn_impl
from fuser.fast import FastEager, FastLaunch
from fuser.recognize import FFNSpec, Unsupported, recognise
from fuser.reference import ACTIVATIONS

_ROLES = ("up", "down", "gate", "b_up", "b_gate", "b_down")
#: The token count ``FusedFFN.plan_summary()`` (and so its repr and ``fuser.report``) plans for.
PLAN_TOKENS = 128
#: Input shapes per module whose route (reference or fused) forward remembers; cleared when full.
_ROUTE_CACHE_SIZE = 256


def _transpose_weights(module, owners):
    """Relay out the ``weight`` of each owner to its transpose, in place (same Parameter objects)."""
    with torch.no_grad():
        for name in owners:
            p = getattr(module, name).weight
            p.data = p.data.t().contiguous()
            if p.grad is not None:
                p.grad = p.grad.t().contiguous()


def _state_dict_hook(module, state_dict, prefix, local_metadata):
    """Save GPT-2 Conv1D weights in their original ``[in, out]`` layout."""
    for name in module.spec.transposed:
        key = prefix + name + ".weight"
        if key in state_dict:
            state_dict[key] = state_dict[key].t().contiguous()
    return state_dict


def _plain_eager(x, w):
    """True when calling the op's implementation directly is exactly what ``torch.ops.fuser.ffn`` would do:
    a plain CPU/CUDA tensor, no autograd to record, no dispatch or function mode (FakeTensor, FLOP
    counters...) to honour. The dispatcher costs ~11 us of host time per call; skipping it is most of
    what separates the op from a bare kernel launch."""
    if type(x) is not torch.Tensor or x.device.type not in ("cuda", "cpu"):
        return False
    if torch.is_grad_enabled() and (x.requires_grad or any(t is not None and t.requires_grad for t in w.values())):
        return False
    return not torch._C._len_torch_dispatch_stack() and not torch._C._is_torch_function_mode_enabled()


class FusedFFN(nn.Module):
    """A transformer FFN computed by ``torch.ops.fuser.ffn`` (one fused kernel on Hopper).

    Usually made by ``fuser.optimize(model)``; ``FusedFFN.from_module(mlp)`` makes one from a single
    FFN module. It holds the original children (and so the original parameters) under their original
    names. In training mode with an active dropout between the GEMMs, and under autocast, it computes
    the same FFN with PyTorch ops instead (the fused op has neither dropout nor autocast). In eager mode
    the op validates each new input shape once; a shape it would run as PyTorch ops anyway (CPU, float32,
    or an unfused plan) then runs those ops directly, without the op's host overhead.

    Example:
        >>> import torch, fuser
        >>> from torch import nn
        >>> mlp = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
        >>> fused = fuser.FusedFFN.from_module(mlp)
        >>> fused.plan_summary()
        'FFN 64 -> 256 -> 64, plain, activation=gelu, dtype=float32, bias=up+down; plan: float32: unfused (PyTorch eager ops)'
        >>> x = torch.randn(3, 64)
        >>> torch.allclose(fused(x), mlp(x), atol=1e-5)
        True
    """

    def __init__(self, spec: FFNSpec, children, linked=None, source=None):
        """Adopt ``children`` (name -> module, the owners ``spec`` names) and compute ``spec``'s FFN.

        ``linked`` maps owner names living outside this module to the modules holding them (their
        parameters stay registered there); ``source`` is the module replaced (kept for ``revert``)."""
        super().__init__()
        for name, child in children.items():
            self.add_module(name, child)
        self.spec = spec
        self.__dict__["_linked"] = dict(linked or {})   # not registered: their state_dict keys stay put
        self.__dict__["_source"] = source
        if spec.transposed:
            _transpose_weights(self, spec.transposed)
            self._register_state_dict_hook(_state_dict_hook)

    @classmethod
    def from_module(cls, module):
        """A ``FusedFFN`` for one FFN module (any class ``fuser.optimize`` recognises, except FFNs split
        over two sibling modules, which need their parent: use ``fuser.optimize`` on the parent).

        Raises ``ValueError`` saying why when the module is not a supported FFN.

        Example:
            >>> import fuser
            >>> from torch import nn
            >>> fuser.FusedFFN.from_module(nn.Sequential(nn.Linear(8, 32), nn.SiLU(), nn.Linear(32, 8)))
            FusedFFN(
              FFN 8 -> 32 -> 8, plain, activation=silu, dtype=float32, bias=up+down; plan: float32: unfused (PyTorch eager ops)
              (0): Linear(in_features=8, out_features=32, bias=True)
              (1): SiLU()
              (2): Linear(in_features=32, out_features=8, bias=True)
            )
        """
        if not isinstance(module, nn.Module):
            raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
        found = recognise(module)
        if found is None:
            raise ValueError(f"module: {type(module).__name__} is not an FFN fuser recognises")
        kind, spec, linked = found
        if isinstance(spec, Unsupported):
            raise ValueError(f"module: {kind} cannot be fused: {spec}")
        if spec.linked:
            raise ValueError(f"module: {kind} spans two sibling modules; call fuser.optimize on their parent")
        return cls(spec, dict(module.named_children()), source=module)

    def __getstate__(self):
        # copy.deepcopy and pickling (torch.save of a whole model) leave out what forward keeps at run time:
        # remembered routes and the fast launch hold loaded kernels and DLPack capsules of this process
        state = super().__getstate__()
        state.pop("_routes", None)
        state.pop("_fast", None)
        return state

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # GPT-2 Conv1D weights arrive in their [in, out] layout; the children load after this runs
        for name in self.spec.transposed:
            key = prefix + name + ".weight"
            if key in state_dict:
                state_dict[key] = state_dict[key].t().contiguous()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # ---- the weights, read at every call --------------------------------------------------------------

    def _owner(self, ref):
        # straight from the registries where the owner is registered (nn.Module.__getattr__ costs ~0.5 us
        # a lookup, read at every call); getattr for anything else
        owner = self._linked.get(ref.owner)
        if owner is None:
            owner = self._modules.get(ref.owner)
            if owner is None:
                owner = getattr(self, ref.owner)
        return owner

    def _tensor(self, ref):
        owner = self._owner(ref)
        t = owner._parameters.get(ref.name) if isinstance(owner, nn.Module) else None
        if t is None:
            t = getattr(owner, ref.name)
        return t if ref.rows is None else t[ref.rows[0]:ref.rows[1]]

    def weights(self):
        """The tensors fused, by role: ``up``, ``down``, ``gate``, ``b_up``, ``b_gate``, ``b_down``
        (None where absent), each the original parameter or a zero-copy row slice of it.

        Example:
            >>> import fuser
            >>> from torch import nn
            >>> f = fuser.FusedFFN.from_module(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8)))
            >>> f.weights()["up"] is f.get_submodule("0").weight
            True
        """
        refs = self.__dict__.get("_refs")
        if refs is None:   # the spec is fixed: list its roles once
            refs = self.__dict__["_refs"] = tuple((role, getattr(self.spec, role)) for role in _ROLES)
        return {role: None if ref is None else self._tensor(ref) for role, ref in refs}

    # ---- forward -------------------------------------------------------------------------------------

    def _mid_dropout_active(self):
        d = getattr(self, self.spec.mid_dropout) if self.spec.mid_dropout else None
        return d is not None and d.training and d.p > 0

    def _eager(self, x, w):
        """The same FFN in PyTorch ops, with the dropout between the GEMMs (training, autocast)."""
        act = ACTIVATIONS[self.spec.activation]
        h = F.linear(x, w["up"], w["b_up"])
        h = act(F.linear(x, w["gate"], w["b_gate"])) * h if w["gate"] is not None else act(h)
        if self.spec.mid_dropout:
            h = getattr(self, self.spec.mid_dropout)(h)
        return F.linear(h, w["down"], w["b_down"])

    def _route_key(self, x, w):
        """The key under which forward remembers fuser.ffn's route for x (see ``_remember_route``), or
        None where nothing is remembered: under torch.compile/export/tracing the op stays in the graph
        and dispatches at run time."""
        if torch.compiler.is_compiling() or torch.jit.is_tracing() or not isinstance(x, torch.Tensor):
            return None
        up = w["up"]
        return (x.shape, x.dtype, x.device, x.is_contiguous(), up.dtype, up.device)

    def _remember_route(self, key, x):
        """After a call the op validated: remember its route for this input shape (``fuser.ops.route``):
        ``"reference"`` (not CUDA, not 16-bit, no fused path, or an unfused plan) or the fused plan. Later
        eager calls with that shape run the PyTorch ops, or launch the plan, directly, skipping the op's
        dispatch, validation and planner lookup (tens of microseconds of host time per FFN, which is
        most of a small FFN's time). The launch still validates the tensors in C."""
        s = self.spec
        chain = dict(m=x.numel() // x.shape[-1], d_model=s.d_model, d_ff=s.d_ff, d_out=s.d_out, gated=s.gated,
                     activation=s.activation, bias_up=s.b_up is not None, bias_gate=s.b_gate is not None,
                     bias_down=s.b_down is not None, dtype=str(x.dtype).replace("torch.", ""))
        routes = self.__dict__.setdefault("_routes", {})
        if len(routes) >= _ROUTE_CACHE_SIZE:
            routes.clear()
        routes[key] = fuser.ops.route(chain, x)

    def forward(self, x):
        if FastLaunch.usable():
            fast = self.__dict__.get("_fast")
            y = fast.run(self, x) if fast is not None else None
            if y is not None:
                return y if not self.spec.post_dropout else getattr(self, self.spec.post_dropout)(y)
        w = self.weights()
        key = self._route_key(x, w)
        known = self.__dict__.get("_routes", {}).get(key) if key is not None else None
        if (known == "reference" or self._mid_dropout_active() or x.dtype != w["up"].dtype
                or torch.is_autocast_enabled(x.device.type)):
            y = self._eager(x, w)
            if known == "reference":
                self.__dict__["_fast"] = FastEager.build(self, x, w)     # later calls of this shape
        elif known is not None and _plain_eager(x, w) and not fuser.ops.disabled():
            x = _c_ready(x)
            y = fuser.ops.run_fused(known, x, w["up"], w["down"], w["gate"], w["b_up"], w["b_gate"], w["b_down"],
                                    self.spec.activation)
            self.__dict__["_fast"] = FastLaunch.build(self, known, x, w)   # later calls of this shape
        else:
            op = _ffn_impl if key is not None and _plain_eager(x, w) else torch.ops.fuser.ffn
            y = op(x, w["up"], w["down"], w["gate"], w["b_up"], w["b_gate"], w["b_down"], self.spec.activation)
            if key is not None and known is None:
                self._remember_route(key, x)
        if self.spec.post_dropout:
            y = getattr(self, self.spec.post_dropout)(y)
        return y

    # ---- description ---------------------------------------------------------------------------------

    def plan_args(self):
        """This FFN as the planner sees it: the keyword arguments of ``fuser.plan`` other than the token
        count (widths, gated, activation, the biases present, dtype), read from the current weights.

        Example:
            >>> import fuser
            >>> from torch import nn
            >>> f = fuser.FusedFFN.from_module(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8, bias=False)))
            >>> f.plan_args()
            {'d_model': 8, 'd_ff': 32, 'd_out': 8, 'gated': False, 'activation': 'relu', 'bias': ('up',), 'dtype': 'float32'}
        """
        s = self.spec
        return dict(d_model=s.d_model, d_ff=s.d_ff, d_out=s.d_out, gated=s.gated, activation=s.activation,
                    bias=tuple(r[2:] for r in ("b_up", "b_gate", "b_down") if getattr(s, r) is not None),
                    dtype=str(self.weights()["up"].dtype).replace("torch.", ""))

    def plan(self, tokens=PLAN_TOKENS):
        """The plan ``fuser.ffn`` picks for this FFN at ``tokens`` tokens on this machine's GPU (the H200
        defaults without one): ``fuser.plan(tokens, **self.plan_args())``, kept on the module.

        Example:
            >>> import fuser
            >>> from torch import nn
            >>> f = fuser.FusedFFN.from_module(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)).bfloat16())
            >>> f.plan(16).summary() == fuser.plan(16, 64, 256, bias=True, activation="gelu", dtype="bfloat16").summary()
            True
            >>> f.plan(16) is f.plan(16)
            True
        """
        import fuser
        args = self.plan_args()
        key = (tokens,) + tuple(args.items())
        plans = self.__dict__.setdefault("_plans", {})
        if key not in plans:
            plans[key] = fuser.plan(tokens, **args)
        return plans[key]

    def plan_summary(self):
        """One line describing the fused chain and the plan the planner picks for it at a representative
        token count (``PLAN_TOKENS``, 128): d_model -> d_ff -> d_out, gated or plain, activation, dtype and
        biases, then the plan. float32 FFNs always run PyTorch ops, so they say so without planning.

        Example:
            >>> import fuser
            >>> from torch import nn
            >>> f = fuser.FusedFFN.from_module(nn.Sequential(nn.Linear(8, 32, bias=False), nn.ReLU(),
            ...                                              nn.Linear(32, 8, bias=False)))
            >>> f.plan_summary()
            'FFN 8 -> 32 -> 8, plain, activation=relu, dtype=float32, bias=none; plan: float32: unfused (PyTorch eager ops)'
            >>> f.bfloat16().plan_summary()  # doctest: +ELLIPSIS
            'FFN 8 -> 32 -> 8, ..., dtype=bfloat16, bias=none; plan @128 tokens: ..., predicted ... us'
        """
        args = self.plan_args()
        dtype = args["dtype"]
        form = "gated" if args["gated"] else "plain"
        head = (f"FFN {args['d_model']} -> {args['d_ff']} -> {args['d_out']}, {form}, activation={args['activation']}, "
                f"dtype={dtype}, bias={'+'.join(args['bias']) or 'none'}")
        if dtype not in ("bfloat16", "float16"):
            return f"{head}; plan: {dtype}: unfused (PyTorch eager ops)"
        try:
            return f"{head}; plan @{PLAN_TOKENS} tokens: {self.plan(PLAN_TOKENS).summary()}"
        except ValueError as e:   # nothing the planner can run (it always offers the unfused path)
            return f"{head}; plan @{PLAN_TOKENS} tokens: none ({e})"

    def extra_repr(self):
        return self.plan_summary()


class FusedInto(nn.Module):
    """Where a linear layer was fused into a sibling ``FusedFFN`` (BERT's ``output.dense``): it keeps
    that layer's ``weight`` and ``bias`` (the same Parameters, the same state_dict keys) and passes its
    input through, since the sibling already applied them.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from fuser.module import FusedInto
        >>> lin = nn.Linear(8, 4)
        >>> skip = FusedInto(lin, "intermediate")
        >>> skip.weight is lin.weight, torch.equal(skip(torch.ones(2, 4)), torch.ones(2, 4))
        (True, True)
    """

    def __init__(self, linear, into):
        super().__init__()
        self.register_parameter("weight", linear.weight)
        self.register_parameter("bias", linear.bias)
        self.into = into
        self.__dict__["_source"] = linear

    def forward(self, x):
        return x

    def extra_repr(self):
        return f"{tuple(self.weight.shape)} fused into {self.into}"
