"""One configuration in its own process: build the vLLM engine once, run every cell, report each.

Usage (by `runner`): ``python -m vllm_adaptivespec.bench.worker JOB.json EVENTS.jsonl``.
Events are JSON lines appended to EVENTS (``loaded``, ``progress``, ``cell``, ``cell_failed``,
``engine_failed``); vLLM's own logging goes to this process's stdout/stderr (the runner's log file).

How requests are driven: the worker feeds `LLMEngine` itself (``add_request`` + ``step``) and keeps
``batch`` requests in flight, adding the next prompt when one finishes (closed loop). That gives:
- output tokens/s = generated tokens of the cell / wall-clock from the first request added to the
  last one finished (prefill included);
- every cell starts with an empty prefix cache, so no cell reuses another's prefill, and, for vLLM's
  suffix decoding, with an empty suffix cache: its global tree of earlier responses would otherwise hold
  the warm-up's and earlier cells' answers to the same prompts (greedy answers it could copy whole);
- per-step latency = wall-clock of one ``LLMEngine.step()`` call, i.e. one engine iteration (one
  draft + verify round for every running request), counting only steps that returned tokens and
  prefilled no request. With ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (the runner's default) the engine
  core runs inside ``step()``, so this is the iteration's compute time plus output processing;
- step_seconds_total = all ``step()`` calls of the cell (prefill steps included): the time the plugin's
  own overhead (``vllm:adaptivespec_overhead_seconds_total``) is a share of.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
import zlib
from collections import deque
from pathlib import Path

from .engine_metrics import (
    adaptivespec_figures, delta, exact_counters, overhead_figures, percentile, snapshot, spec_figures,
)


class Events:
    def __init__(self, path: Path):
        self.path = path

    def emit(self, event: str, **data) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"event": event, "time": time.time(), **data}) + "\n")


def render_prompt(tokenizer, item: dict) -> dict:
    """Token ids of the chat-formatted prompt plus the opening of the answer (vLLM's chat path adds
    no special tokens to a rendered template either); plain text for models without a template."""
    try:
        text = tokenizer.apply_chat_template(item["messages"], add_generation_prompt=True, tokenize=False)
        special = False
    except (ValueError, AttributeError):  # no chat template
        text = "\n\n".join(m["content"] for m in item["messages"]) + "\n\n"
        special = True
    text += item.get("answer_prefix", "")
    return {"prompt_token_ids": tokenizer.encode(text, add_special_tokens=special)}


def sampling_params(cell: dict, item: dict):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(
        temperature=cell["temperature"],
        max_tokens=cell["max_tokens"],
        stop=item.get("stop") or None,
        # Same seed per prompt in every configuration, so sampled cells see the same random streams.
        seed=zlib.crc32(item["id"].encode()) if cell["temperature"] > 0 else None,
        output_kind=RequestOutputKind.DELTA,
    )


class EngineStalled(RuntimeError):
    """Requests in flight but no token for too long: the configuration is stuck, not slow."""


def run_cell(engine, prompts: list[dict], params: list, batch: int, on_done, stall_timeout_s: float) -> dict:
    """Closed-loop run of all prompts with ``batch`` in flight; outputs, timing, step latencies.

    ``sustained``: the steps taken while more prompts were waiting (so ``batch`` requests were in flight,
    each finished one replaced at once), up to the step that prefills the last prompt, their tokens and
    wall-clock: throughput at a steady concurrency of ``batch``, as a server under continuous load sees it,
    without the drain at the end, where the batch shrinks to its slowest requests. Every prompt is prefilled
    inside that window whatever the configuration's speed (a window that stopped at the last admission would
    hold fewer prefills for a configuration whose requests finish together, as plain decoding's do). Zero
    steps when there are no more prompts than ``batch``.

    Raises `EngineStalled` (after aborting what is in flight) when no request receives a token for
    ``stall_timeout_s`` seconds.
    """
    pending = deque(range(len(prompts)))
    in_flight: dict[str, int] = {}
    token_ids: list[list[int]] = [[] for _ in prompts]
    texts: list[list[str]] = [[] for _ in prompts]
    finish: list[str | None] = [None] * len(prompts)
    started: set[int] = set()
    step_seconds: list[float] = []  # decode steps only
    all_step_seconds = 0.0  # every step, prefill steps and steps that returned nothing included
    prefill_steps = 0
    sustained = {"steps": 0, "tokens": 0, "seconds": 0.0}
    window_end = len(prompts) - batch  # finished requests after which no prompt waits
    finished = 0
    last_admission_step = False  # the next step prefills the last prompts admitted
    begin = last_progress = time.perf_counter()
    while pending or in_flight:
        while pending and len(in_flight) < batch:
            index = pending.popleft()
            request_id = f"r{index}"
            engine.add_request(request_id, prompts[index], params[index])
            in_flight[request_id] = index
        in_window = finished < window_end or last_admission_step
        finished_before = finished
        tick = time.perf_counter()
        outputs = engine.step()
        seconds = time.perf_counter() - tick
        all_step_seconds += seconds
        if in_window:
            sustained["steps"] += 1
            sustained["seconds"] += seconds
            sustained["tokens"] += sum(len(out.outputs[0].token_ids) for out in outputs)
        if outputs:
            last_progress = tick + seconds
        elif tick + seconds - last_progress > stall_timeout_s:
            engine.abort_request(list(in_flight))
            raise EngineStalled(f"no token for {stall_timeout_s:g} s with {len(in_flight)} request(s) in flight "
                                f"({len(started)} of {len(prompts)} started)")
        prefilled = False
        for out in outputs:
            index = in_flight[out.request_id]
            if index not in started:
                started.add(index)
                prefilled = True
            completion = out.outputs[0]
            token_ids[index].extend(completion.token_ids)
            texts[index].append(completion.text)
            if out.finished:
                finish[index] = completion.finish_reason
                finished += 1
                del in_flight[out.request_id]
                on_done()
        last_admission_step = finished_before < window_end <= finished
        if prefilled:
            prefill_steps += 1
        elif outputs:
            step_seconds.append(seconds)
    wall = time.perf_counter() - begin
    output_tokens = sum(len(ids) for ids in token_ids)
    return {
        "output_tokens": output_tokens,
        "wall_s": wall,
        "tokens_per_s": output_tokens / wall if wall > 0 else 0.0,
        "step_latency_ms": {
            "p50": _ms(percentile(step_seconds, 50)),
            "p99": _ms(percentile(step_seconds, 99)),
            "mean": _ms(sum(step_seconds) / len(step_seconds)) if step_seconds else None,
            "decode_steps": len(step_seconds),
            "prefill_steps": prefill_steps,
        },
        "step_seconds_total": all_step_seconds,
        "sustained": {**sustained, "tokens_per_s": sustained["tokens"] / sustained["seconds"]
                      if sustained["seconds"] > 0 else None},
        "outputs": [
            {"text": "".join(t), "token_ids": ids, "finish_reason": f}
            for t, ids, f in zip(texts, token_ids, finish, strict=True)
        ],
    }


STEP_LOG = 1_000_000  # verification steps the engine keeps for the oracle (more than any cell takes)


def _step_log(worker) -> dict:
    """Runs in the worker (``collective_rpc``): the runner's AdaptiveSpec step records since the last call."""
    return worker.model_runner.adaptivespec.take_step_log()


