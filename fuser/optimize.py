"""``fuser.optimize``, ``fuser.report`` and ``fuser.revert``: swapping FFNs in a model for ``FusedFFN``.

The walk is top-down over the module tree; a module recognised as an FFN (fuser/recognize.py) is
swapped in place (or, when it cannot be fused, listed with the reason) and its insides are not walked;
a module shaped like an FFN that is not one fuser matches is listed as a near miss, with what differs.
Everything else is left exactly as it was. A model that is itself one FFN has no parent to swap it in:
``optimize`` returns its ``FusedFFN``, and returns that same one when asked again.
"""
from __future__ import annotations

import dataclasses
import weakref

import torch
from torch import nn

from fuser.module import FusedFFN, FusedInto
from fuser.recognize import NearMiss, Unsupported, recognise

__all__ = ["optimize", "quantize", "report", "revert", "Report", "Entry"]


@dataclasses.dataclass(frozen=True)
class Entry:
    """One FFN found: where (``path``, ``""`` for the model itself), what class (``kind``), its
    ``status`` ("swapped" for a ``FusedFFN`` in place, "fusible" before optimizing, "skipped", or "missed"
    for a near miss) and ``detail`` (the chain, its plan and what runs it here; or why it was skipped or
    missed)."""
    path: str
    kind: str
    status: str
    detail: str

    def __str__(self):
        return f"{self.status:8} {self.path or '(model)'}  [{self.kind}]  {self.detail}"


class Report(list):
    """The FFNs of a model, one ``Entry`` each, and its near misses (``missed``: modules shaped like an
    FFN that fuser does not match, each with what differs); prints as a table.

    Example:
        >>> import fuser
        >>> from torch import nn
        >>> r = fuser.report(nn.Sequential(nn.Linear(8, 32), nn.Mish(), nn.Linear(32, 8)))
        >>> [e.status for e in r], r.skipped[0].detail
        (['skipped'], 'activation Mish is not one fuser supports (relu, gelu, gelu_tanh, silu)')
        >>> fuser.report(nn.Sequential(nn.Linear(8, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 8))).missed[0].detail
        "a norm (LayerNorm '1') between the two Linears"
    """

    def __init__(self, entries=(), missed=()):
        super().__init__(entries)
        self.missed = list(missed)

    def _with(self, status):
        return [e for e in self if e.status == status]

    @property
    def swapped(self):
        """Entries swapped for ``FusedFFN`` (what each runs is at the end of its ``detail``)."""
        return self._with("swapped")

    @property
    def fused(self):
        """The same as ``swapped``."""
        return self.swapped

    @property
    def fusible(self):
        """Entries ``optimize`` would swap (seen before optimizing)."""
        return self._with("fusible")

    @property
    def skipped(self):
        """Entries found but not fusible, with the reason in ``detail``."""
        return self._with("skipped")

    def __str__(self):
        head = (f"fuser: {len(self)} FFN(s) found: {len(self.swapped)} swapped, {len(self.fusible)} fusible, "
                f"{len(self.skipped)} skipped")
        if self.missed:
            head += f"; {len(self.missed)} near miss(es), not recognised as FFNs"
        return "\n".join([head] + ["  " + str(e) for e in self + self.missed])

    def __repr__(self):
        return str(self)


def _swap(parent, name, new):
    if parent is not None:
        setattr(parent, name, new)
    return new


