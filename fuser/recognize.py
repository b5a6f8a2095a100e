"""Recognising FFNs in a module tree: what ``fuser.optimize`` swaps and ``fuser.report`` lists.

Three ways in, each a table or a pattern, never a guess:

- ``KNOWN``: known classes (Hugging Face, timm), keyed by (top-level package, class name), each mapped
  to a ``Recipe`` naming which child plays which role (gate, up, down, or one fused gate/up linear),
  where the activation lives, and which dropouts and norms sit where.
- ``PAIRS``: FFNs split over two sibling modules (BERT's ``intermediate`` + ``output``); only the
  GEMM -> activation -> GEMM part is fused, the dropout, residual and LayerNorm stay in the sibling.
- structure (fuser/structure.py): ``nn.Sequential(Linear, act, [Dropout], Linear, [Dropout])``, and
  any other module whose ``forward`` traces to an FFN of its children; a module shaped like one that
  does not match is a ``NearMiss`` saying what differs.

What a recogniser produces is an ``FFNSpec`` (fuser/ffn_spec.py): where each weight lives (owner child,
parameter name, row range for fused gate/up weights), the activation and the dimensions; ``FusedFFN``
computes from it. What fuser cannot read, or what a swap would silently change (hooks, quantized or
parametrized linear layers), makes the FFN a skip: ``Unsupported``, with the reason.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Union

from torch import nn

from fuser.ffn_spec import (FFNSpec, Unsupported, WeightRef, build_spec, check_hooks, class_key, is_linear,
                            linear_layout, own_state)
from fuser.structure import NearMiss, from_sequential, from_structure

__all__ = ["FFNSpec", "WeightRef", "Unsupported", "NearMiss", "Recipe", "PairRecipe", "KNOWN", "PAIRS", "recognise"]


# ---- known classes ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Recipe:
    """How to read one known FFN class: child names per role.

    ``gate_up`` names one linear whose output rows hold both halves; ``gate_first`` says the gate is the
    first half (True/False), or is a function of the module (timm's ``gate_last`` attribute).
    """
    down: str
    act: str
    up: Optional[str] = None
    gate: Optional[str] = None
    gate_up: Optional[str] = None
    gate_first: Union[bool, Callable[[nn.Module], bool]] = True
    mid_dropout: Optional[str] = None
    post_dropout: Optional[str] = None
    norm: Optional[str] = None


_SWIGLU_HF = Recipe(gate="gate_proj", up="up_proj", down="down_proj", act="act_fn")
_H_4H = Recipe(up="dense_h_to_4h", down="dense_4h_to_h", act="act")

#: (package, class name) -> Recipe
KNOWN: dict[tuple[str, str], Recipe] = {
    ("transformers", "LlamaMLP"): _SWIGLU_HF,
    ("transformers", "MistralMLP"): _SWIGLU_HF,
    ("transformers", "Qwen2MLP"): _SWIGLU_HF,
    ("transformers", "Qwen3MLP"): _SWIGLU_HF,
    ("transformers", "GemmaMLP"): _SWIGLU_HF,
    ("transformers", "Phi3MLP"): Recipe(gate_up="gate_up_proj", gate_first=True, down="down_proj",
                                        act="activation_fn"),
    ("transformers", "GPT2MLP"): Recipe(up="c_fc", down="c_proj", act="act", post_dropout="dropout"),
    ("transformers", "GPTNeoXMLP"): _H_4H,
    ("transformers", "FalconMLP"): _H_4H,     # its hidden_dropout is applied by the decoder layer
    ("transformers", "T5DenseGatedActDense"): Recipe(gate="wi_0", up="wi_1", down="wo", act="act",
                                                     mid_dropout="dropout"),
    ("transformers", "T5DenseActDense"): Recipe(up="wi", down="wo", act="act", mid_dropout="dropout"),
    ("timm", "Mlp"): Recipe(up="fc1", down="fc2", act="act", mid_dropout="drop1", norm="norm",
                            post_dropout="drop2"),
    ("timm", "GluMlp"): Recipe(gate_up="fc1", gate_first=lambda m: not m.gate_last, down="fc2", act="act",
                               mid_dropout="drop1", norm="norm", post_dropout="drop2"),
    ("timm", "SwiGLU"): Recipe(gate="fc1_g", up="fc1_x", down="fc2", act="act", mid_dropout="drop1",
                               norm="norm", post_dropout="drop2"),
}


@dataclasses.dataclass(frozen=True)
class PairRecipe:
    """An FFN split over two siblings: ``up`` and ``act`` in the first, ``down`` in ``sibling``, which
    keeps its dropout, residual and norm (its ``down`` linear becomes a pass-through)."""
    sibling: str
    sibling_kind: tuple[str, str]
    up: str
    act: str
    down: str


#: (package, class name) of the first module -> PairRecipe
PAIRS: dict[tuple[str, str], PairRecipe] = {
    ("transformers", "BertIntermediate"): PairRecipe(sibling="output", sibling_kind=("transformers", "BertOutput"),
                                                     up="dense", act="intermediate_act_fn", down="dense"),
}


def _child(module, name, role):
    m = getattr(module, name, None)
    if not isinstance(m, nn.Module):
        raise Unsupported(f"{role} {name!r} is missing")
    return m

def from_recipe(module, recipe):
    """The ``FFNSpec`` of a module of a known class; raises ``Unsupported``."""
    own = own_state(module)
    if own:
        raise Unsupported(f"the module holds tensors of its own ({', '.join(own)})")
    if recipe.norm is not None and not isinstance(_child(module, recipe.norm, "norm"), nn.Identity):
        raise Unsupported(f"a norm layer ({type(getattr(module, recipe.norm)).__name__}) sits between the GEMMs")
    names = [n for n in (recipe.up, recipe.gate, recipe.gate_up, recipe.down, recipe.mid_dropout,
                         recipe.post_dropout) if n]
    owners = {n: _child(module, n, "child") for n in names}
    for n in (recipe.up, recipe.gate, recipe.gate_up, recipe.down):
        if n and not is_linear(owners[n]):
            if isinstance(owners[n], nn.Conv2d):
                raise Unsupported(f"{n} is a 1x1 Conv2d (use_conv=True, NCHW layout)")
            linear_layout(owners[n], n)
    gate_first = recipe.gate_first(module) if callable(recipe.gate_first) else recipe.gate_first
    return build_spec(class_key(module)[1], owners, up=recipe.up, down=recipe.down,
                      act_obj=getattr(module, recipe.act), gate=recipe.gate, gate_up=recipe.gate_up,
                      gate_first=gate_first, mid_dropout=recipe.mid_dropout, post_dropout=recipe.post_dropout)


def from_pair(first, sibling, recipe):
    """The ``FFNSpec`` of an FFN split over two siblings (the down linear is registered as linked)."""
    owners = {recipe.up: _child(first, recipe.up, "up projection"),
              "down": _child(sibling, recipe.down, "down projection")}
    return build_spec(class_key(first)[1], owners, up=recipe.up, down="down", act_obj=getattr(first, recipe.act),
                      linked=("down",))

# ---- one entry point ----------------------------------------------------------------------------------

def recognise(module, parent=None):
    """What ``module`` is: ``(kind, spec, linked)`` for a fusible FFN, ``(kind, Unsupported, None)`` for
    an FFN that cannot be fused, ``(kind, NearMiss, None)`` for a module shaped like an FFN that is not
    one fuser matches, or None when it is not an FFN. ``linked`` is None, or for an FFN split over
    siblings (BERT) maps the owner name ``"down"`` to ``(sibling module, attribute name)`` of the down
    projection, which lives outside the module.

    Example:
        >>> from torch import nn
        >>> from fuser.recognize import recognise
        >>> kind, spec, linked = recognise(nn.Sequential(nn.Linear(8, 32), nn.SiLU(), nn.Linear(32, 8)))
        >>> kind, spec.activation, spec.gated
        ('Sequential', 'silu', False)
    """
    key = class_key(module)
    try:
        if key in KNOWN:
            spec = from_recipe(module, KNOWN[key])
            check_hooks(module.named_modules())
            return key[1], spec, None
        if key in PAIRS:
            recipe = PAIRS[key]
            sibling = getattr(parent, recipe.sibling, None) if parent is not None else None
            if sibling is None or class_key(sibling) != recipe.sibling_kind:
                return None
            spec = from_pair(module, sibling, recipe)
            down = f"{recipe.sibling}.{recipe.down}"
            check_hooks([*module.named_modules(), (recipe.sibling, sibling), (down, getattr(sibling, recipe.down))])
            return f"{key[1]}+{recipe.sibling_kind[1]}", spec, {"down": (sibling, recipe.down)}
        spec = from_sequential(module) if type(module) is nn.Sequential else from_structure(module)
        if spec is None:
            return None
        check_hooks(module.named_modules())
        return ("Sequential" if type(module) is nn.Sequential else type(module).__name__), spec, None
    except (Unsupported, NearMiss) as e:
        return key[1], e, None
