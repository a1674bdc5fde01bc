"""Plan sets from Python: one model for several buckets sharing a pool; padded requests equal the exact plan."""

import numpy as np
import pytest

import cuplan
from conftest import ROOT

ATT = ROOT / "examples" / "dynamic_attention.json"


def test_set_report_members_and_select():
    s = cuplan.plan_set(ATT, {"batch": [1, 2, 4], "seq": [8, 16]})
    assert s.members[0] == {"batch": 1, "seq": 8} and len(s.members) == 6
    r = s.report()
    assert r["set_pool_bytes"] == s.pool_bytes == max(b["pool_bytes"] for b in r["buckets"])
    assert r["sum_pool_bytes"] == s.sum_pool_bytes > s.pool_bytes
    assert s.select({"batch": 3, "seq": 16}) == {"batch": 4, "seq": 16}
    with pytest.raises(cuplan.RunError, match="'probs'"):
        s.select({"batch": 1, "seq": 9})
    with pytest.raises(cuplan.RunError, match="above the largest bucket batch=4"):
        s.select({"batch": 5, "seq": 8})


def test_padded_request_equals_the_exact_plan():
    s = cuplan.plan_set(ATT, {"batch": [2, 4]}, dims={"seq": 8})
    x = np.random.default_rng(1).standard_normal((3, 8, 32)).astype(np.float32)
    got = s.run({"x": x}, {"batch": 3, "seq": 8}, seed=4)
    exact = cuplan.plan(cuplan.load(ATT, dims={"batch": 3, "seq": 8}))
    want = cuplan.Simulator(exact).run({"x": x}, seed=4)
    assert got["y"].shape == (3, 8, 32)
    np.testing.assert_array_equal(got["y"], want["y"])
    # Chunked above the largest bucket.
    x9 = np.random.default_rng(2).standard_normal((9, 8, 32)).astype(np.float32)
    got = s.run({"x": x9}, {"batch": 9, "seq": 8}, chunk=True, seed=4)
    exact = cuplan.plan(cuplan.load(ATT, dims={"batch": 9, "seq": 8}))
    np.testing.assert_array_equal(got["y"], cuplan.Simulator(exact).run({"x": x9}, seed=4)["y"])


def test_bad_buckets_are_plan_errors():
    for buckets in ({"batch": [4, 2]}, {"batch": []}, {"batch": [0]}, {"batch": "12"}):
        with pytest.raises(cuplan.PlanError):
            cuplan.plan_set(ATT, buckets, dims={"seq": 8})
    s = cuplan.plan_set(ATT, {"batch": [2]}, dims={"seq": 8})
    with pytest.raises(cuplan.RunError, match="'x'"):
        s.run({"x": np.zeros((2, 4, 32), np.float32)}, {"batch": 2, "seq": 8})
