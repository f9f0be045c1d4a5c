"""Wait for an OpenAI-compatible vLLM server, send one real chat completion, and show its speed and
the speculative-decoding figures the server itself reports on /metrics (used by scripts/serve.sh)."""

from __future__ import annotations

import argparse
import re
import sys
import time

import requests

COUNTERS = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:adaptivespec_promoted_tokens_total",
)


def counters(url: str) -> dict[str, float]:
    text = requests.get(f"{url}/metrics", timeout=10).text
    values = {}
    for name in COUNTERS:
        values[name] = sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M))
    return values


def wait_healthy(url: str, timeout: float, server_pid: int | None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        if server_pid is not None:
            try:
                import os

                os.kill(server_pid, 0)
            except OSError:
                sys.exit("the server exited before it became healthy (see its log above)")
        time.sleep(2)
    sys.exit(f"no healthy server at {url} after {timeout:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds to wait for /health")
    parser.add_argument("--server-pid", type=int, help="give up early if this process dies")
    parser.add_argument("--prompt", default="Write a Python function that checks whether a string is a palindrome.")
    args = parser.parse_args()

    wait_healthy(args.url, args.timeout, args.server_pid)
    before = counters(args.url)
    start = time.monotonic()
    reply = requests.post(
        f"{args.url}/v1/chat/completions",
        json={"model": args.model, "messages": [{"role": "user", "content": args.prompt}],
              "max_tokens": 256, "temperature": 0},  # fmt: skip
        timeout=args.timeout,
    )
    elapsed = time.monotonic() - start
    reply.raise_for_status()
    body = reply.json()
    after = counters(args.url)
    delta = {name: after[name] - before[name] for name in COUNTERS}
    tokens = body["usage"]["completion_tokens"]
    print(body["choices"][0]["message"]["content"])
    print(f"\n{tokens} tokens in {elapsed:.1f} s: {tokens / elapsed:.2f} tok/s (prefill included)")
    drafts = delta["vllm:spec_decode_num_drafts_total"]
    if drafts:
        accepted = delta["vllm:spec_decode_num_accepted_tokens_total"]
        drafted = delta["vllm:spec_decode_num_draft_tokens_total"]
        print(f"mean acceptance length {1 + accepted / drafts:.2f} tokens/step, "
              f"{accepted:.0f}/{drafted:.0f} draft tokens accepted, "
              f"{delta['vllm:adaptivespec_promoted_tokens_total']:.0f} by the margin rule")  # fmt: skip


if __name__ == "__main__":
    main()
