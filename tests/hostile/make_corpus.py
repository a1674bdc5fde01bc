#!/usr/bin/env python3
"""Writes the hostile corpus beside this script. Run it after changing a case; the files are committed, so
the tests need no Python. ONNX files are encoded by hand (protobuf wire format), so no onnx package is needed."""
import json, os, struct

HERE = os.path.dirname(os.path.abspath(__file__))

def write(name, data):
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())

def doc(inputs, nodes, outputs, **extra):
    d = {"format": "cuplan-graph", "version": 1, "name": "hostile", "inputs": inputs, "nodes": nodes, "outputs": outputs}
    d.update(extra)
    return json.dumps(d, indent=1)

def inp(name, shape, dtype="f32"):
    return {"name": name, "dtype": dtype, "shape": shape}

def node(name, op, inputs, outputs=None):
    n = {"name": name, "op": op, "inputs": inputs}
    if outputs is not None:
        n["outputs"] = outputs
    return n

good = doc([inp("x", [2, 8])], [node("a", "Relu", ["x"]), node("b", "Tanh", ["a"])], ["b"])

# --- JSON -------------------------------------------------------------------------------------------------
write("empty.json", b"")
write("truncated.json", good[: len(good) // 2])
# One bit flipped: the '{' opening the first input becomes 'z'.
i = good.index("{", good.index('"inputs"'))
flipped = bytearray(good.encode())
assert flipped[i:i + 1] == b"{", flipped[i - 3:i + 3]
flipped[i] ^= 0x01  # '{' (0x7b) -> 'z' (0x7a)
write("bitflip.json", bytes(flipped))
write("non_utf8.json", good.encode()[:40] + b"\xff\xfe" + good.encode()[40:])
write("not_a_graph.json", json.dumps({"format": "onnx", "version": 1}))
write("cycle.json", doc([inp("x", [4])], [node("a", "Add", ["x", "c"]), node("b", "Relu", ["a"]), node("c", "Neg", ["b"])], ["c"]))
write("self_loop.json", doc([inp("x", [4])], [node("a", "Add", ["x", "a"])], ["a"]))
write("duplicate_node.json", doc([inp("x", [4])], [node("a", "Relu", ["x"]), node("a", "Neg", ["x"], ["a2"])], ["a2"]))
write("duplicate_tensor.json", doc([inp("x", [4]), inp("x", [4])], [node("a", "Relu", ["x"])], ["a"]))
write("writes_input.json", doc([inp("x", [4])], [node("a", "Relu", ["x"], ["x"])], ["x"]))
write("dangling.json", doc([inp("x", [4])], [node("a", "Add", ["x", "ghost"])], ["a"]))
write("negative_dim.json", doc([inp("x", [2, -3])], [node("a", "Relu", ["x"])], ["a"]))
write("rank_65.json", doc([inp("x", [1] * 65)], [node("a", "Relu", ["x"])], ["a"]))
write("huge_dims_overflow.json", doc([inp("x", [1_000_000_000] * 3)], [node("a", "Relu", ["x"])], ["a"]))
write("huge_dims_limit.json", doc([inp("x", [1 << 20] * 3)], [node("a", "Relu", ["x"])], ["a"]))
write("huge_dim_i64.json", doc([inp("x", [0, 9223372036854775808])], [node("a", "Relu", ["x"])], ["a"]))
write("unknown_op.json", doc([inp("x", [4])], [node("a", "FooBar", ["x"])], ["a"]))
write("dtype_mismatch.json", doc([inp("x", [4]), inp("i", [4], "i64")], [node("a", "Add", ["x", "i"])], ["a"]))
write("shape_mismatch.json", doc([inp("x", [2, 3]), inp("y", [4, 5])], [node("a", "MatMul", ["x", "y"])], ["a"]))
write("nan_attribute.json", good.replace('"Relu"', '{"LeakyRelu": {"alpha": NaN}}'))
write("null_attribute.json", good.replace('"Relu"', '{"LeakyRelu": {"alpha": null}}'))
write("infinite_clip.json", doc([inp("x", [4])], [node("a", {"Clip": {"min": 0, "max": 1e39}}, ["x"])], ["a"]))
write("constant_out_of_range.json", doc([inp("x", [1])], [node("a", "Add", ["x", "c"])], ["a"],
      constants=[{"name": "c", "dtype": "f16", "shape": [1], "data": [1e6]}]))
write("no_outputs.json", doc([inp("x", [4])], [node("a", "Relu", ["x"])], []))
write("wrong_arity.json", doc([inp("x", [4])], [node("a", "Add", ["x"])], ["a"]))
deep = 1000
write("deeply_nested.json", doc([inp("x", [4])], [node("a", "Relu", ["x"])], ["a"],
      constants=[{"name": "c", "dtype": "f32", "shape": [1], "data": [0]}]).replace('"data": [\n    0\n   ]', '"data": ' + "[" * deep + "0" + "]" * deep))
assert "[" * deep in open(os.path.join(HERE, "deeply_nested.json")).read()
write("zero_dim.json", doc([inp("x", [0, 8])], [node("a", "Relu", ["x"]), node("b", {"ReduceSum": {"axes": [0], "keepdims": False}}, ["a"])], ["b"]))
write("ok.json", good)

# --- ONNX (protobuf wire format by hand) --------------------------------------------------------------------
def varint(n):
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)

def field(num, wire, payload):
    key = varint((num << 3) | wire)
    if wire == 0:
        return key + varint(payload)
    if wire == 2:
        payload = payload.encode() if isinstance(payload, str) else payload
        return key + varint(len(payload)) + payload
    if wire == 5:
        return key + payload
    raise ValueError(wire)

def value_info(name, dims, elem=1):
    shape = b"".join(field(1, 2, field(1, 0, d)) for d in dims)
    tensor_type = field(1, 0, elem) + field(2, 2, shape)
    return field(1, 2, name) + field(2, 2, field(1, 2, tensor_type))

def onnx_node(op, name, ins, outs, attrs=b""):
    return b"".join(field(1, 2, i) for i in ins) + b"".join(field(2, 2, o) for o in outs) + field(3, 2, name) + field(4, 2, op) + attrs

def float_attr(name, v):
    # AttributeProto: name=1, f=2 (fixed32), type=20 (FLOAT=1)
    return field(5, 2, field(1, 2, name) + field(2, 5, struct.pack("<f", v)) + field(20, 0, 1))

def model(nodes, inputs, outputs, opset=13):
    graph = b"".join(field(1, 2, n) for n in nodes) + field(2, 2, "g")
    graph += b"".join(field(11, 2, vi) for vi in inputs) + b"".join(field(12, 2, vi) for vi in outputs)
    return field(1, 0, 8) + field(8, 2, field(1, 2, "") + field(2, 0, opset)) + field(7, 2, graph)

ok = model([onnx_node("Relu", "r", ["x"], ["y"])], [value_info("x", [1, 4])], [value_info("y", [1, 4])])
write("ok.onnx", ok)
write("empty.onnx", b"")
write("truncated.onnx", ok[: len(ok) - 5])
# A bit flipped in the op type's first byte: 'R' -> 'S' makes an unknown operator "Selu"... which exists;
# flip 'e' (0x65) -> 'a' (0x61) instead: "Ralu".
j = ok.index(b"Relu") + 1
bf = bytearray(ok)
bf[j] ^= 0x04
write("bitflip.onnx", bytes(bf))
bad = bytearray(ok)
bad[ok.index(b"Relu")] = 0xFF
write("non_utf8.onnx", bytes(bad))
write("unknown_op.onnx", model([onnx_node("FooBar", "f", ["x"], ["y"])], [value_info("x", [1, 4])], [value_info("y", [1, 4])]))
write("cycle.onnx", model([onnx_node("Add", "a", ["x", "z"], ["y"]), onnx_node("Relu", "b", ["y"], ["z"])],
                          [value_info("x", [4])], [value_info("z", [4])]))
write("huge_dims.onnx", model([onnx_node("Relu", "r", ["x"], ["y"])], [value_info("x", [1_000_000_000] * 3)], [value_info("y", [1])]))
write("negative_dim.onnx", model([onnx_node("Relu", "r", ["x"], ["y"])], [value_info("x", [2, -5])], [value_info("y", [1])]))
write("nan_attribute.onnx", model([onnx_node("LeakyRelu", "l", ["x"], ["y"], float_attr("alpha", float("nan")))],
                                  [value_info("x", [4])], [value_info("y", [4])]))
write("opset_too_new.onnx", model([onnx_node("Relu", "r", ["x"], ["y"])], [value_info("x", [4])], [value_info("y", [4])], opset=99))
write("self_loop.onnx", model([onnx_node("Add", "a", ["x", "y"], ["y"])], [value_info("x", [4])], [value_info("y", [4])]))
write("duplicate_output.onnx", model([onnx_node("Relu", "a", ["x"], ["y"]), onnx_node("Neg", "b", ["x"], ["y"])],
                                     [value_info("x", [4])], [value_info("y", [4])]))
write("dtype_mismatch.onnx", model([onnx_node("Add", "a", ["x", "i"], ["y"])], [value_info("x", [4]), value_info("i", [4], elem=7)],
                                   [value_info("y", [4])]))
write("rank_65.onnx", model([onnx_node("Relu", "r", ["x"], ["y"])], [value_info("x", [1] * 65)], [value_info("y", [1])]))
write("shape_mismatch.onnx", model([onnx_node("MatMul", "m", ["x", "w"], ["y"])], [value_info("x", [2, 3]), value_info("w", [4, 5])],
                                   [value_info("y", [2, 5])]))
