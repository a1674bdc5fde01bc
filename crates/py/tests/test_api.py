"""Loading, planning, the plan's figures, JSON round trips, verify, explain, and errors as the CLI words them."""

import json
import os
import subprocess

import pytest

import cuplan
from conftest import EXAMPLES, MODELS, ROOT, binary_graph, cli_error

BLOCK = EXAMPLES / "transformer_block.json"


def test_load_from_path_pathlike_and_bytes_agree():
    by_str = cuplan.load(str(BLOCK))
    by_path = cuplan.load(BLOCK)
    by_bytes = cuplan.load(BLOCK.read_bytes())
    for g in (by_path, by_bytes):
        assert (g.name, g.num_nodes, g.num_tensors) == (by_str.name, by_str.num_nodes, by_str.num_tensors)
        assert g.to_json() == by_str.to_json()
    assert by_str.name == "transformer_1l_128h"
    assert by_str.inputs == [("x", "f32", [1, 32, 128])]
    assert by_str.origin is None
    # The graph's JSON loads back to the same text (graph-ir's round trip).
    assert cuplan.load(by_str.to_json().encode()).to_json() == by_str.to_json()


def test_onnx_from_path_and_bytes_agree():
    g = cuplan.load(MODELS / "resnet50.onnx")
    h = cuplan.load((MODELS / "resnet50.onnx").read_bytes())
    assert g.to_json() == h.to_json()
    assert g.inputs == [("pixels", "f32", [1, 3, 224, 224])]
    assert g.outputs == [("logits", "f32", [1, 1000])]
    assert g.origin.startswith("onnx opset 18")
    assert g.weights_with_data == []  # the repository's models are weights-stripped


def test_dims_bind_a_symbolic_batch():
    g = cuplan.load(MODELS / "dynamic" / "mobilenet_v2.onnx", dims={"batch": 3})
    assert g.inputs[0][2] == [3, 3, 224, 224]
    assert g.outputs[0][2][0] == 3


def test_plan_figures_are_consistent():
    g = cuplan.load(BLOCK)
    p = cuplan.plan(g, streams=4)
    steps = p.steps
    assert len(steps) == p.total_steps()
    assert sum(len(p.steps_on(s)) for s in range(p.num_streams)) == p.total_steps()
    assert 1 <= p.num_streams <= 4
    launches = sum(1 for s in steps if "Launch" in s)
    assert launches == p.kernel_count_fused
    # compute_steps() is the seed's contract: the kernel-launch steps after fusion (copies are not launches).
    assert p.compute_steps() == launches == p.kernel_count_fused
    assert p.kernel_count_fused <= p.kernel_count_original
    records = {s["Record"]["event"] for s in steps if "Record" in s}
    assert len(records) == p.event_count
    r = p.report()
    assert r["pool_bytes"] == p.pool_bytes
    assert r["kernel_count_fused"] == p.kernel_count_fused
    assert r["kernel_count_original"] == p.kernel_count_original
    assert r["num_streams"] == p.num_streams
    assert r["event_count"] == p.event_count
    assert r["total_steps"] == p.total_steps()
    assert r["graph"] == "transformer_1l_128h"
    assert r["lower_bound_bytes"] <= r["pool_bytes"] <= r["naive_bytes"]
    assert p.verify() == []


def test_options_change_the_plan():
    g = cuplan.load(BLOCK)
    fused = cuplan.plan(g)
    unfused = cuplan.plan(g, fusion=False)
    assert unfused.kernel_count_fused == unfused.kernel_count_original > fused.kernel_count_fused
    no_reuse = cuplan.plan(g, reuse=False)
    assert no_reuse.pool_bytes == no_reuse.report()["naive_bytes"] >= fused.pool_bytes
    mem = cuplan.plan(g, order="memory")
    assert mem.verify() == [] and mem.report()["lower_bound_bytes"] <= fused.report()["lower_bound_bytes"]
    assert cuplan.plan(g, device="small").report()["device"] != fused.report()["device"]
    one = cuplan.plan(g, streams=1)
    assert one.num_streams == 1 and one.event_count == 0


