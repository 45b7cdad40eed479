"""A BERT sentence encoder (sentence-transformers' Transformer -> mean Pooling -> Normalize) as one ONNX graph,
written straight from the model's config.json and model.safetensors (tokenomy/embedding/onnx_proto.py): no torch, no
onnx.

The graph computes what the torch export of the same model computed (tokenomy before issue #36), op for op where
it matters to the rounding: word + token-type + position embeddings and LayerNormalization; per layer, query and
key each scaled by head_dim^-1/4 before their MatMul, a key-padding mask added before Softmax, the output
projection plus residual and LayerNormalization, then the Erf GELU (x * (1 + erf(x / sqrt 2)) * 0.5) feed-forward,
residual and LayerNormalization; then the mean over the tokens the attention mask keeps (its count clipped at
1e-9) and division by the L2 norm (clipped at 1e-12). Only standard opset-17 ops, in the shapes onnxruntime's CPU
optimiser fuses (MatMul+Add, Add+LayerNormalization into SkipLayerNormalization, the Erf pattern into Gelu).

Inputs: input_ids, attention_mask, token_type_ids, int64 [batch, tokens]; output: embedding, float32
[batch, hidden], unit length. A row must keep at least one token (its [CLS]).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

OPSET = 17
IR_VERSION = 8  # what opset 17 needs; a newer default from the onnx package could be one onnxruntime refuses
INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def build_bert_onnx(model_path: str | Path) -> bytes:
    """The serialised ModelProto of the mean-pooled, normalised BERT at `model_path` (a sentence-transformers
    folder: config.json, model.safetensors). Raises ValueError for a config this builder does not reproduce
    (another activation or position embedding)."""
    from safetensors.numpy import load_file

    from tokenomy.embedding import onnx_proto as pb

    root = Path(model_path)
    cfg = json.loads((root / "config.json").read_text())
    if cfg.get("hidden_act", "gelu") != "gelu" or cfg.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{root}: only BERT with exact GELU and absolute positions is built here, not "
                         f"{cfg.get('hidden_act')!r} / {cfg.get('position_embedding_type')!r}")
    hidden, heads, layers = int(cfg["hidden_size"]), int(cfg["num_attention_heads"]), int(cfg["num_hidden_layers"])
    head_dim, eps = hidden // heads, float(cfg.get("layer_norm_eps", 1e-12))
    tensors = load_file(root / "model.safetensors")    # BF16 weights are refused: numpy has no bfloat16
    prefix = "bert." if "bert.embeddings.word_embeddings.weight" in tensors else ""

    inits: dict[str, np.ndarray] = {}
    nodes: list[bytes] = []

    def weight(name: str, transpose: bool = False) -> str:
        """An initializer holding tensor `name` (float32; a Linear's [out, in] weight transposed for x @ W)."""
        array = np.asarray(tensors[prefix + name], dtype=np.float32)
        inits[name] = array.T if transpose else array
        return name

    def const(name: str, value, dtype=np.float32) -> str:
        inits[name] = np.asarray(value, dtype=dtype)
        return name

    def op(kind: str, inputs: list[str], name: str, **attrs) -> str:
        nodes.append(pb.node(kind, inputs, [name], name=name, **attrs))
        return name

    def linear(x: str, layer: str, out: str) -> str:
        y = op("MatMul", [x, weight(f"{layer}.weight", transpose=True)], f"{out}/MatMul")
        return op("Add", [weight(f"{layer}.bias"), y], out)

    def layer_norm(x: str, layer: str, out: str) -> str:
        return op("LayerNormalization", [x, weight(f"{layer}.weight"), weight(f"{layer}.bias")], out, axis=-1,
                  epsilon=eps)

    # Embeddings: the position table sliced to the sequence length, broadcast over the batch.
    one, zero = const("one_i64", [1], np.int64), const("zero_i64", [0], np.int64)
    tokens = op("Gather", [op("Shape", ["input_ids"], "shape"), one], "tokens", axis=0)
    words = op("Gather", [weight("embeddings.word_embeddings.weight"), "input_ids"], "emb/words")
    types = op("Gather", [weight("embeddings.token_type_embeddings.weight"), "token_type_ids"], "emb/types")
    positions = op("Slice", [weight("embeddings.position_embeddings.weight"), zero, tokens, zero], "emb/positions")
    x = op("Add", [op("Add", [words, types], "emb/add"), positions], "emb/sum")
    x = layer_norm(x, "embeddings.LayerNorm", "emb/ln")

    # Key-padding mask [batch, 1, 1, tokens]: 0 where kept, the lowest float32 where padded (finite, so a score
    # plus it stays finite and its exp is exactly 0).
    keep = op("Cast", [op("Unsqueeze", ["attention_mask", const("axes_1_2", [1, 2], np.int64)], "mask/4d")],
              "mask/keep", to=pb.BOOL)
    mask = op("Where", [keep, const("zero_f", 0.0), const("lowest_f", np.finfo(np.float32).min)], "mask/bias")
    quarter = const("head_scale", head_dim ** -0.25)
    split = const("split_shape", [0, 0, heads, head_dim], np.int64)
    merge = const("merge_shape", [0, 0, hidden], np.int64)
    sqrt2, one_f, half = const("sqrt2", np.sqrt(2.0)), const("one_f", 1.0), const("half", 0.5)

    for i in range(layers):
        p, n = f"encoder.layer.{i}", f"l{i}"
        q = op("Reshape", [linear(x, f"{p}.attention.self.query", f"{n}/q"), split], f"{n}/q/split")
        k = op("Reshape", [linear(x, f"{p}.attention.self.key", f"{n}/k"), split], f"{n}/k/split")
        v = op("Reshape", [linear(x, f"{p}.attention.self.value", f"{n}/v"), split], f"{n}/v/split")
        q = op("Mul", [op("Transpose", [q], f"{n}/q/t", perm=[0, 2, 1, 3]), quarter], f"{n}/q/scaled")
        k = op("Mul", [op("Transpose", [k], f"{n}/k/t", perm=[0, 2, 3, 1]), quarter], f"{n}/k/scaled")
        v = op("Transpose", [v], f"{n}/v/t", perm=[0, 2, 1, 3])
        scores = op("Add", [op("MatMul", [q, k], f"{n}/scores"), mask], f"{n}/scores/masked")
        ctx = op("MatMul", [op("Softmax", [scores], f"{n}/probs", axis=-1), v], f"{n}/ctx")
        ctx = op("Reshape", [op("Transpose", [ctx], f"{n}/ctx/t", perm=[0, 2, 1, 3]), merge], f"{n}/ctx/merged")
        attn = op("Add", [linear(ctx, f"{p}.attention.output.dense", f"{n}/attn/out"), x], f"{n}/attn/residual")
        x = layer_norm(attn, f"{p}.attention.output.LayerNorm", f"{n}/attn/ln")
        up = linear(x, f"{p}.intermediate.dense", f"{n}/ffn/up")
        erf = op("Erf", [op("Div", [up, sqrt2], f"{n}/gelu/div")], f"{n}/gelu/erf")
        gelu = op("Mul", [op("Mul", [up, op("Add", [erf, one_f], f"{n}/gelu/add")], f"{n}/gelu/mul"), half],
                  f"{n}/gelu")
        ffn = op("Add", [linear(gelu, f"{p}.output.dense", f"{n}/ffn/down"), x], f"{n}/ffn/residual")
        x = layer_norm(ffn, f"{p}.output.LayerNorm", f"{n}/ffn/ln")

    # Mean over the kept tokens, then unit length.
    kept = op("Cast", [op("Unsqueeze", ["attention_mask", const("axes_m1", [-1], np.int64)], "pool/mask3d")],
              "pool/kept", to=pb.FLOAT)
    summed = op("ReduceSum", [op("Mul", [x, kept], "pool/masked"), one], "pool/sum", keepdims=0)
    count = op("Clip", [op("ReduceSum", [kept, one], "pool/count", keepdims=0), const("min_count", 1e-9)],
               "pool/count_clipped")
    mean = op("Div", [summed, count], "pool/mean")
    norm = op("Clip", [op("ReduceL2", [mean], "norm/l2", axes=[-1], keepdims=1), const("min_norm", 1e-12)],
              "norm/clipped")
    nodes.append(pb.node("Div", [mean, norm], ["embedding"], name="embedding"))

    types = {np.dtype(np.float32): pb.FLOAT, np.dtype(np.int64): pb.INT64}
    initializers = (pb.tensor(name, types[array.dtype], array.shape,
                              np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes())
                    for name, array in inits.items())
    return pb.model(nodes, "bert_mean_pooled", [pb.value_info(name, pb.INT64, ["batch", "tokens"]) for name in INPUTS],
                    [pb.value_info("embedding", pb.FLOAT, ["batch", hidden])], initializers, IR_VERSION, OPSET,
                    "tokenomy")