def take_step_log(engine) -> dict:
    return engine.collective_rpc(_step_log)[0]


def _reset_suffix_cache(worker) -> bool:
    """Runs in the worker (``collective_rpc``): vLLM's suffix proposer gets a new, empty suffix cache of the
    same settings (no prompt trees, no cached responses). False when the runner has no suffix proposer."""
    drafter = getattr(worker.model_runner, "drafter", None)
    cache = getattr(drafter, "suffix_cache", None)
    if cache is None:
        return False
    drafter.suffix_cache = type(cache)(max_tree_depth=cache.max_tree_depth,
                                       max_cached_requests=cache.max_cached_requests)
    return True


def reset_suffix_cache(engine) -> bool:
    """Forget every response the suffix proposer has cached (call with no request in flight)."""
    return all(engine.collective_rpc(_reset_suffix_cache))


def hindsight_figures(log: dict) -> dict | None:
    """The policy's throughput against the best fixed depth and a per-step oracle, all priced by the
    engine's own fitted step costs (``step_cost.hindsight``); chains only (a tree's accepted path
    says nothing about what another tree would have accepted)."""
    from vllm_adaptivespec.step_cost import StepCosts, hindsight

    if log.get("mode") != "chain":
        return None
    figures = hindsight(log["steps"], StepCosts.from_snapshot(log["costs"]), log["max_depth"])
    return None if figures is None else {**figures, "costs": log["costs"]}  # the fitted model, for reading


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def main(job_path: str, events_path: str) -> int:
    job = json.loads(Path(job_path).read_text())
    events = Events(Path(events_path))
    config = job["config"]
    try:
        from vllm import LLM

        begin = time.perf_counter()
        extra = {}
        if config["speculative_config"]:
            extra["speculative_config"] = config["speculative_config"]
        if config["adaptivespec"]:
            extra["additional_config"] = {
                "adaptivespec": config["adaptivespec"],
                "adaptivespec_debug": {"record_steps": STEP_LOG},  # per-step records for the hindsight oracle
            }
        engine_args = dict(job["engine"])
        engine_args["max_model_len"] = _fit_max_model_len(job["target"], engine_args["max_model_len"])
        llm = LLM(model=job["target"], disable_log_stats=False, **extra, **engine_args)
        engine = llm.llm_engine
        tokenizer = llm.get_tokenizer()
        events.emit("loaded", seconds=time.perf_counter() - begin, max_model_len=engine_args["max_model_len"])
        _warm_up(engine, tokenizer, job)
    except Exception as err:  # a configuration vLLM refuses or cannot run
        traceback.print_exc()  # into the configuration's log
        events.emit("engine_failed", error=_describe(err), traceback=traceback.format_exc())
        return 1

    for index, cell in enumerate(job["cells"]):
        try:
            items = cell["items"]
            prompts = [render_prompt(tokenizer, item) for item in items]
            params = [sampling_params(cell, item) for item in items]
            done = 0

            def on_done() -> None:
                nonlocal done
                done += 1
                events.emit("progress", index=index, done=done, total=len(items))

            engine.reset_prefix_cache()  # every cell starts cold, whatever ran before it
            if (config["speculative_config"] or {}).get("method") == "suffix" and not reset_suffix_cache(engine):
                raise RuntimeError("the suffix configuration's engine has no suffix proposer to reset")
            if config["adaptivespec"]:
                take_step_log(engine)  # drop the warm-up's and earlier cells' records
            before = snapshot(llm.get_metrics(), exact_counters())
            result = run_cell(engine, prompts, params, cell["batch"], on_done, job["stall_timeout_s"])
            counts = delta(before, snapshot(llm.get_metrics(), exact_counters()))
            result["spec"] = spec_figures(counts)
            result["adaptivespec"] = adaptivespec_figures(counts)
            if config["adaptivespec"]:
                result.update(overhead_figures(counts, result["step_seconds_total"]))
                result["hindsight"] = hindsight_figures(take_step_log(engine))
            for item, output in zip(items, result["outputs"], strict=True):
                output["id"] = item["id"]
            events.emit("cell", index=index, result=result)
        except Exception as err:
            traceback.print_exc()
            events.emit("cell_failed", index=index, error=_describe(err), traceback=traceback.format_exc())
            if not _engine_idle(engine):  # requests of the failed cell still inside: stop here
                return 1
    return 0


def _fit_max_model_len(model_dir: str, requested: int) -> int:
    """The requested context, lowered to what the target supports (vLLM refuses more)."""
    try:
        limit = json.loads((Path(model_dir) / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError):
        return requested
    return min(requested, int(limit)) if limit else requested


def _warm_up(engine, tokenizer, job: dict) -> None:
    """One short request first, so one-time costs (allocations, kernel selection) are not measured."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    item = job["cells"][0]["items"][0]
    params = SamplingParams(max_tokens=8, temperature=0.0, output_kind=RequestOutputKind.DELTA)
    run_cell(engine, [render_prompt(tokenizer, item)], [params], 1, lambda: None, job["stall_timeout_s"])


def _engine_idle(engine) -> bool:
    try:
        return not engine.has_unfinished_requests()
    except Exception:
        return False


def _describe(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    return text if len(text) <= 2000 else text[:2000] + " ..."


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