def test_report_has_the_clis_keys_and_values(cli):
    out = subprocess.run(
        [cli, "plan", str(BLOCK), "--streams", "4", "--report"], capture_output=True, text=True, check=True
    ).stdout
    want = json.loads(out)
    got = cuplan.plan(cuplan.load(BLOCK), streams=4).report()
    assert list(got) == list(want)
    timing = {"compile_ms", "pass_ms"}
    assert {k: v for k, v in got.items() if k not in timing} == {k: v for k, v in want.items() if k not in timing}


def test_plan_json_round_trip_and_verify():
    p = cuplan.plan(cuplan.load(BLOCK), streams=4)
    text = p.to_json()
    q = cuplan.Plan.from_json(text)
    assert q.to_json() == text
    assert (q.pool_bytes, q.kernel_count_fused, q.event_count, q.total_steps()) == (
        p.pool_bytes,
        p.kernel_count_fused,
        p.event_count,
        p.total_steps(),
    )
    assert q.verify() == []
    # A plan from JSON runs (weights seeded) and gives what the original gives.
    a = cuplan.Simulator(p).run(seed=2)
    b = cuplan.Simulator(q).run(seed=2)
    assert a.keys() == b.keys()
    for k in a:
        assert (a[k] == b[k]).all()


def test_verify_reports_every_violation_of_a_broken_plan():
    # Unfused, the block's Q, K and V projections run on three streams (fused they are one kernel on one stream),
    # so the plan has events whose waits can be removed.
    p = cuplan.plan(cuplan.load(BLOCK), streams=4, fusion=False)
    assert p.event_count > 0
    doc = json.loads(p.to_json())
    waits = [s for s in doc["steps"] if "Wait" in s]
    doc["steps"] = [s for s in doc["steps"] if "Wait" not in s]
    broken = cuplan.Plan.from_json(json.dumps(doc))
    violations = broken.verify()
    assert len(waits) > 0 and len(violations) > 0
    assert all(isinstance(v, str) and "\n" not in v for v in violations)


def test_explain_in_three_formats():
    p = cuplan.plan(cuplan.load(BLOCK), streams=2)
    text = p.explain()
    assert max(len(line) for line in text.splitlines()) <= 120
    doc = json.loads(p.explain("json"))
    assert len(doc["steps"]) == p.total_steps()
    assert doc["summary"]["pool_bytes"] == p.pool_bytes
    assert p.explain("markdown").lstrip().startswith(("|", "#"))
    with pytest.raises(cuplan.PlanError, match="expected text, json or markdown"):
        p.explain("html")
    with pytest.raises(cuplan.PlanError, match="explain needs the graph"):
        cuplan.Plan.from_json(p.to_json()).explain()


def test_repr_and_str():
    g = cuplan.load(BLOCK)
    p = cuplan.plan(g)
    assert repr(g).startswith("<cuplan.Graph 'transformer_1l_128h'")
    assert "launches" in repr(p)
    assert str(p).strip()


