"""Named FFN workloads: the FlashFuser paper's GEMM chains (G1-G10, ReLU) and gated FFNs (S1-S8, SwiGLU)
at 128 tokens, and the model shapes of the H200 baselines. Used by the benchmarks and the tests.

Each entry is ``name -> dict(d_model, d_ff, d_out, gated, activation, m)`` (``m`` only for the paper's
fixed-size workloads)."""

# The paper's Table VII (m, n = d_ff, k = d_model, l = d_out); ReLU per its tile graph.
PAPER_G = {
    "G1": (512, 32, 256), "G2": (256, 512, 64), "G3": (512, 416, 256), "G4": (3072, 768, 768),
    "G5": (16384, 4096, 4096), "G6": (4096, 1024, 1024), "G7": (768, 768, 768), "G8": (8192, 2048, 2048),
    "G9": (2048, 512, 512), "G10": (1536, 384, 384),
}
# The paper's Table VI: SwiGLU.
PAPER_S = {
    "S1": (8192, 3072, 3072), "S2": (5632, 2048, 2048), "S3": (11008, 4096, 4096), "S4": (8192, 2048, 2048),
    "S5": (11008, 2048, 2048), "S6": (8960, 1536, 1536), "S7": (9728, 2560, 2560), "S8": (3072, 1024, 1024),
}

PAPER = {}
for _name, (_n, _k, _l) in PAPER_G.items():
    PAPER[_name] = dict(m=128, d_model=_k, d_ff=_n, d_out=_l, gated=False, activation="relu")
for _name, (_n, _k, _l) in PAPER_S.items():
    PAPER[_name] = dict(m=128, d_model=_k, d_ff=_n, d_out=_l, gated=True, activation="silu")

#: Model FFNs measured in the H200 baselines, and GPT-2 medium's (any token count).
MODELS = {
    "gpt2": dict(d_model=768, d_ff=3072, d_out=768, gated=False, activation="gelu"),
    "gpt2-medium": dict(d_model=1024, d_ff=4096, d_out=1024, gated=False, activation="gelu"),  # BERT-large's too
    "llama2-7b": dict(d_model=4096, d_ff=11008, d_out=4096, gated=True, activation="silu"),
    "llama3-8b": dict(d_model=4096, d_ff=14336, d_out=4096, gated=True, activation="silu"),
    "llama-70b": dict(d_model=8192, d_ff=28672, d_out=8192, gated=True, activation="silu"),
    "gpt3-6.7b": dict(d_model=4096, d_ff=16384, d_out=4096, gated=False, activation="gelu"),
}
#: Token counts of the model sweep.
TOKENS = (1, 16, 128, 512, 2048, 8192, 16384)
