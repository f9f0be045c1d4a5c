"""Start one engine and print its step-cost model before any request (used by test_cost_profile.py).

    python costs_runner.py '<json spec>'      spec as for engine_runner.py (only "engine" is read)
"""

from __future__ import annotations

import json
import sys

from engine_runner import start_llm


def _costs(worker) -> dict | None:
    """Runs in the worker: the runner's fitted step costs, None without AdaptiveSpec."""
    state = getattr(worker.model_runner, "adaptivespec", None)
    return None if state is None else {**state.step_costs.snapshot(), "ready": state.step_costs.ready()}


if __name__ == "__main__":
    llm = start_llm(json.loads(sys.argv[1]))
    print("ENGINE_RESULT " + json.dumps({"costs": llm.llm_engine.collective_rpc(_costs)[0]}), flush=True)
