"""Type stubs of the extension module ``cuplan._cuplan`` (re-exported by ``cuplan``)."""

import os
from typing import Any, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

__version__: str

class CuplanError(ValueError):
    """A user error: a bad file, model, option or input. The message is the CLI's one line."""

class GraphError(CuplanError):
    """The graph or model could not be loaded."""

class PlanError(CuplanError):
    """The graph could not be planned with these options."""

class RunError(CuplanError):
    """The plan could not be run on these inputs."""

class Graph:
    """A loaded compute graph with the weight values its file carried."""

    @property
    def name(self) -> str: ...
    @property
    def num_nodes(self) -> int: ...
    @property
    def num_tensors(self) -> int: ...
    @property
    def inputs(self) -> List[Tuple[str, str, List[int]]]:
        """Graph inputs as ``(name, dtype, shape)``; dtype is cuplan's name (``f32``, ``i64``, ...)."""
    @property
    def outputs(self) -> List[Tuple[str, str, List[int]]]: ...
    @property
    def weights_with_data(self) -> List[str]:
        """Weights whose values the file carried (the others are seeded when run)."""
    @property
    def origin(self) -> Optional[str]:
        """For ONNX: opset, IR version, producer and counts; ``None`` for JSON graphs."""
    def to_json(self) -> str:
        """The graph in cuplan's JSON format."""

def load(source: Union[str, "os.PathLike[str]", bytes], dims: Optional[Mapping[str, int]] = None) -> Graph:
    """Load a graph from a path (``.onnx`` is ONNX, anything else cuplan JSON) or from the file's bytes.

    ``dims`` binds symbolic ONNX dimensions, e.g. ``{"batch": 8}``. ONNX external data is read from the
    model's folder (a model given as bytes must carry its data inline). Raises ``GraphError``.
    """

def plan(
    graph: Graph,
    streams: int = 1,
    fusion: bool = True,
    reuse: bool = True,
    order: Literal["given", "memory"] = "given",
    device: Literal["h200", "small"] = "h200",
    concurrent_lifetimes: bool = False,
    effort: Literal["fast", "default", "max"] = "default",
) -> Plan:
    """Compile ``graph`` into a verified execution plan (``cuplan plan``). Raises ``PlanError``."""

class Plan:
    """An execution plan: steps on streams over one memory pool, with its figures."""

    @property
    def steps(self) -> List[Dict[str, Any]]:
        """Every step in submission order, as in the plan's JSON (``{"Launch": {...}}``)."""
    @property
    def num_streams(self) -> int: ...
    @property
    def pool_bytes(self) -> int: ...
    @property
    def kernel_count_original(self) -> int: ...
    @property
    def kernel_count_fused(self) -> int: ...
    @property
    def event_count(self) -> int: ...
    @property
    def graph_name(self) -> str: ...
    def steps_on(self, stream: int) -> List[Dict[str, Any]]:
        """Steps submitted to ``stream``, in order."""
    def total_steps(self) -> int: ...
    def compute_steps(self) -> int: ...
    def report(self) -> Dict[str, Any]:
        """The figures of ``cuplan plan --report``, with the same keys."""
    def explain(self, format: Literal["text", "json", "markdown"] = "text") -> str:
        """``cuplan explain``; needs the graph (not available for a plan read with ``from_json``)."""
    def to_json(self) -> str: ...
    @staticmethod
    def from_json(text: str) -> Plan:
        """A plan from ``to_json``'s text (no weights, no graph). Raises ``PlanError``."""
    def verify(self) -> List[str]:
        """Every violation of the plan's invariants, one line each; empty when the plan is valid."""

class Simulator:
    """Runs a plan on exec-sim, the CPU simulator."""

    def __init__(self, plan: Plan) -> None: ...
    def run(
        self,
        inputs: Optional[Mapping[str, npt.ArrayLike]] = None,
        schedule: Literal["submission", "random"] = "submission",
        seed: int = 0,
        race_check: bool = True,
    ) -> Dict[str, np.ndarray]:
        """Run the plan; returns every graph output by name. Missing inputs and weights get seeded values.

        Arrays keep their dtype (float32, float16, int64, int32, int8, uint8, bool; bfloat16 travels as
        float32); a mismatch with the graph raises ``RunError``.
        """

def plan_set(
    source: Union[str, "os.PathLike[str]"],
    buckets: Mapping[str, Sequence[int]],
    dims: Optional[Mapping[str, int]] = None,
    streams: int = 1,
    fusion: bool = True,
    reuse: bool = True,
    order: Literal["given", "memory"] = "given",
    device: Literal["h200", "small"] = "h200",
    pad_safe: Optional[Sequence[str]] = None,
) -> PlanSet:
    """Plan a model for every bucket (``{"batch": [1, 2, 4, 8]}``, or a grid over two symbols) as one set
    sharing a pool, a weight upload and io addresses (``cuplan plan --buckets``). Raises ``PlanError``."""

class PlanSet:
    """Plans of one model for several buckets sharing one layout (docs/buckets.md)."""

    @property
    def members(self) -> List[Dict[str, int]]:
        """Each member's dims, row-major over the bucketed symbols."""
    @property
    def pool_bytes(self) -> int:
        """The set's activation pool: its largest member's."""
    @property
    def sum_pool_bytes(self) -> int:
        """What separate plans' pools would cost together."""
    def report(self) -> Dict[str, Any]:
        """The figures of ``cuplan plan --buckets ... --report``, with the same keys."""
    def select(self, dims: Mapping[str, int]) -> Dict[str, int]:
        """The member a request of ``dims`` runs on; ``RunError`` when the set cannot serve it."""
    def to_json(self) -> str: ...
    def run(
        self,
        inputs: Mapping[str, npt.ArrayLike],
        dims: Mapping[str, int],
        chunk: bool = False,
        schedule: Literal["submission", "random"] = "submission",
        seed: int = 0,
        race_check: bool = True,
    ) -> Dict[str, np.ndarray]:
        """Run a request of ``dims`` on the simulator: inputs at the request's shapes are padded into the
        smallest covering bucket and the outputs sliced back; ``chunk`` splits a request above the largest
        bucket. Raises ``RunError``."""
