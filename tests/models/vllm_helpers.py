"""Helpers for the model tests: one in-process vLLM engine at a time, greedy outputs, spec-decode counters."""

from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def engine(**kwargs):
    """A `vllm.LLM` with the settings every model test uses; freed on exit so the next can start."""
    from vllm import LLM

    settings = {"enforce_eager": True, "max_model_len": 512, "seed": 0, "disable_log_stats": False}
    llm = LLM(**{**settings, **kwargs})
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def greedy_token_ids(llm, prompts, max_tokens: int) -> list[list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]


def spec_decode_counts(llm) -> dict[str, float]:
    """vLLM's speculative-decoding counters (drafts, draft tokens, accepted tokens)."""
    return {
        m.name.removeprefix("vllm:spec_decode_"): m.value
        for m in llm.get_metrics()
        if m.name.startswith("vllm:spec_decode_num") and hasattr(m, "value")
    }