def _visit(module, parent, name, path, entries, swap):
    """Walk one module; returns what stands at its place afterwards."""
    if isinstance(module, FusedFFN):
        entries.append(_swapped(path, module))
        return module
    if isinstance(module, FusedInto):
        return module
    found = recognise(module, parent)
    if found is not None and isinstance(found[1], NearMiss):   # listed; its insides are walked
        entries.missed.append(Entry(path, found[0], "missed", str(found[1])))
    elif found is not None:
        kind, spec, linked = found
        if isinstance(spec, Unsupported):
            entries.append(Entry(path, kind, "skipped", str(spec)))
            return module
        if not swap:
            entries.append(Entry(path, kind, "fusible", _summary(spec)))
            return module
        if linked:   # an FFN split over siblings: leave a pass-through where the down projection was
            sibling, attr = linked["down"]
            passthrough = FusedInto(getattr(sibling, attr), name)
            setattr(sibling, attr, passthrough)
            linked = {"down": passthrough}
        fused = FusedFFN(spec, dict(module.named_children()), linked, source=module)
        entries.append(_swapped(path, fused))
        return _swap(parent, name, fused)
    for child_name, child in list(module.named_children()):
        _visit(child, module, child_name, f"{path}.{child_name}" if path else child_name, entries, swap)
    return module


def _swapped(path, fused):
    return Entry(path, fused.spec.kind, "swapped", f"{fused.plan_summary()}; {fused.running()}")


def _summary(spec):
    bias = "+".join(r[2:] for r in ("b_up", "b_gate", "b_down") if getattr(spec, r) is not None) or "none"
    return (f"FFN {spec.d_model} -> {spec.d_ff} -> {spec.d_out}, {'gated' if spec.gated else 'plain'}, "
            f"activation={spec.activation}, bias={bias}")


