"""numpy interop: every dtype in and out with exact values, zero-copy outputs, array-likes, mismatches."""

import numpy as np
import pytest

import cuplan
from conftest import binary_graph


def run_binary(op, dtype, a, b, **kw):
    g = cuplan.load(binary_graph(op, dtype, a.shape).encode())
    return cuplan.Simulator(cuplan.plan(g, **kw)).run({"a": a, "b": b})["y"]


@pytest.mark.parametrize(
    "dtype,np_dtype",
    [("f32", np.float32), ("f16", np.float16), ("i64", np.int64), ("i32", np.int32), ("i8", np.int8), ("u8", np.uint8)],
)
def test_add_in_every_numeric_dtype_is_exact(dtype, np_dtype):
    rng = np.random.default_rng(1)
    a = rng.integers(0, 50, size=(3, 5)).astype(np_dtype)
    b = rng.integers(0, 50, size=(3, 5)).astype(np_dtype)
    if np.issubdtype(np_dtype, np.floating):
        a = a / np_dtype(7)
        b = b * np_dtype(0.25)
    y = run_binary("Add", dtype, a, b)
    assert y.dtype == np_dtype
    assert y.shape == (3, 5)
    np.testing.assert_array_equal(y, a + b)


def test_float16_is_rounded_as_numpy_rounds_it():
    a = np.array([1.0, 2.0**-14, 65504.0, -3.5, 0.1], np.float16)
    b = np.array([2.0**-11, 2.0**-24, 0.0, 1e-3, 0.2], np.float16)
    y = run_binary("Mul", "f16", a, b)
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, a * b)


def test_bool_in_and_out():
    a = np.array([True, False, True, False])
    b = np.array([True, True, False, False])
    y = run_binary("And", "bool", a, b)
    assert y.dtype == np.bool_
    np.testing.assert_array_equal(y, [True, False, False, False])


def test_outputs_are_views_over_the_simulators_buffer_not_copies():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = run_binary("Add", "f32", a, a)
    # The result is a view (dtype, shape) of the byte buffer the simulator returned, which numpy now owns.
    assert y.base is not None and y.base.dtype == np.uint8 and y.base.nbytes == y.nbytes
    assert y.flags.writeable
    y[0, 0] = 100.0
    np.testing.assert_array_equal(y.ravel()[1:], (2 * a).ravel()[1:])


def test_scalar_and_empty_tensors():
    y = run_binary("Sub", "f32", np.array(5.0, np.float32), np.array(2.0, np.float32))
    assert y.shape == () and y == 3.0
    e = run_binary("Add", "f32", np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32))
    assert e.shape == (0, 4) and e.dtype == np.float32


def test_non_contiguous_arrays_and_lists_are_accepted():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    a = base[:, ::2]  # strided view, 4x3
    assert not a.flags.c_contiguous
    b = [[1.0, 2.0, 3.0]] * 4  # a list goes through numpy.asarray with the binding's dtype
    y = run_binary("Add", "f32", np.ascontiguousarray(a) * 0 + a, np.asarray(b, np.float32))
    np.testing.assert_array_equal(y, a + np.asarray(b, np.float32))
    g = cuplan.load(binary_graph("Add", "f32", (4, 3)).encode())
    out = cuplan.Simulator(cuplan.plan(g)).run({"a": a, "b": b})["y"]
    np.testing.assert_array_equal(out, a + np.asarray(b, np.float32))


def test_wrong_dtype_and_shape_are_run_errors_naming_the_input():
    g = cuplan.load(binary_graph("Add", "f32", (2, 2)).encode())
    sim = cuplan.Simulator(cuplan.plan(g))
    ok = np.ones((2, 2), np.float32)
    with pytest.raises(cuplan.RunError, match="'b'") as e:
        sim.run({"a": ok, "b": np.ones((2, 2), np.int32)})
    assert isinstance(e.value, ValueError)
    with pytest.raises(cuplan.RunError, match="'a'"):
        sim.run({"a": np.ones((3, 2), np.float32), "b": ok})
    with pytest.raises(cuplan.RunError, match=r"input 'a': numpy dtype float64 is not supported"):
        sim.run({"a": np.ones((2, 2)), "b": ok})
    with pytest.raises(cuplan.RunError, match=r"'z' is not an input or weight of the graph"):
        sim.run({"z": ok})
    with pytest.raises(cuplan.RunError, match=r"'y' is a graph output, not an input"):
        sim.run({"y": ok})
    with pytest.raises(cuplan.RunError, match=r"input 'a': cannot convert"):
        sim.run({"a": "not a number", "b": ok})


def test_missing_inputs_get_seeded_values_like_the_cli():
    g = cuplan.load(binary_graph("Add", "f32", (8,)).encode())
    sim = cuplan.Simulator(cuplan.plan(g))
    first = sim.run(seed=3)["y"]
    again = sim.run(seed=3)["y"]
    other = sim.run(seed=4)["y"]
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_big_endian_arrays_are_read_by_value():
    a = np.arange(6, dtype=">f4").reshape(2, 3)
    b = np.ones((2, 3), "<f4")
    y = run_binary("Add", "f32", a, b)
    np.testing.assert_array_equal(y, a.astype(np.float32) + 1)
