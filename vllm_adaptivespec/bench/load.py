"""Open-loop burst load against an OpenAI-compatible server: many streaming chat requests at once.

All requests are sent together (``concurrency`` in flight at most) and read as server-sent events. Per
request the driver keeps what a client sees: the text, the finish reason, any error, the time to the
first content chunk and the times of every later chunk. A request may be told to hang up after some
chunks (``disconnect_after``), as a client that goes away mid-stream does.

Figures (``summary``), over the requests that were not meant to hang up:

    throughput    completion tokens (the server's own ``usage``) / wall time of the whole burst
    TTFT          time from sending to the first content chunk, p50 and p99
    ITL           time between consecutive content chunks of a request, p50 and p99, over all gaps
                  (with speculation one chunk may carry several tokens, so it is the client's wait
                  between updates)
    TPOT          per request (last chunk - first chunk) / (completion tokens - 1), p50 and p99

The request mix (``mixed_requests``) is seeded: prompts of mixed lengths (a few words to a few hundred),
mixed ``max_tokens``, and every third request with stop strings, so some streams end on a stop.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, field, replace

import numpy as np

WORDS = ("the cat sat on a mat while the dog ran after a ball in the park and every bird sang loudly "
         "because spring had come early this year so people went outside to walk and talk").split()
STOPS = ([" the"], ["."], ["\n", " and"])


@dataclass(frozen=True)
class LoadRequest:
    id: str
    messages: list[dict]
    max_tokens: int
    stop: list[str] | None = None
    disconnect_after: int | None = None  # content chunks read before hanging up; None = read to the end


@dataclass
class StreamResult:
    id: str
    status: int = 0
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int | None = None
    error: str | None = None
    token_ids: list[int] = field(default_factory=list)
    ttft_s: float | None = None
    chunk_times_s: list[float] = field(default_factory=list)  # since sending, one per content chunk
    disconnected: bool = False


def mixed_requests(n: int, seed: int = 0, max_prompt_words: int = 240, max_tokens: tuple[int, ...] = (8, 16, 32, 64),
                   stops: tuple[list[str], ...] = STOPS) -> list[LoadRequest]:  # fmt: skip
    """``n`` chat requests: prompt lengths spread over 4..``max_prompt_words`` words (log-uniform), max_tokens
    drawn from ``max_tokens``, stop strings (taking turns through ``stops``) on every third request."""
    rng = random.Random(seed)
    requests = []
    for i in range(n):
        words = int(round(4 * (max_prompt_words / 4) ** rng.random()))
        text = " ".join(rng.choice(WORDS) for _ in range(words))
        requests.append(LoadRequest(
            id=f"load-{i}", messages=[{"role": "user", "content": f"Request {i}: continue this. {text}"}],
            max_tokens=rng.choice(max_tokens), stop=stops[i // 3 % len(stops)] if i % 3 == 2 else None,
        ))  # fmt: skip
    return requests


# Asked of every request: each emitted token as its id with the two likeliest candidates' logprobs, so a
# client can compare outputs token by token and tell a real departure from a near-tie.
TOKEN_IDS = {"logprobs": True, "top_logprobs": 2, "return_tokens_as_token_ids": True}


def hang_ups(n: int, seed: int = 1) -> list[LoadRequest]:
    """``n`` requests whose clients disconnect after 2-4 content chunks (64 tokens asked, so they would go on)."""
    return [replace(r, id=f"hang-up-{i}", disconnect_after=2 + i % 3)
            for i, r in enumerate(mixed_requests(n, seed=seed, max_tokens=(64,)))]  # fmt: skip


def interleave(kept: list[LoadRequest], hang_ups: list[LoadRequest]) -> list[LoadRequest]:
    """One burst: the kept requests with a hang-up after each of the first ``len(hang_ups)``."""
    return [x for pair in zip(kept, hang_ups + [None] * len(kept)) for x in pair if x is not None]


def request_body(model: str, request: LoadRequest, stream: bool, extra: dict | None = None) -> dict:
    body = {"model": model, "messages": request.messages, "max_tokens": request.max_tokens, "temperature": 0,
            "stream": stream, **TOKEN_IDS, **(extra or {})}  # fmt: skip
    if request.stop:
        body["stop"] = request.stop
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def stream_one(client, base_url: str, model: str, request: LoadRequest, extra: dict | None) -> StreamResult:
    """One streamed chat completion, read event by event (hangs up after ``disconnect_after`` chunks)."""
    result = StreamResult(request.id)
    sent = time.perf_counter()
    try:
        async with client.stream("POST", f"{base_url}/v1/chat/completions",
                                 json=request_body(model, request, True, extra)) as response:  # fmt: skip
            result.status = response.status_code
            if response.status_code != 200:
                result.error = (await response.aread()).decode(errors="replace")[:500]
                return result
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[len("data: "):])
                if "error" in event:
                    result.error = json.dumps(event["error"])[:500]
                    continue
                if event.get("usage"):
                    result.completion_tokens = event["usage"].get("completion_tokens")
                for choice in event.get("choices") or []:
                    result.token_ids += _token_ids(choice)
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        now = time.perf_counter() - sent
                        if result.ttft_s is None:
                            result.ttft_s = now
                        result.chunk_times_s.append(now)
                        result.text += content
                    if choice.get("finish_reason"):
                        result.finish_reason = choice["finish_reason"]
                if request.disconnect_after is not None and len(result.chunk_times_s) >= request.disconnect_after:
                    result.disconnected = True
                    return result  # leaving the block closes the connection
    except Exception as err:  # a dropped connection, a timeout: the client's view of a failure
        result.error = f"{type(err).__name__}: {err}"
    return result


async def _burst(base_url: str, model: str, requests: list[LoadRequest], concurrency: int, extra: dict | None,
                 timeout_s: float) -> tuple[list[StreamResult], float]:  # fmt: skip
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits, trust_env=False) as client:
        gate = asyncio.Semaphore(concurrency)

        async def one(request: LoadRequest) -> StreamResult:
            async with gate:
                return await stream_one(client, base_url, model, request, extra)

        begin = time.perf_counter()
        results = await asyncio.gather(*(one(r) for r in requests))
        return list(results), time.perf_counter() - begin


def run_load(base_url: str, model: str, requests: list[LoadRequest], concurrency: int = 64,
             extra: dict | None = None, timeout_s: float = 600) -> dict:  # fmt: skip
    """Send ``requests`` as one burst; returns {"results": [StreamResult as dict], "wall_s", "summary"}."""
    results, wall = asyncio.run(_burst(base_url, model, requests, concurrency, extra, timeout_s))
    return {"results": [asdict(r) for r in results], "wall_s": wall, "summary": summary(results, wall)}


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p99": None}
    return {"p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99))}


def summary(results: list[StreamResult], wall_s: float) -> dict:
    kept = [r for r in results if not r.disconnected]
    tokens = sum(r.completion_tokens or 0 for r in kept)
    gaps = [b - a for r in kept for a, b in zip(r.chunk_times_s, r.chunk_times_s[1:])]
    tpot = [(r.chunk_times_s[-1] - r.chunk_times_s[0]) / (r.completion_tokens - 1)
            for r in kept if r.completion_tokens and r.completion_tokens > 1 and len(r.chunk_times_s) > 1]  # fmt: skip
    return {
        "requests": len(kept),
        "disconnected": sum(r.disconnected for r in results),
        "failed": sum(r.error is not None or r.finish_reason is None for r in kept),
        "completion_tokens": tokens,
        "wall_s": wall_s,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else 0.0,
        "ttft_s": _percentiles([r.ttft_s for r in kept if r.ttft_s is not None]),
        "itl_s": _percentiles(gaps),
        "tpot_s": _percentiles(tpot),
        "chunks_per_request": float(np.mean([len(r.chunk_times_s) for r in kept])) if kept else None,
    }


def _token_ids(choice: dict) -> list[int]:
    """The ids of a choice's tokens (``return_tokens_as_token_ids`` writes each as "token_id:<id>")."""
    return [int(t["token"].split(":", 1)[1]) for t in ((choice.get("logprobs") or {}).get("content") or [])]


def first_departure(got: list[int], want: list[int]) -> int | None:
    """The first position where two token sequences differ (one ending early counts), None if equal."""
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return i
    return None if len(got) == len(want) else min(len(got), len(want))


def complete_alone(base_url: str, model: str, request: LoadRequest, extra: dict | None = None,
                   timeout_s: float = 120) -> dict:  # fmt: skip
    """The same request, not streamed, with nothing else in flight: {"text", "finish_reason", "token_ids",
    "margins"}, margins[j] = logprob of the likeliest token at position j - that of the second likeliest."""
    import httpx

    response = httpx.post(f"{base_url}/v1/chat/completions", json=request_body(model, request, False, extra),
                          timeout=timeout_s, trust_env=False)  # fmt: skip
    response.raise_for_status()
    (choice,) = response.json()["choices"]
    tops = [sorted((c["logprob"] for c in t["top_logprobs"]), reverse=True) for t in choice["logprobs"]["content"]]
    return {"text": choice["message"]["content"] or "", "finish_reason": choice["finish_reason"],
            "token_ids": _token_ids(choice), "margins": [t[0] - t[1] if len(t) > 1 else float("inf") for t in tops]}