def _check_model(model):
    if not isinstance(model, nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")


#: a model that is itself one FFN -> (a weak reference to) the FusedFFN optimize returned for it
_replaced = weakref.WeakKeyDictionary()


def _replacement(model):
    ref = _replaced.get(model)
    fused = ref() if ref is not None else None
    return fused if fused is not None and fused.source is model else None


def optimize(model):
    """Swap every FFN of ``model`` that fuser supports for a ``FusedFFN``, in place, and return the model
    to use from then on: ``model`` itself, or, when ``model`` is itself one FFN, its ``FusedFFN``.

    FFNs are recognised by structure (``nn.Sequential(Linear, act, [Dropout], Linear)``, a module whose
    forward is ``down(act(gate(x)) * up(x))`` or ``down(act(up(x)))``) and by known class (Hugging Face
    LLaMA, Mistral, Qwen2/3, Gemma, Phi-3, GPT-2, GPT-NeoX, Falcon, BERT, T5; timm Mlp, GluMlp, SwiGLU).
    An FFN whose activation, dtype, layout, weights or hooks fuser does not support is left as it is;
    ``fuser.report(model)`` lists what was swapped and what was skipped, with the reason. The swapped
    modules hold the original parameters under the original state_dict keys. A gated 16-bit FFN on a CUDA
    device gets its gate and up weights in one allocation (``FusedFFN.pack``: the same Parameters and values,
    their memory moved once, the old memory returned to the driver), so that its PyTorch-ops route runs both
    projections as one GEMM (and again after ``model.to(...)``). Calling it twice is harmless.

    A model that is itself one FFN has no parent to swap it in, so it cannot change in place: the
    ``FusedFFN`` returned takes over its children (the same Parameters; GPT-2's Conv1D weights relaid
    out), so use the return value, not the argument. Asked again for the same module, ``optimize``
    returns that same ``FusedFFN``; ``fuser.revert(returned)`` gives the module back, as it was.

    Raises ``TypeError`` when ``model`` is not an ``nn.Module``.

    Example:
        >>> import torch, fuser
        >>> from torch import nn
        >>> model = nn.Sequential(nn.LayerNorm(64), nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)))
        >>> fuser.optimize(model) is model, type(model[1]).__name__
        (True, 'FusedFFN')
        >>> mlp = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
        >>> fused = fuser.optimize(mlp)        # a model that is one FFN: use what comes back
        >>> type(fused).__name__, fuser.optimize(mlp) is fused, fuser.revert(fused) is mlp
        ('FusedFFN', True, True)
    """
    _check_model(model)
    fused = _replacement(model)
    if fused is not None:
        return fused
    out = _visit(model, None, "", "", Report(), swap=True)
    if out is not model:
        _replaced[model] = weakref.ref(out)
    if torch.cuda.is_initialized() and any(m.__dict__.get("_packed") for m in out.modules() if isinstance(m, FusedFFN)):
        torch.cuda.empty_cache()   # the gate and up weights' old memory, cached by torch since FusedFFN.pack
    return out


def quantize(model, *args, **kwargs):
    """``optimize(model)``, then its bfloat16 FFNs in FP8 (``FusedFFN.quantize``: e4m3 weights per output
    channel, static scales of x and of the hidden activation) calibrated on one forward ``model(*args,
    **kwargs)`` of sample inputs, run under ``torch.no_grad()`` with every FFN still in bfloat16. An FFN the
    forward does not reach stays in bfloat16. Returns the model to use (``optimize``'s return value);
    ``fuser.report`` says which FFNs run in FP8, ``FusedFFN.dequantize`` undoes one.

    Inference only: a call that autograd must record through x runs the bfloat16 FFN. The quantized
    weights are kept beside the Parameters (half their bytes more), which stay as they are.

    Example:
        >>> import torch, fuser
        >>> from torch import nn
        >>> model = nn.Sequential(nn.LayerNorm(64), nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)))
        >>> model = fuser.quantize(model.bfloat16(), torch.randn(16, 64).bfloat16())
        >>> model[1].running().split(":")[0]
        'FP8 (e4m3 weights, static x and H scales)'
    """
    model = optimize(model)
    found = [m for m in model.modules() if isinstance(m, FusedFFN)]
    ffns = [m for m in found if m.weights()["up"].dtype == torch.bfloat16]
    if found and not ffns:
        raise ValueError(f"quantize: FP8 FFNs take bfloat16 activations; this model's FFNs are "
                         f"{found[0].weights()['up'].dtype}: convert it first (model.bfloat16())")
    samples = {}

    def keep(module, inputs):
        x = inputs[0]
        samples.setdefault(module, []).append(x.detach().reshape(-1, x.shape[-1]))
    hooks = [f.register_forward_pre_hook(keep) for f in ffns]
    try:
        for f in ffns:
            f.dequantize()   # (calibrated in bfloat16, as the model was)
        with torch.no_grad():
            model(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    for f in ffns:
        if f in samples:
            f.quantize(torch.cat(samples[f]))
    return model


def report(model):
    """Every FFN of ``model``: swapped (a ``FusedFFN`` in place; its line ends with what runs it here),
    fusible (``optimize`` would swap it) or skipped (with the reason); and the near misses, modules shaped
    like an FFN that fuser does not match, with what differs. Returns a ``Report`` (a list of ``Entry``,
    near misses in ``.missed``) that prints as a table.

    Example:
        >>> import fuser
        >>> from torch import nn
        >>> model = fuser.optimize(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8)))
        >>> print(fuser.report(model))
        fuser: 1 FFN(s) found: 1 swapped, 0 fusible, 0 skipped
          swapped  (model)  [Sequential]  FFN 8 -> 32 -> 8, plain, activation=relu, dtype=float32, bias=up+down; plan: float32: unfused (PyTorch eager ops); runs PyTorch ops (float32 is never fused)
    """
    _check_model(model)
    entries = Report()
    _visit(model, None, "", "", entries, swap=False)
    return entries


def revert(model):
    """Undo ``optimize``: put the original modules back (GPT-2 Conv1D weights back in their ``[in, out]``
    layout), in place; return the model (or, when it is one ``FusedFFN``, the module it replaced).
    Reverting twice is harmless.

    Example:
        >>> import fuser
        >>> from torch import nn
        >>> model = fuser.optimize(nn.Sequential(nn.LayerNorm(8), nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8))))
        >>> type(fuser.revert(model)[1]).__name__
        'Sequential'
    """
    _check_model(model)

    def back(module, parent, name):
        if isinstance(module, (FusedFFN, FusedInto)) and module.source is not None:
            source = module.restore()
            _replaced.pop(source, None)
            return _swap(parent, name, source)
        for child_name, child in list(module.named_children()):
            back(child, module, child_name)
        return module

    return back(model, None, "")
