#!/usr/bin/env python3
"""Compare `cuplan run` with onnxruntime on one ONNX model; run by `cargo xtask ort-check`.

The model's initializers without data (the repository's models are weights-stripped) get seeded values
(normal * 0.05; BatchNormalization variances |.| + 0.5 so they stay positive), and so do its graph inputs
(normal for floats, 0..1000 for integers, 0/1 for bool). onnxruntime (CPU, graph optimisations off) computes the
reference; cuplan computes its outputs from the same filled model through `cuplan run --inputs --output`
(safetensors files). An output agrees when max|cuplan - ort| <= rtol * max|ort|.

With --ort-fp16 the reference is onnxruntime's half-precision run of the same model: onnxconverter-common's
float16 conversion (its default op block list, graph inputs and outputs kept f32, and the nodes that read a graph
output kept f32 too, which the converter otherwise types inconsistently) — the cross-check of `cuplan run
--precision fp16|bf16` (pass that in --extra). The f32 run's distance to onnxruntime's own f32 run is printed beside.

Prints one line per output and then "N passed, N failed"; exits 0 when every output agrees, 1 otherwise.
"""
import argparse
import os
import shlex
import subprocess
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper
from safetensors.numpy import load_file, save_file


def has_data(init):
    return bool(
        init.raw_data or init.float_data or init.int32_data or init.int64_data or init.double_data
        or init.uint64_data or init.data_location == onnx.TensorProto.EXTERNAL
    )


def fill_weights(model, rng):
    """Seeded values for every initializer without data, in file order; BatchNormalization variances > 0."""
    variances = {n.input[4] for n in model.graph.node if n.op_type == "BatchNormalization" and len(n.input) >= 5}
    for i, init in enumerate(model.graph.initializer):
        if has_data(init):
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
        shape = tuple(init.dims)
        if np.issubdtype(dtype, np.floating):
            v = rng.standard_normal(shape).astype(np.float32) * 0.05
            if init.name in variances:
                v = np.abs(v) + 0.5
            v = v.astype(dtype)
        else:
            v = rng.integers(0, 2, size=shape).astype(dtype)
        model.graph.initializer[i].CopyFrom(numpy_helper.from_array(v, init.name))


def seeded_inputs(model, rng, dims):
    """Seeded values for every graph input that is not an initializer; symbolic dims from `dims` (default 1)."""
    initializers = {i.name for i in model.graph.initializer}
    feeds = {}
    for v in model.graph.input:
        if v.name in initializers:
            continue
        t = v.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, 1) for d in t.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[v.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[v.name] = rng.integers(0, 2, size=shape).astype(dtype)
        else:
            feeds[v.name] = rng.integers(0, 1000, size=shape).astype(dtype)
    return feeds


def ort_fp16(model, so, names, feeds):
    """onnxruntime's outputs for the float16 conversion of `model` (module docs), as float32 arrays by name."""
    from onnxconverter_common import float16

    outputs = {o.name for o in model.graph.output}
    block = [n.name for n in model.graph.node if any(i in outputs for i in n.input)]
    half = float16.convert_float_to_float16(model, keep_io_types=True, node_block_list=block)
    sess = ort.InferenceSession(half.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return {n: v.astype(np.float32) for n, v in zip(names, sess.run(names, feeds))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--cuplan", required=True, help="the cuplan binary (or a command line that runs it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--extra", default="", help="more arguments for `cuplan run`, e.g. '--streams 4'")
    ap.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--ort-fp16", action="store_true", help="compare with onnxruntime's float16 run (module docs)")
    a = ap.parse_args()
    dims = {k: int(v) for k, v in (d.split("=", 1) for d in a.dim)}

    rng = np.random.default_rng(a.seed)
    model = onnx.load(a.model)
    fill_weights(model, rng)
    feeds = seeded_inputs(model, rng, dims)

    with tempfile.TemporaryDirectory() as tmp:
        filled = os.path.join(tmp, "filled.onnx")
        onnx.save(model, filled)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(filled, so, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        want = dict(zip(names, sess.run(names, feeds)))
        f32 = None
        if a.ort_fp16:
            f32, want = want, ort_fp16(model, so, names, feeds)

        ins, outs = os.path.join(tmp, "in.safetensors"), os.path.join(tmp, "out.safetensors")
        save_file(feeds, ins)
        cmd = shlex.split(a.cuplan) + ["run", filled, "--inputs", ins, "--output", outs] + shlex.split(a.extra)
        for d in a.dim:
            cmd += ["--dim", d]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"FAIL cuplan run exited {r.returncode}: {r.stderr.strip()[-2000:]}")
            print(f"0 passed, {len(names)} failed")
            return 1
        got = load_file(outs)

    passed = failed = 0
    for n in names:
        ref = want[n]
        out = got.get(n)
        if out is None or out.shape != ref.shape:
            why = "missing from cuplan's outputs" if out is None else f"shape {out.shape} != {ref.shape}"
            print(f"FAIL {n}: {why}")
            failed += 1
            continue
        scale = float(np.abs(ref).max()) if ref.size else 0.0
        err = float(np.abs(out.astype(np.float64) - ref.astype(np.float64)).max()) if ref.size else 0.0
        ok = err == 0.0 or err <= a.rtol * scale
        extra = ""
        if f32 is not None:
            d = float(np.abs(f32[n].astype(np.float64) - ref.astype(np.float64)).max()) if ref.size else 0.0
            extra = f" (ort fp16 vs ort f32: {d:.3e})"
        print(f"{'ok  ' if ok else 'FAIL'} {n}: shape {ref.shape} max_abs_err {err:.3e} max_abs_ref {scale:.3e}{extra}")
        passed += ok
        failed += not ok
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
