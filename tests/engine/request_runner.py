"""Run batches of requests, each with its own sampling parameters, through one vLLM engine in a fresh
process; print every request's outputs step by step as JSON (used by test_faults.py).

    python request_runner.py '<json spec>'
spec: {"engine": {LLM kwargs}, "batches": {name: [request, ...]}}
request: {"prompt": [token ids], "params": {SamplingParams kwargs},
          "stop_from": {"batch": name, "index": i, "token": k},         (optional, see below)
          "stop_token_from": {"batch": name, "index": i, "token": k}}   (optional)

The requests of a batch are added together and stepped to completion with delta outputs, so each
output's ``chunks`` are the tokens it got per engine step (a step that accepted drafts emits several).
``stop_from``: a stop string taken from an earlier batch's output (request ``index``, the text of its
tokens ``k - 1`` and ``k``), so two engines whose earlier outputs agree stop on the same string;
``stop_token_from``: likewise a stop token id, that output's token ``k``.
"""

from __future__ import annotations

import json
import sys


def stop_string(tokenizer, token_ids: list[int], k: int) -> str | None:
    """The text of tokens k-1 and k, if it is printable text a stop string can match."""
    text = tokenizer.decode(token_ids[max(0, k - 1) : k + 1])
    return text if text.strip() and "\ufffd" not in text else None


def run_batch(engine, tokenizer, name: str, requests: list[dict], done: dict) -> list[dict]:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    results = []
    for i, request in enumerate(requests):
        params = dict(request["params"])
        source = request.get("stop_from")
        if source:
            earlier = done[source["batch"]][source["index"]]["outputs"][0]["token_ids"]
            stop = stop_string(tokenizer, earlier, source["token"])
            params["stop"] = [stop] if stop else None
        source = request.get("stop_token_from")
        if source:
            earlier = done[source["batch"]][source["index"]]["outputs"][0]["token_ids"]
            params["stop_token_ids"] = [earlier[source["token"]]]
        rid = f"{name}-{i}"
        engine.add_request(
            rid, {"prompt_token_ids": request["prompt"]}, SamplingParams(**params, output_kind=RequestOutputKind.DELTA)
        )
        results.append({"id": rid, "stop": params.get("stop"), "outputs": {}})
    by_id = {r["id"]: r for r in results}
    while engine.has_unfinished_requests():
        for out in engine.step():
            for o in out.outputs:
                rec = by_id[out.request_id]["outputs"].setdefault(
                    o.index, {"token_ids": [], "text": "", "chunks": [], "logprobs": [], "top_logprob": []}
                )
                rec["token_ids"] += list(o.token_ids)
                rec["text"] += o.text
                if o.token_ids:
                    rec["chunks"].append(len(o.token_ids))
                for token, candidates in zip(o.token_ids, o.logprobs or []):
                    rec["logprobs"].append(candidates[token].logprob)
                    rec["top_logprob"].append(max(c.logprob for c in candidates.values()))
                if o.finish_reason is not None:
                    rec["finish_reason"], rec["stop_reason"] = o.finish_reason, o.stop_reason
    for r in results:
        r["outputs"] = [r["outputs"][k] for k in sorted(r["outputs"])]
    return results


def main() -> None:
    from engine_runner import start_llm  # this script's folder is on sys.path

    spec = json.loads(sys.argv[1])
    llm = start_llm(spec)
    tokenizer = llm.get_tokenizer()
    done: dict[str, list[dict]] = {}
    for name, requests in spec["batches"].items():
        done[name] = run_batch(llm.llm_engine, tokenizer, name, requests, done)
    metrics = {m.name: m.value for m in llm.get_metrics() if m.name.startswith("vllm:") and hasattr(m, "value")
               and ("spec_decode" in m.name or "adaptivespec" in m.name)}  # fmt: skip
    print("ENGINE_RESULT " + json.dumps({"batches": done, "metrics": metrics}), flush=True)


if __name__ == "__main__":
    main()
