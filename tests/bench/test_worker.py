"""The worker's closed-loop driver against a scripted engine: concurrency, timing, stall detection."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_adaptivespec.bench.worker import EngineStalled, run_cell


class ScriptedEngine:
    """Each request emits ``tokens_per_request`` tokens, one per step; ``stall_after`` steps, then nothing."""

    def __init__(self, tokens_per_request: int, stall_after: int | None = None):
        self.tokens_per_request = tokens_per_request
        self.stall_after = stall_after
        self.running: dict[str, int] = {}
        self.max_running = 0
        self.steps = 0
        self.aborted: list[str] = []

    def add_request(self, request_id, prompt, params):
        self.running[request_id] = 0
        self.max_running = max(self.max_running, len(self.running))

    def abort_request(self, request_ids):
        self.aborted += request_ids
        for rid in request_ids:
            self.running.pop(rid, None)

    def step(self):
        self.steps += 1
        if self.stall_after is not None and self.steps > self.stall_after:
            return []
        outputs = []
        for rid in list(self.running):
            self.running[rid] += 1
            done = self.running[rid] == self.tokens_per_request
            outputs.append(SimpleNamespace(
                request_id=rid, finished=done,
                outputs=[SimpleNamespace(token_ids=[self.running[rid]], text=f"t{self.running[rid]} ",
                                         finish_reason="length" if done else None)]))
            if done:
                del self.running[rid]
        return outputs


def test_keeps_batch_requests_in_flight_and_collects_deltas():
    engine = ScriptedEngine(tokens_per_request=3)
    finished = []
    result = run_cell(engine, [{}] * 5, [None] * 5, batch=2, on_done=lambda: finished.append(1), stall_timeout_s=5)
    assert engine.max_running == 2 and len(finished) == 5
    assert result["output_tokens"] == 15
    assert [o["token_ids"] for o in result["outputs"]] == [[1, 2, 3]] * 5
    assert result["outputs"][0]["text"] == "t1 t2 t3 " and result["outputs"][0]["finish_reason"] == "length"
    latency = result["step_latency_ms"]
    # Steps that gave some request its first token are prefill steps, left out of the latencies.
    assert latency["prefill_steps"] + latency["decode_steps"] == engine.steps
    assert latency["prefill_steps"] == 3 and latency["p50"] is not None
    # The overhead share's denominator: every step, prefill steps included.
    assert result["step_seconds_total"] >= latency["mean"] * latency["decode_steps"] / 1000 > 0


def test_sustained_counts_only_the_steps_taken_while_prompts_waited():
    # 5 prompts of 3 tokens, 2 in flight: r0 r1 (steps 1-3), r2 r3 (4-6) while r4 waits, then r4 alone (7-9).
    # The window ends with step 7, which prefills r4 (the last prompt) and gives its first token.
    engine = ScriptedEngine(tokens_per_request=3)
    result = run_cell(engine, [{}] * 5, [None] * 5, batch=2, on_done=lambda: None, stall_timeout_s=5)
    assert engine.steps == 9
    sustained = result["sustained"]
    assert sustained["steps"] == 7 and sustained["tokens"] == 13
    assert 0 < sustained["seconds"] <= result["step_seconds_total"]
    assert sustained["tokens_per_s"] == pytest.approx(13 / sustained["seconds"])
    # No more prompts than the batch: nothing runs at steady concurrency.
    alone = run_cell(ScriptedEngine(3), [{}] * 2, [None] * 2, batch=2, on_done=lambda: None, stall_timeout_s=5)
    assert alone["sustained"] == {"steps": 0, "tokens": 0, "seconds": 0.0, "tokens_per_s": None}


def test_a_stuck_engine_fails_the_cell_and_aborts_its_requests():
    engine = ScriptedEngine(tokens_per_request=50, stall_after=4)
    with pytest.raises(EngineStalled, match="no token for 0.2 s with 2 request"):
        run_cell(engine, [{}] * 3, [None] * 3, batch=2, on_done=lambda: None, stall_timeout_s=0.2)
    assert sorted(engine.aborted) == ["r0", "r1"] and not engine.running


def test_suffix_cache_is_replaced_by_an_empty_one_of_the_same_settings():
    from vllm_adaptivespec.bench.worker import reset_suffix_cache

    class Cache:
        def __init__(self, max_tree_depth: int, max_cached_requests: int):
            self.max_tree_depth, self.max_cached_requests = max_tree_depth, max_cached_requests
            self.responses = []

    class Engine:
        def __init__(self, drafter):
            self.worker = SimpleNamespace(model_runner=SimpleNamespace(drafter=drafter))

        def collective_rpc(self, method):
            return [method(self.worker)]

    old = Cache(24, 10000)
    old.responses.append([1, 2, 3])  # an earlier cell's answer
    engine = Engine(SimpleNamespace(suffix_cache=old))
    assert reset_suffix_cache(engine)
    new = engine.worker.model_runner.drafter.suffix_cache
    assert new is not old and new.responses == [] and (new.max_tree_depth, new.max_cached_requests) == (24, 10000)
    assert not reset_suffix_cache(Engine(SimpleNamespace()))  # a drafter without a suffix cache: nothing to reset
    assert not reset_suffix_cache(Engine(None))
