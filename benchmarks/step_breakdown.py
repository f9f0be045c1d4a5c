"""Where one engine step's time goes, per configuration: target forward, logits, sampling, drafter passes.

Not a test: it measures. Builds each configuration's engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0),
wraps the model runner's own methods with wall-clock timers (CPU: every call is synchronous) and runs the
same prompts (closed loop, ``--batch`` in flight), configurations interleaved over ``--rounds``. Per decode step (no prompt in it):

    step       the driver's ``LLMEngine.step()``
    prepare    ``execute_model`` minus the target forward and its logits (input layout, attention metadata)
    target     the target forward (``_model_forward``) and its query tokens
    t_logits   the target's ``compute_logits``
    sample     ``_sample`` (vLLM's sampler, or the rejection sampler / AdaptiveSpec's margin sampler)
    propose    ``propose_draft_token_ids``: every drafter pass and what is around them
    d_forward  drafter forwards (count, rows of each) and d_logits their ``compute_logits``
    rest       step - execute_model - sample_tokens: scheduling and output processing
    gc         Python's garbage collections during the step (inside any of the above)
    page faults  minor page faults of the whole measured run (fresh memory touched: allocator churn)

For AdaptiveSpec configurations it also prints the plan's fitted prices (``StepCosts``) next to the
measured figures, so a mispriced term shows. Writes JSON and Markdown under --output.

    python benchmarks/step_breakdown.py --configs ar,static-k2,pinned-k2,policy-only --rounds 2
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


class Timers:
    """Per-step sums of wrapped calls; ``calls[name]`` keeps (seconds, rows) of each call of the step."""

    def __init__(self):
        self.calls: dict[str, list[tuple[float, int]]] = defaultdict(list)

    def wrap(self, owner, attr: str, name: str, rows=lambda args, kwargs: 0) -> None:
        inner = getattr(owner, attr)

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.calls[name].append((time.perf_counter() - started, rows(args, kwargs)))

        setattr(owner, attr, timed)

    def take(self) -> dict[str, list[tuple[float, int]]]:
        calls, self.calls = dict(self.calls), defaultdict(list)
        return calls


def count_gc(timers: Timers) -> None:
    """Python's garbage collections go into the step's calls as ``gc`` (seconds, generation)."""
    started = {}

    def callback(phase, info):
        if phase == "start":
            started["t"] = time.perf_counter()
        elif "t" in started:
            timers.calls["gc"].append((time.perf_counter() - started.pop("t"), info["generation"]))

    gc.callbacks.append(callback)


def _rows(args, kwargs) -> int:
    ids = kwargs.get("input_ids", args[0] if args else None)
    return int(ids.shape[0]) if hasattr(ids, "shape") else 0


def install(worker, timers: Timers) -> None:
    runner = worker.model_runner
    timers.wrap(runner, "execute_model", "execute_model")
    timers.wrap(runner, "_model_forward", "target", _rows)
    timers.wrap(runner.model, "compute_logits", "t_logits")
    timers.wrap(runner, "_sample", "sample")
    timers.wrap(runner, "sample_tokens", "sample_tokens")
    timers.wrap(runner, "propose_draft_token_ids", "propose")
    drafter = getattr(runner, "drafter", None)
    if drafter is not None and hasattr(drafter, "model"):
        timers.wrap(drafter.model, "forward", "d_forward", _rows)
        timers.wrap(drafter.model, "compute_logits", "d_logits")


def step_costs(worker) -> dict | None:
    state = getattr(worker.model_runner, "adaptivespec", None)
    return None if state is None else state.step_costs.snapshot()


def measure(llm, timers: Timers, prompts, params, batch: int) -> list[dict]:
    """Closed loop, ``batch`` requests in flight; one record per engine step."""
    engine = llm.llm_engine
    engine.reset_prefix_cache()
    pending, in_flight, records = list(range(len(prompts))), 0, []
    while pending or engine.has_unfinished_requests():
        added = 0
        while pending and in_flight < batch:
            added += 1
            i = pending.pop(0)
            engine.add_request(f"r{i}", prompts[i], params[i])
            in_flight += 1
        timers.take()
        started = time.perf_counter()
        outputs = engine.step()
        step = time.perf_counter() - started
        in_flight -= sum(o.finished for o in outputs)
        records.append({"step": step, "prefill": added > 0, "tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
                        "calls": timers.take()})
    return records


def summarize(records: list[dict], max_query: int) -> dict:
    def total(r, name):
        return sum(s for s, _ in r["calls"].get(name, []))

    decode = [r for r in records if r["calls"].get("target") and r["calls"]["target"][0][1] <= max_query
              and r["tokens"] > 0 and not r["prefill"]]
    out = {"decode_steps": len(decode), "tokens": sum(r["tokens"] for r in decode)}
    fields = defaultdict(list)
    for r in decode:
        execute, sample_tokens = total(r, "execute_model"), total(r, "sample_tokens")
        target, t_logits = total(r, "target"), total(r, "t_logits")
        fields["step"].append(r["step"])
        fields["prepare"].append(execute - target - t_logits)
        fields["target"].append(target)
        fields["t_logits"].append(t_logits)
        fields["sample"].append(total(r, "sample"))
        fields["propose"].append(total(r, "propose"))
        fields["d_forward"].append(total(r, "d_forward"))
        fields["d_logits"].append(total(r, "d_logits"))
        fields["rest"].append(r["step"] - execute - sample_tokens)
        fields["gc"].append(total(r, "gc"))
        fields["gc_gen2"].append(sum(1 for _, g in r["calls"].get("gc", []) if g == 2))
        fields["d_passes"].append(len(r["calls"].get("d_forward", [])))
        fields["query"].append(r["calls"]["target"][0][1])
    for name, values in fields.items():
        scale = 1 if name in ("d_passes", "query", "gc_gen2") else 1000.0
        out[name] = {"mean": statistics.fmean(values) * scale, "p50": statistics.median(values) * scale}
    out["tokens_per_step"] = out["tokens"] / max(1, len(decode))
    # Drafter forwards by their rows: the first pass of a step runs over the accepted tokens, later ones over B.
    by_rows = defaultdict(list)
    for r in decode:
        for seconds, rows in r["calls"].get("d_forward", []):
            by_rows[rows].append(seconds * 1000.0)
    out["d_forward_by_rows"] = {k: {"n": len(v), "p50_ms": statistics.median(v)} for k, v in sorted(by_rows.items())}
    by_query = defaultdict(list)
    for r in decode:
        by_query[r["calls"]["target"][0][1]].append(r["calls"]["target"][0][0] * 1000.0)
    out["target_by_query"] = {k: {"n": len(v), "p50_ms": statistics.median(v)} for k, v in sorted(by_query.items())}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default="ar,static-k2,pinned-k2,policy-only")
    parser.add_argument("--workload", default="general")
    parser.add_argument("--limit", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/step-breakdown"))
    args = parser.parse_args()

    from vllm import LLM

    from vllm_adaptivespec.bench.configs import build_with_overrides
    from vllm_adaptivespec.bench.environment import describe
    from vllm_adaptivespec.bench.settings import LEAN_HUMANEVAL
    from vllm_adaptivespec.bench.worker import render_prompt, sampling_params
    from vllm_adaptivespec.bench.workloads import load
    from vllm_adaptivespec.models import model_path

    target, drafter = str(model_path("qwen-coder", "target")), str(model_path("qwen-coder", "drafter"))
    items = load(args.workload, LEAN_HUMANEVAL, args.limit)[: args.limit]
    cell = {"temperature": 0.0, "max_tokens": args.max_tokens}
    results: dict[str, list[dict]] = defaultdict(list)
    for round_ in range(args.rounds):
        for name in args.configs.split(","):
            config = build_with_overrides(name, drafter)
            extra = {}
            if config.speculative_config:
                extra["speculative_config"] = config.speculative_config
            if config.adaptivespec:
                extra["additional_config"] = {"adaptivespec": config.adaptivespec}
            llm = LLM(model=target, dtype=args.dtype, max_model_len=2048, enforce_eager=True, seed=0,
                      max_num_seqs=args.batch, **extra)
            timers = Timers()
            count_gc(timers)
            llm.collective_rpc(install, args=(timers,))
            tokenizer = llm.get_tokenizer()
            prompts = [render_prompt(tokenizer, asdict(item)) for item in items]
            params = [sampling_params(cell, asdict(item)) for item in items]
            measure(llm, timers, prompts[:1], params[:1], 1)  # warm-up
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            summary = summarize(measure(llm, timers, prompts, params, args.batch), max_query=16 * args.batch)
            summary["page_faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
            summary["fitted"] = llm.collective_rpc(step_costs)[0]
            results[name].append(summary)
            print(name, f"round {round_ + 1}:", json.dumps({k: v for k, v in summary.items()
                                                            if k not in ("fitted", "d_forward_by_rows")}), flush=True)
            gc.callbacks.clear()
            llm.llm_engine.engine_core.shutdown()
            del llm
            gc.collect()
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "results.json").write_text(json.dumps({"command": " ".join(sys.argv), "environment": describe(),
                                                          "results": results}, indent=1))
    lines = [f"# Step breakdown (batch {args.batch}, decode steps, ms; median over rounds of each round's mean)", "",
             f"`{' '.join(sys.argv)}`", "",
             "| config | tok/step | step | prepare | target | t_logits | sample | propose | d_forward | d_passes "
             "| d_logits | rest | gc | gen-2 gc / step | page faults |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, rounds in results.items():
        def med(field):
            return statistics.median(r[field]["mean"] for r in rounds)
        lines.append(f"| `{name}` | {statistics.median(r['tokens_per_step'] for r in rounds):.2f} | "
                     + " | ".join(f"{med(f):.1f}" if f != "d_passes" else f"{med(f):.2f}" for f in
                                  ("step", "prepare", "target", "t_logits", "sample", "propose", "d_forward",
                                   "d_passes", "d_logits", "rest", "gc")) + f" | {med('gc_gen2'):.3f} | {statistics.median(r['page_faults'] for r in rounds):.0f} |")
    (args.output / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
