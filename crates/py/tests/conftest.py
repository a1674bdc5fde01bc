"""Shared fixtures: the repository's models and examples, small graphs in cuplan's JSON format, and the CLI
binary when a build left one (to compare messages and report keys with the command line)."""

import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[3]
MODELS = ROOT / "models"
EXAMPLES = ROOT / "examples"


def binary_graph(op, dtype, shape, name="g"):
    """A graph of one binary op over two inputs `a` and `b` of `dtype` and `shape`, output `y`."""
    decl = lambda n: {"name": n, "dtype": dtype, "shape": list(shape)}  # noqa: E731
    return json.dumps(
        {
            "format": "cuplan-graph",
            "version": 1,
            "name": name,
            "inputs": [decl("a"), decl("b")],
            "nodes": [{"name": "y", "op": op, "inputs": ["a", "b"], "outputs": ["y"]}],
            "outputs": ["y"],
        }
    )


@pytest.fixture(scope="session")
def cli():
    """The `cuplan` binary of a cargo build of this checkout (`CUPLAN_BIN`, else target/{debug,release}), or
    skip: the message and key comparisons need it, the rest of the suite does not."""
    candidates = [os.environ.get("CUPLAN_BIN")] + [str(ROOT / "target" / p / "cuplan") for p in ("debug", "release")]
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    pytest.skip("no cuplan binary built (cargo build -p cuplan, or set CUPLAN_BIN)")


def cli_error(binary, *args):
    """The one-line error message the CLI prints for `args` (without `error: `)."""
    r = subprocess.run([binary, *args], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 1, (r.returncode, r.stderr)
    line = r.stderr.strip()
    assert line.startswith("error: ") and "\n" not in line, line
    return line[len("error: "):]
