"""cuplan: compile compute graphs (ONNX or cuplan JSON) into GPU execution plans, then explain and simulate them.

    import cuplan, numpy as np
    g = cuplan.load("models/resnet50.onnx")
    p = cuplan.plan(g, streams=4)
    print(p.report()["pool_bytes"], p.verify())
    out = cuplan.Simulator(p).run({"pixels": np.ones((1, 3, 224, 224), np.float32)}, schedule="random", seed=5)

Every user error raises a ``CuplanError`` (a ``ValueError``) carrying the message the ``cuplan`` command line
prints: ``GraphError`` when loading, ``PlanError`` when planning, ``RunError`` when running.
"""

from ._cuplan import (
    CuplanError,
    Graph,
    GraphError,
    Plan,
    PlanError,
    PlanSet,
    RunError,
    Simulator,
    __version__,
    load,
    plan,
    plan_set,
)

__all__ = [
    "CuplanError",
    "Graph",
    "GraphError",
    "Plan",
    "PlanError",
    "PlanSet",
    "RunError",
    "Simulator",
    "__version__",
    "load",
    "plan",
    "plan_set",
]
