"""The tiny test-model factory: deterministic checkpoints that vLLM loads, serves chat with, and drafts for."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from vllm_helpers import engine, greedy_token_ids, spec_decode_counts

from vllm_adaptivespec.models.tiny import write_target, write_tiny_models

PROMPTS = ["def fibonacci(n):", "The capital of France is", "Hello! How can I help you today?",
           "Once upon a time"]  # fmt: skip
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_models(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def runs(tiny, vllm_env):
    """Greedy outputs of the target alone, with the draft model, and with the EAGLE-3 head.

    One engine at a time (each is shut down before the next starts).
    """
    from vllm import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    results = {}
    speculative = {
        "target": None,
        "draft_model": {"method": "draft_model", "model": str(tiny.draft), "num_speculative_tokens": 3},
        "eagle3": {"method": "eagle3", "model": str(tiny.eagle3), "num_speculative_tokens": 2},
    }
    for name, spec in speculative.items():
        with engine(model=str(tiny.target), dtype="float32", speculative_config=spec) as llm:
            results[name] = {
                "tokens": greedy_token_ids(llm, PROMPTS, MAX_TOKENS),
                "counts": spec_decode_counts(llm) if spec else {},
                "chat": llm.chat([{"role": "user", "content": "hi"}], greedy, use_tqdm=False)[0],
            }
    return results


def test_same_seed_same_weights_other_seed_differs(tmp_path):
    a = load_file(str(write_target(tmp_path / "a", seed=3) / "model.safetensors"))
    b = load_file(str(write_target(tmp_path / "b", seed=3) / "model.safetensors"))
    c = load_file(str(write_target(tmp_path / "c", seed=4) / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "c" / "tokenizer.json").read_bytes()


def test_tokenizer_round_trips_and_has_chat_template(tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny.target)
    text = "def add(a, b):\n    return a + b  # ünïcode ✓"
    assert tok.decode(tok(text).input_ids) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_tokens_to_ids("<|im_end|>") == json.loads(
        (tiny.target / "config.json").read_text())["eos_token_id"]


def test_draft_is_the_target_prefix_and_eagle3_head_has_vllm_layout(tiny):
    target = load_file(str(tiny.target / "model.safetensors"))
    draft = load_file(str(tiny.draft / "model.safetensors"))
    assert json.loads((tiny.draft / "config.json").read_text())["num_hidden_layers"] == 1
    assert all(torch.equal(draft[k], target[k]) for k in draft)
    head = load_file(str(tiny.eagle3 / "model.safetensors"))
    config = json.loads((tiny.eagle3 / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    draft_vocab = config["draft_vocab_size"]
    assert head["lm_head.weight"].shape[0] == draft_vocab < config["vocab_size"]
    target_ids = torch.arange(draft_vocab) + head["d2t"]
    assert torch.equal(head["lm_head.weight"], target["lm_head.weight"][target_ids])
    assert head["t2d"].sum() == draft_vocab and head["t2d"][target_ids].all()
    assert head["fc.weight"].shape[1] == len(config["eagle_aux_hidden_state_layer_ids"]) * config["hidden_size"]


def test_vllm_greedy_matches_transformers(tiny, runs):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny.target)
    model = AutoModelForCausalLM.from_pretrained(tiny.target, dtype=torch.float32)
    for prompt, vllm_tokens in zip(PROMPTS, runs["target"]["tokens"]):
        ids = tok(prompt, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS, do_sample=False)
        assert out[0, ids.shape[1]:].tolist() == vllm_tokens


@pytest.mark.parametrize("method", ["draft_model", "eagle3"])
def test_speculative_decoding_is_lossless_and_accepts_some_drafts(runs, method):
    assert runs[method]["tokens"] == runs["target"]["tokens"]
    assert runs[method]["chat"].outputs[0].token_ids == runs["target"]["chat"].outputs[0].token_ids
    counts = runs[method]["counts"]
    # Both the accept and the reject paths are exercised: neither none nor all drafts accepted.
    assert 0 < counts["num_accepted_tokens"] < counts["num_draft_tokens"]
