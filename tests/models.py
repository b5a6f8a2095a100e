"""Small real models for the tests: Hugging Face models built from configs and timm models built from
their classes, all with random weights (nothing is downloaded), plus their inputs.

``HF[name]()`` returns ``(model, inputs)``; ``inputs`` is a dict of keyword arguments for ``model``.
"""
import torch

from fuser.tools.compat import importable_torchvision

importable_torchvision()   # before transformers/timm import anything (see its docstring)

import transformers as T  # noqa: E402

VOCAB = 97
_IDS = dict(vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2)
_DEC = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, **_IDS)


def ids(batch=2, seq=7, seed=0):
    """Random token ids ``[batch, seq]``."""
    return torch.randint(3, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _causal(config_cls, model_cls, **kw):
    def make(**over):
        cfg = config_cls(**{**kw, **over})
        return model_cls(cfg), {"input_ids": ids()}
    return make


def _t5(**over):
    cfg = T.T5Config(d_model=64, d_ff=160, num_layers=2, num_heads=4, d_kv=16, feed_forward_proj="gated-gelu",
                     decoder_start_token_id=0, **{**_IDS, **over})
    return T.T5ForConditionalGeneration(cfg), {"input_ids": ids(), "decoder_input_ids": ids(seed=1)}


def _bert(**over):
    cfg = T.BertConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                       **{**_IDS, **over})
    return T.BertModel(cfg), {"input_ids": ids()}


#: model name -> (builder, FFN class name, number of FFNs, fused activation)
HF = {
    "llama": (_causal(T.LlamaConfig, T.LlamaForCausalLM, num_key_value_heads=2, **_DEC), "LlamaMLP", 2, "silu"),
    "mistral": (_causal(T.MistralConfig, T.MistralForCausalLM, num_key_value_heads=2, **_DEC), "MistralMLP", 2, "silu"),
    "qwen2": (_causal(T.Qwen2Config, T.Qwen2ForCausalLM, num_key_value_heads=2, **_DEC), "Qwen2MLP", 2, "silu"),
    "qwen3": (_causal(T.Qwen3Config, T.Qwen3ForCausalLM, num_key_value_heads=2, head_dim=16, **_DEC),
              "Qwen3MLP", 2, "silu"),
    "gemma": (_causal(T.GemmaConfig, T.GemmaForCausalLM, num_key_value_heads=2, head_dim=16, **_DEC),
              "GemmaMLP", 2, "gelu_tanh"),
    "phi3": (_causal(T.Phi3Config, T.Phi3ForCausalLM, **_DEC), "Phi3MLP", 2, "silu"),
    "gpt2": (_causal(T.GPT2Config, T.GPT2LMHeadModel, n_embd=64, n_layer=2, n_head=4, n_positions=32, **_IDS),
             "GPT2MLP", 2, "gelu_tanh"),
    "gpt_neox": (_causal(T.GPTNeoXConfig, T.GPTNeoXForCausalLM, **_DEC), "GPTNeoXMLP", 2, "gelu"),
    "falcon": (_causal(T.FalconConfig, T.FalconForCausalLM, hidden_size=64, num_hidden_layers=2,
                       num_attention_heads=4, new_decoder_architecture=True, num_kv_heads=2, **_IDS),
               "FalconMLP", 2, "gelu"),
    "bert": (_bert, "BertIntermediate+BertOutput", 2, "gelu"),
    "t5": (_t5, "T5DenseGatedActDense", 4, "gelu_tanh"),
}

#: an unsupported activation per model family: (model name, config override, reason fragment)
UNSUPPORTED_ACT = [
    ("llama", {"hidden_act": "relu2"}, "ReLUSquaredActivation"),
    ("gpt_neox", {"hidden_act": "quick_gelu"}, "QuickGELUActivation"),
    ("gpt2", {"activation_function": "gelu_10"}, "ClippedGELUActivation"),
]


def hf(name, **over):
    """``(model in eval mode, inputs)`` of HF model ``name`` with config overrides, seeded."""
    torch.manual_seed(0)
    model, inputs = HF[name][0](**over)
    return model.eval(), inputs


class Holder(torch.nn.Module):
    """A model holding one module (an FFN) as its child ``ffn``, which its forward calls."""

    def __init__(self, ffn):
        super().__init__()
        self.ffn = ffn

    def forward(self, x):
        return self.ffn(x)


def output(model, inputs):
    """The main output tensor of an HF model call."""
    out = model(**inputs)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def grads(model):
    """Parameter name -> gradient, in the unoptimized layout (the gradients of GPT-2 Conv1D weights that
    ``fuser.optimize`` relaid out are transposed back), for comparing against an unoptimized model."""
    from fuser.module import FusedFFN
    out = {k: p.grad for k, p in model.named_parameters() if p.grad is not None}
    for path, m in model.named_modules():
        if isinstance(m, FusedFFN):
            for owner in m.spec.transposed:
                key = f"{path}.{owner}.weight" if path else f"{owner}.weight"
                out[key] = out[key].t()
    return out


def assert_same_grads(model, ref, rtol=1e-4, atol=1e-6):
    """The gradients of ``model`` (optimized) equal those of ``ref`` (unoptimized), parameter by parameter."""
    got, expected = grads(model), grads(ref)
    assert got.keys() == expected.keys()
    for k, g in expected.items():
        torch.testing.assert_close(got[k], g, rtol=rtol, atol=atol, msg=k)