def test_errors_are_value_errors_with_the_clis_messages(cli, tmp_path):
    missing = str(tmp_path / "nope.onnx")
    with pytest.raises(cuplan.GraphError) as e:
        cuplan.load(missing)
    assert str(e.value) == cli_error(cli, "validate", missing)

    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x08\x07\x12\xff\xff\xff\xff")
    with pytest.raises(cuplan.GraphError) as e:
        cuplan.load(garbage)
    assert str(e.value) == cli_error(cli, "validate", str(garbage))

    with pytest.raises(cuplan.GraphError) as e:
        cuplan.load(MODELS / "dynamic" / "resnet50.onnx", dims={"batch": -1})
    assert str(e.value) == cli_error(cli, "validate", str(MODELS / "dynamic" / "resnet50.onnx"), "--dim", "batch=-1")

    with pytest.raises(cuplan.GraphError) as e:
        cuplan.load(MODELS / "resnet50.onnx", dims={"seq": 4})
    assert str(e.value) == cli_error(cli, "validate", str(MODELS / "resnet50.onnx"), "--dim", "seq=4")

    g = cuplan.load(BLOCK)
    with pytest.raises(cuplan.PlanError) as e:
        cuplan.plan(g, streams=0)
    assert str(e.value) == cli_error(cli, "plan", str(BLOCK), "--streams", "0")
    with pytest.raises(cuplan.PlanError) as e:
        cuplan.plan(g, streams=1000)
    assert str(e.value) == cli_error(cli, "plan", str(BLOCK), "--streams", "1000")
    with pytest.raises(cuplan.PlanError) as e:
        cuplan.plan(g, device="tpu")
    assert str(e.value) == cli_error(cli, "plan", str(BLOCK), "--device", "tpu")


def test_errors_without_the_cli(tmp_path):
    for exc in (cuplan.GraphError, cuplan.PlanError, cuplan.RunError):
        assert issubclass(exc, cuplan.CuplanError) and issubclass(exc, ValueError)
    with pytest.raises(cuplan.GraphError, match="nope.json"):
        cuplan.load(tmp_path / "nope.json")
    with pytest.raises(cuplan.GraphError, match=r"^bytes: "):
        cuplan.load(b"{not json")
    with pytest.raises(cuplan.GraphError, match=r"^bytes: "):
        cuplan.load(b"\x00\x01garbage")
    with pytest.raises(cuplan.GraphError, match="declares no symbolic extent named .batch."):
        cuplan.load(BLOCK, dims={"batch": 2})
    with pytest.raises(cuplan.GraphError, match="expected a path"):
        cuplan.load(42)
    with pytest.raises(cuplan.GraphError, match=r"cannot open '\./-'"):
        cuplan.load("-")  # a file named "-", never standard input
    g = cuplan.load(BLOCK)
    with pytest.raises(cuplan.PlanError, match="streams -1"):
        cuplan.plan(g, streams=-1)
    with pytest.raises(cuplan.PlanError, match="expected given or memory"):
        cuplan.plan(g, order="fastest")
    p = cuplan.plan(g, streams=2)
    with pytest.raises(cuplan.PlanError, match="stream 7"):
        p.steps_on(7)
    with pytest.raises(cuplan.PlanError, match="stream -1"):
        p.steps_on(-1)
    with pytest.raises(cuplan.PlanError, match="^plan JSON: "):
        cuplan.Plan.from_json("{}")
    with pytest.raises(cuplan.RunError, match="expected submission or random"):
        cuplan.Simulator(p).run(schedule="chaos")
    with pytest.raises(TypeError):
        cuplan.plan("not a graph")


def test_hostile_corpus_gives_the_clis_errors():
    """The CLI's hostile corpus (tests/hostile/cases.tsv) through the binding: every case the CLI rejects with
    exit code 1 raises a CuplanError whose message holds the CLI's fragment; the ones it accepts load and plan."""
    corpus = ROOT / "tests" / "hostile"
    cases = 0
    for line in (corpus / "cases.tsv").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        file, args, code, fragment = (line.split("\t") + [""])[:4]
        words = args.split()
        if words[0] not in ("validate", "plan") or int(code) == 2:
            continue  # usage errors (exit 2) are the argument parser's; Python reports them as TypeError etc.
        streams = int(words[words.index("--streams") + 1]) if "--streams" in words else 1
        def attempt():
            g = cuplan.load(corpus / file)
            if words[0] == "plan":
                cuplan.plan(g, streams=streams)
        if int(code) == 0:
            attempt()
        else:
            with pytest.raises(cuplan.CuplanError) as e:
                attempt()
            assert fragment in str(e.value) and "\n" not in str(e.value), (file, str(e.value))
        cases += 1
    assert cases >= 40
