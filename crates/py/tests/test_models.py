"""The repository's real models: planned, verified and simulated; compared with onnxruntime when it is installed;
and a model saved with ONNX external data gives the same plan and outputs as its inline version."""

import numpy as np
import pytest

import cuplan
from conftest import MODELS

X = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)


def test_resnet50_plans_verifies_and_simulates():
    g = cuplan.load(MODELS / "resnet50.onnx")
    p = cuplan.plan(g, streams=4)
    assert p.verify() == []
    assert p.num_streams >= 2 and p.kernel_count_fused < p.kernel_count_original
    r = p.report()
    assert r["lower_bound_bytes"] <= r["pool_bytes"] < r["naive_bytes"]
    out = cuplan.Simulator(p).run({"pixels": X}, schedule="random", seed=5)
    (name,) = out
    y = out[name]
    assert y.shape == (1, 1000) and y.dtype == np.float32 and np.isfinite(y).all()
    # Same seed for the weights, another schedule: the same values (the plan is race-free).
    again = cuplan.Simulator(p).run({"pixels": X}, schedule="submission", seed=5)[name]
    np.testing.assert_array_equal(y, again)


def test_optimised_plan_matches_the_reference_plan_on_mobilenet():
    g = cuplan.load(MODELS / "mobilenet_v2.onnx")
    fast = cuplan.Simulator(cuplan.plan(g, streams=4, order="memory")).run({"pixels": X}, schedule="random", seed=7)
    ref = cuplan.Simulator(cuplan.plan(g, streams=1, fusion=False, reuse=False)).run({"pixels": X}, seed=7)
    assert fast.keys() == ref.keys()
    for k in ref:
        scale = float(np.abs(ref[k]).max())
        assert float(np.abs(fast[k] - ref[k]).max()) <= 1e-5 * scale


# --- onnxruntime -------------------------------------------------------------------------------------------


def _ort():
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
    except ImportError as e:
        pytest.skip(f"onnxruntime comparison skipped: {e} (pip install onnx onnxruntime)")


def filled(path, seed=0):
    """The model with every data-less initializer given seeded values (BatchNormalization variances positive),
    and those values by name, for cuplan's simulator."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    positive = {n.input[4] for n in model.graph.node if n.op_type == "BatchNormalization" and len(n.input) >= 5}
    rng = np.random.default_rng(seed)
    weights = {}
    for i, init in enumerate(model.graph.initializer):
        if init.raw_data or init.float_data or init.int64_data or init.int32_data or init.double_data:
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(init.data_type)
        values = rng.standard_normal(tuple(init.dims)).astype(np.float32) * 0.05
        if init.name in positive:
            values = np.abs(values) + 0.5
        values = values.astype(dtype)
        weights[init.name] = values
        model.graph.initializer[i].CopyFrom(numpy_helper.from_array(values, init.name))
    return model, weights


def ort_run(model, feeds):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    return dict(zip(names, s.run(names, feeds)))


@pytest.mark.parametrize("name", ["mobilenet_v2", "resnet50"])
def test_agrees_with_onnxruntime(name):
    _ort()
    model, weights = filled(MODELS / f"{name}.onnx")
    want = ort_run(model, {"pixels": X})
    p = cuplan.plan(cuplan.load(MODELS / f"{name}.onnx"), streams=4)
    got = cuplan.Simulator(p).run({"pixels": X, **weights}, schedule="random", seed=5)
    assert got.keys() == want.keys()
    for k, ref in want.items():
        scale = float(np.abs(ref).max())
        err = float(np.abs(got[k].astype(np.float64) - ref).max())
        assert got[k].shape == ref.shape
        assert err <= 1e-4 * scale, (k, err, scale)


def without_timings(plan_json):
    """A plan's JSON less the per-pass wall times (the only part that differs between two builds)."""
    import json

    doc = json.loads(plan_json)
    assert "pass_ms" in doc["stats"]
    del doc["stats"]["pass_ms"]
    return doc


def test_external_data_gives_the_same_plan_and_outputs_as_inline(tmp_path):
    _ort()
    import onnx

    model, _ = filled(MODELS / "mobilenet_v2.onnx", seed=3)
    want = ort_run(model, {"pixels": X})
    inline = tmp_path / "inline.onnx"
    onnx.save_model(model, str(inline))
    # save_model moves every initializer (size_threshold=0: the small shape and axes tensors too) out of `model`.
    ext_dir = tmp_path / "ext"
    ext_dir.mkdir()
    external = ext_dir / "model.onnx"
    onnx.save_model(
        model, str(external), save_as_external_data=True, all_tensors_to_one_file=True, location="weights.bin",
        size_threshold=0,
    )
    assert (ext_dir / "weights.bin").stat().st_size > 1_000_000 and external.stat().st_size < 200_000

    a, b = cuplan.load(inline), cuplan.load(external)
    assert a.to_json() == b.to_json()
    assert a.weights_with_data == b.weights_with_data and len(a.weights_with_data) == 22  # > 64 KiB: weights; the rest inline
    pa, pb = cuplan.plan(a, streams=4), cuplan.plan(b, streams=4)
    assert without_timings(pa.to_json()) == without_timings(pb.to_json())
    ya = cuplan.Simulator(pa).run({"pixels": X}, seed=9)
    yb = cuplan.Simulator(pb).run({"pixels": X}, seed=9)
    for k in ya:
        np.testing.assert_array_equal(ya[k], yb[k])
    # The weights really came from the file: onnxruntime on the inline model agrees.
    for k, ref in want.items():
        assert float(np.abs(ya[k] - ref).max()) <= 1e-4 * float(np.abs(ref).max())

    # As bytes there is no folder to read the data from: an error naming a tensor, not a crash.
    with pytest.raises(cuplan.GraphError, match=r"^bytes: tensor '.*': external data 'weights.bin': the model was not"):
        cuplan.load(external.read_bytes())
    # A truncated data file: the range past its end is named.
    data = (ext_dir / "weights.bin").read_bytes()
    (ext_dir / "weights.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(cuplan.GraphError, match=r"external data 'weights.bin': bytes \d+\.\.\d+ lie past the end"):
        cuplan.load(external)
    (ext_dir / "weights.bin").unlink()
    with pytest.raises(cuplan.GraphError, match=r"external data 'weights.bin': cannot open"):
        cuplan.load(external)
