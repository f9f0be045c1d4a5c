"""Run one vLLM engine in a fresh process and print its outputs as JSON (used by the engine tests).

A subprocess per engine keeps tests independent: vLLM holds process-wide state (plugins, Prometheus
registry, KV cache memory), and a failing configuration must not take the test session down.

    python engine_runner.py '<json spec>'
spec: {"engine": {LLM kwargs}, "prompts": [[token ids]], "max_tokens": int,
       "batch_sizes": [1, 4], "temperature": 0.0, "extra_args": {...} | null}
"""

from __future__ import annotations

import json
import os
import sys


def _metrics(llm) -> dict:
    out = {}
    for metric in llm.get_metrics():
        if "spec_decode" in metric.name or "adaptivespec" in metric.name:
            value = getattr(metric, "value", None)
            if value is None and hasattr(metric, "count"):
                value = {"count": metric.count, "sum": metric.sum, "buckets": dict(getattr(metric, "buckets", {}))}
            if value is not None:
                out[metric.name] = value
    return out


def start_llm(spec: dict):
    """The spec's engine, in this process (in-process engine core), with the tests' defaults: eager,
    float32 (lossless identity is exact there), seed 0, stats on."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM

    engine = {"enforce_eager": True, "dtype": "float32", "seed": 0, "disable_log_stats": False,
              "max_model_len": 2048, **spec["engine"]}  # fmt: skip
    return LLM(**engine)


def main() -> None:
    from vllm import SamplingParams

    spec = json.loads(sys.argv[1])
    llm = start_llm(spec)
    params = SamplingParams(
        temperature=spec.get("temperature", 0.0),
        max_tokens=spec["max_tokens"],
        ignore_eos=True,
        seed=spec.get("seed"),
        extra_args=spec.get("extra_args"),
    )
    prompts = [{"prompt_token_ids": ids} for ids in spec["prompts"]]
    outputs = {}
    for batch in spec.get("batch_sizes", [len(prompts)]):
        tokens = []
        for start in range(0, len(prompts), batch):
            for result in llm.generate(prompts[start : start + batch], params, use_tqdm=False):
                tokens.append(list(result.outputs[0].token_ids))
        outputs[str(batch)] = tokens
    print("ENGINE_RESULT " + json.dumps({"outputs": outputs, "metrics": _metrics(llm)}), flush=True)


if __name__ == "__main__":
    main()
