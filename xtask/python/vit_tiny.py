"""A small vision transformer as torch.onnx exports one (opset 17), with random weights: the patch-embedding Conv,
`flatten(2).transpose(1, 2)`, the class token expanded and concatenated, the position table added, pre-LN blocks
(LayerNormalization, Q/K/V projections with head reshapes, scaled softmax attention, output projection and
residual, an erf-GELU MLP and residual), a final LayerNorm, the class-token Gather and the head Gemm.

    target/ort-venv/bin/python xtask/python/vit_tiny.py OUT.onnx

Used for the fusion figures of docs/benchmarks.md ("Loads in row kernels"); `cargo xtask ort-check OUT.onnx`
compares cuplan with onnxruntime on it.
"""
import sys
import numpy as np, onnx
from onnx import helper as h, TensorProto as T, numpy_helper as nh
rng = np.random.default_rng(0)
D, H, L, P, IMG, MLP, C = 64, 4, 2, 8, 32, 256, 10
N = (IMG // P) ** 2
nodes, inits = [], []
def W(name, *shape, scale=0.05):
    inits.append(nh.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)); return name
def C64(name, vals):
    inits.append(nh.from_array(np.array(vals, dtype=np.int64), name)); return name
def CF(name, v):
    inits.append(nh.from_array(np.array(v, dtype=np.float32), name)); return name
cnt = [0]
def n(op, ins, **attrs):
    cnt[0] += 1; out = f"t{cnt[0]}"
    nodes.append(h.make_node(op, ins, [out], name=f"/{op}_{cnt[0]}", **attrs)); return out
x = "pixel_values"
e = n("Conv", [x, W("patch.w", D, 3, P, P), W("patch.b", D)], kernel_shape=[P, P], strides=[P, P])
e = n("Reshape", [e, C64("s_flat", [1, D, N])])
e = n("Transpose", [e], perm=[0, 2, 1])
cls = n("Expand", [W("cls", 1, 1, D), C64("s_cls", [1, 1, D])])
e = n("Concat", [cls, e], axis=1)
hs = n("Add", [e, W("pos", 1, N + 1, D)])
def ln(x, p):
    return n("LayerNormalization", [x, W(p + ".g", D, scale=1.0), W(p + ".b", D)], axis=-1, epsilon=1e-12)
def lin(x, p, i, o):
    return n("Add", [n("MatMul", [x, W(p + ".w", i, o)]), W(p + ".b", o)])
def heads(x):
    return n("Transpose", [n("Reshape", [x, C64(f"s_h{cnt[0]}", [1, N + 1, H, D // H])])], perm=[0, 2, 1, 3])
for l in range(L):
    p = f"l{l}"
    a = ln(hs, p + ".ln1")
    q, k, v = heads(lin(a, p + ".q", D, D)), heads(lin(a, p + ".k", D, D)), heads(lin(a, p + ".v", D, D))
    kt = n("Transpose", [k], perm=[0, 1, 3, 2])
    s = n("Div", [n("MatMul", [q, kt]), CF(f"sq{l}", np.sqrt(D // H))])
    pr = n("Softmax", [s], axis=-1)
    ctx = n("Transpose", [n("MatMul", [pr, v])], perm=[0, 2, 1, 3])
    ctx = n("Reshape", [ctx, C64(f"s_m{l}", [1, N + 1, D])])
    hs = n("Add", [lin(ctx, p + ".o", D, D), hs])
    b = ln(hs, p + ".ln2")
    f = lin(b, p + ".fc1", D, MLP)
    g = n("Mul", [n("Mul", [f, n("Add", [n("Erf", [n("Div", [f, CF(f"r2{l}", np.sqrt(2))])]), CF(f"one{l}", 1.0)])]), CF(f"half{l}", 0.5)])
    hs = n("Add", [lin(g, p + ".fc2", MLP, D), hs])
last = ln(hs, "final")
clsrow = n("Gather", [last, C64("zero", 0)], axis=1)
logits = n("Gemm", [clsrow, W("head.w", C, D), W("head.b", C)], transB=1)
nodes[-1].output[0] = "logits"
g = h.make_graph(nodes, "vit_tiny", [h.make_tensor_value_info(x, T.FLOAT, [1, 3, IMG, IMG])],
                 [h.make_tensor_value_info("logits", T.FLOAT, [1, C])], inits)
m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]); m.ir_version = 8
onnx.checker.check_model(m); onnx.save(m, sys.argv[1] if len(sys.argv) > 1 else "vit_tiny.onnx"); print("ok", len(nodes))
