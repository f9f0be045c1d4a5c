"""Serving load: one burst of concurrent streaming chat requests against `vllm serve`, per configuration.

    python benchmarks/load.py [--pair qwen-coder] [--streams 64] [--hang-ups 8] [--configs plain,stock-k2,adaptivespec]
                              [--output benchmarks/results/load-<pair>]

Each configuration gets its own server, started the way the images start it (`deploy/entrypoint.sh`, the
engine in its own process as `vllm serve` runs it), one after another so they never share the CPU. Every
server receives the same burst (`vllm_adaptivespec.bench.load.mixed_requests`: mixed prompt lengths, mixed
``max_tokens``, stop strings on every third request, greedy) plus ``--hang-ups`` clients that disconnect
after a few chunks, all at once. Written: results.json (every request's view and the summaries),
results.md (throughput, TTFT and ITL p50/p99, failures) and plots/load.png, so AdaptiveSpec is read next
to plain decoding and stock vLLM speculation under the same load. One burst per configuration: a first
look, not a benchmark that resolves 5% (run it again, interleaved, for that).

Configurations: ``plain`` (no speculation), ``stock-k<k>`` (vLLM draft-model speculation, k tokens, no
AdaptiveSpec), ``adaptivespec`` (AdaptiveSpec chains, lossless, default settings), ``adaptivespec-tree``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vllm_adaptivespec.bench import load, plots
from vllm_adaptivespec.bench.server import Server

SERVER_ARGS = ("--enforce-eager", "--max-model-len", "2048", "--seed", "0")


def model_path(pair: str, role: str) -> str:
    return subprocess.run(["adaptivespec", "models", "path", "--pair", pair, "--role", role], check=True,
                          capture_output=True, text=True).stdout.strip()  # fmt: skip


def config_env(name: str, target: str, drafter: str) -> dict[str, str]:
    base = {"MODEL": target, "SERVED_MODEL_NAME": "model"}
    if name == "plain":
        return base
    if name.startswith("stock-k"):
        return {**base, "DRAFT_MODEL": drafter, "NUM_SPEC_TOKENS": name[len("stock-k"):], "ADAPTIVESPEC": "0"}
    if name == "adaptivespec":
        return {**base, "DRAFT_MODEL": drafter, "NUM_SPEC_TOKENS": "8", "ADAPTIVESPEC_TAU": "1"}
    if name == "adaptivespec-tree":
        return {**base, "DRAFT_MODEL": drafter, "NUM_SPEC_TOKENS": "24", "ADAPTIVESPEC_TAU": "1",
                "ADAPTIVESPEC_CONFIG": '{"mode": "tree"}'}  # fmt: skip
    raise SystemExit(f"unknown configuration {name!r}")


def markdown(run: dict) -> str:
    lines = [f"# Serving load: {run['pair']}, {run['streams']} streams + {run['hang_ups']} hang-ups at once", "",
             f"Command: `{run['command']}`", "",
             "| configuration | tok/s | x plain | TTFT p50 / p99 s | ITL p50 / p99 ms | TPOT p50 ms | chunks/request | failed |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    plain = run["configs"].get("plain", {}).get("summary", {}).get("tokens_per_s")
    for name, result in run["configs"].items():
        s = result["summary"]
        ratio = f"{s['tokens_per_s'] / plain:.2f}x" if plain else "-"
        lines.append(f"| {name} | {s['tokens_per_s']:.1f} | {ratio} | {s['ttft_s']['p50']:.2f} / {s['ttft_s']['p99']:.2f} "
                     f"| {s['itl_s']['p50'] * 1000:.0f} / {s['itl_s']['p99'] * 1000:.0f} | {s['tpot_s']['p50'] * 1000:.0f} "
                     f"| {s['chunks_per_request']:.1f} | {s['failed']} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pair", default="qwen-coder")
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--hang-ups", type=int, default=8)
    parser.add_argument("--configs", default="plain,stock-k2,adaptivespec")
    parser.add_argument("--output", type=Path)
    parser.add_argument("--startup-s", type=float, default=900)
    args = parser.parse_args()
    output = args.output or Path(__file__).parent / "results" / f"load-{args.pair}"
    output.mkdir(parents=True, exist_ok=True)
    target, drafter = model_path(args.pair, "target"), model_path(args.pair, "drafter")
    kept = load.mixed_requests(args.streams, seed=0)
    burst = load.interleave(kept, load.hang_ups(args.hang_ups, seed=1))
    run = {"pair": args.pair, "streams": args.streams, "hang_ups": args.hang_ups, "command": " ".join(sys.argv),
           "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "configs": {}}  # fmt: skip
    logs = Path(tempfile.mkdtemp(prefix="load-logs-"))
    for name in args.configs.split(","):
        server = Server(name, config_env(name, target, drafter), logs, SERVER_ARGS)
        try:
            server.wait_healthy(time.monotonic() + args.startup_s)
            load.complete_alone(server.base_url, "model", kept[0])  # warm-up
            result = load.run_load(server.base_url, "model", burst, concurrency=len(burst))
        finally:
            server.stop()
        run["configs"][name] = result
        s = result["summary"]
        print(f"{name}: {s['tokens_per_s']:.1f} tok/s, TTFT p50 {s['ttft_s']['p50']:.2f} s, "
              f"ITL p50 {s['itl_s']['p50'] * 1000:.0f} ms, failed {s['failed']}", flush=True)
        (output / "results.json").write_text(json.dumps(run, indent=1))
        (output / "results.md").write_text(markdown(run))
        plots.load_figures(run, output / "plots" / "load.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
