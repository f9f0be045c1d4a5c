"""Tiny random-weight checkpoints for tests, written in seconds and loadable by vLLM.

`write_tiny_models(root)` gives a Llama target, a draft model (the target's first
layers) and an EAGLE-3 head, all sharing one small byte-level BPE tokenizer with a
ChatML template. Weights are random but deterministic given the seed, and built so
drafts are sometimes accepted:

* the target's decoder layers add only a small perturbation (``layer_std``) to the
  embedding in the residual stream, so its next token is mostly a function of the
  current token, nudged by context through attention;
* the draft model is the target's first ``draft_layers`` layers (exact prefix);
* the EAGLE-3 head ignores the target's hidden states (``hidden_norm`` is zero, with
  ``norm_before_residual``) and copies the current token's normalized embedding
  through a self-attending layer to the target's own LM head rows, i.e. it predicts
  the target's "bigram" token. Its draft vocabulary is a subset (``d2t``/``t2d``)
  holding every token that bigram can produce.

Raising ``layer_std`` makes the target depend more on context and lowers acceptance.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from .convert import cut_layer_prefix

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Training text for the tokenizer: a little English and a little Python, fixed here
# so the tokenizer (and therefore every tiny model) is the same on every machine.
CORPUS = """\
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
Speculative decoding drafts several tokens with a small model and verifies them with the large one.
When the draft is right, many tokens are accepted at once; when it is wrong, the target corrects it.
The capital of France is Paris. The capital of Italy is Rome. The capital of Japan is Tokyo.
Once upon a time there was a little robot who wanted to learn how to write poems about the sea.
Question: what is two plus three? Answer: two plus three is five. What is ten minus four? Six.
def add(a, b):
    return a + b

def fibonacci(n):
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)

for i in range(10):
    print(i, fibonacci(i))

class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        return self.items.pop()

import numpy as np
x = np.arange(12).reshape(3, 4)
print(x.sum(axis=0), x.mean())
Hello! How can I help you today? Please write a short story about a cat and a dog who become friends.
Sure, here is a short story. The cat and the dog lived in the same house, and every morning they shared
the sunny spot by the window. Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Symbols: ( ) [ ] { } < > = + - * / .
"""


@dataclass(frozen=True)
class TinyModels:
    target: Path
    draft: Path
    eagle3: Path


def write_tokenizer(out_dir: Path, vocab_size: int = 512):
    """Train a byte-level BPE on `CORPUS`, save it (with the chat template) and return it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out_dir)
    return tokenizer


def _llama_config(tokenizer, vocab_size: int, hidden: int, layers: int, heads: int,
                  kv_heads: int, intermediate: int, max_positions: int) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "dtype": "float32",
    }


def _write_checkpoint(out_dir: Path, config: dict, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})


def write_target(out_dir: Path, *, seed: int = 0, layers: int = 4, hidden: int = 128,
                 heads: int = 4, kv_heads: int = 2, intermediate: int = 256,
                 layer_std: float = 0.02, vocab_size: int = 512,
                 max_positions: int = 2048) -> Path:
    """A random Llama whose layers perturb the residual stream by about ``layer_std``."""
    out_dir = Path(out_dir)
    tokenizer = write_tokenizer(out_dir, vocab_size)
    vocab = len(tokenizer)
    config = _llama_config(tokenizer, vocab, hidden, layers, heads, kv_heads, intermediate,
                           max_positions)
    head_dim = hidden // heads
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=gen) * std

    tensors = {
        "model.embed_tokens.weight": randn(vocab, hidden),
        "model.norm.weight": torch.ones(hidden),
        "lm_head.weight": randn(vocab, hidden, std=hidden**-0.5),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": torch.ones(hidden),
            p + "post_attention_layernorm.weight": torch.ones(hidden),
            p + "self_attn.q_proj.weight": randn(heads * head_dim, hidden, std=hidden**-0.5),
            p + "self_attn.k_proj.weight": randn(kv_heads * head_dim, hidden, std=hidden**-0.5),
            p + "self_attn.v_proj.weight": randn(kv_heads * head_dim, hidden, std=hidden**-0.5),
            p + "self_attn.o_proj.weight": randn(hidden, heads * head_dim, std=layer_std),
            p + "mlp.gate_proj.weight": randn(intermediate, hidden, std=hidden**-0.5),
            p + "mlp.up_proj.weight": randn(intermediate, hidden, std=hidden**-0.5),
            p + "mlp.down_proj.weight": randn(hidden, intermediate, std=layer_std),
        }
    _write_checkpoint(out_dir, config, tensors)
    return out_dir


def write_draft(target_dir: Path, out_dir: Path, *, layers: int = 1) -> Path:
    """The target's first ``layers`` layers, as a standalone model for ``method="draft_model"``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cut_layer_prefix(Path(target_dir), out_dir, layers)
    return out_dir


def write_disagreeing_draft(out_dir: Path, *, seed: int = 0, layer_std: float = 0.1) -> Path:
    """A drafter for ``write_target(seed=seed)`` made to disagree: the target's embedding and head (drawn
    first from the same seed) around one layer of its own that moves the residual stream 5x more than the
    target's layers do. On random contexts it picks the target's top token about 1 time in 5, and most of
    its other picks are within a 0.3 margin of the target's top token, so a margin rule at tau 0.3 would promote
    several tokens a step if nothing bounded it."""
    return write_target(Path(out_dir), seed=seed, layers=1, layer_std=layer_std)


def write_eagle3(target_dir: Path, out_dir: Path, *, draft_vocab_size: int | None = 384,
                 attention_scale: float = 4.0) -> Path:
    """An EAGLE-3 head for ``target_dir`` in the layout vLLM's ``Eagle3LlamaForCausalLM`` loads.

    ``draft_vocab_size=None`` keeps the full vocabulary (no ``d2t``/``t2d``).
    """
    from safetensors.torch import load_file

    target_dir, out_dir = Path(target_dir), Path(out_dir)
    target_config = json.loads((target_dir / "config.json").read_text())
    weights = load_file(str(target_dir / "model.safetensors"))
    embed, lm_head = weights["model.embed_tokens.weight"], weights["lm_head.weight"]
    vocab, hidden = embed.shape
    layers = target_config["num_hidden_layers"]

    # Tokens the target's embedding -> LM head map can produce go into the draft vocabulary first.
    normed = embed * torch.rsqrt(embed.pow(2).mean(-1, keepdim=True) + target_config["rms_norm_eps"])
    reachable = torch.unique((normed @ lm_head.T).argmax(-1)).tolist()
    size = vocab if draft_vocab_size is None else min(draft_vocab_size, vocab)
    rest = [t for t in range(vocab) if t not in set(reachable)]
    draft_ids = torch.tensor(sorted((reachable + rest)[:size]))

    heads = hidden // 32
    head_dim = 32
    aux_layers = sorted({1, layers // 2, layers - 1})
    eye = torch.eye(hidden)
    zeros = torch.zeros(hidden, hidden)
    intermediate = target_config["intermediate_size"]
    # Layer 0 reads [normalized embedding, normalized hidden]: q, k and v see only the embedding,
    # q.k is large for the token itself, v copies it, o_proj passes it on, the MLP adds nothing.
    tensors = {
        "midlayer.input_layernorm.weight": torch.ones(hidden),
        "midlayer.hidden_norm.weight": torch.zeros(hidden),
        "midlayer.post_attention_layernorm.weight": torch.ones(hidden),
        "midlayer.self_attn.q_proj.weight": torch.cat([eye, zeros], 1) * attention_scale,
        "midlayer.self_attn.k_proj.weight": torch.cat([eye, zeros], 1) * attention_scale,
        "midlayer.self_attn.v_proj.weight": torch.cat([eye, zeros], 1),
        "midlayer.self_attn.o_proj.weight": eye.clone(),
        "midlayer.mlp.gate_proj.weight": torch.zeros(intermediate, hidden),
        "midlayer.mlp.up_proj.weight": torch.zeros(intermediate, hidden),
        "midlayer.mlp.down_proj.weight": torch.zeros(hidden, intermediate),
        "norm.weight": weights["model.norm.weight"].clone(),
        "fc.weight": torch.zeros(hidden, len(aux_layers) * hidden),
        "lm_head.weight": lm_head[draft_ids].clone(),
    }
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "vocab_size": vocab,
        "draft_vocab_size": size,
        "hidden_size": hidden,
        "target_hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": target_config["max_position_embeddings"],
        "rms_norm_eps": target_config["rms_norm_eps"],
        "rope_theta": target_config["rope_theta"],
        "tie_word_embeddings": False,
        "norm_before_residual": True,
        "eagle_aux_hidden_state_layer_ids": aux_layers,
        "bos_token_id": target_config["bos_token_id"],
        "eos_token_id": target_config["eos_token_id"],
        "pad_token_id": target_config["pad_token_id"],
        "dtype": "float32",
    }
    if size < vocab:
        tensors["d2t"] = draft_ids - torch.arange(size)
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[draft_ids] = True
        tensors["t2d"] = t2d
    _write_checkpoint(out_dir, config, tensors)
    return out_dir


def write_tiny_models(root: Path, *, seed: int = 0, draft_layers: int = 1,
                      layer_std: float = 0.02) -> TinyModels:
    """Target, draft model and EAGLE-3 head under ``root`` (``target/``, ``draft/``, ``eagle3/``)."""
    root = Path(root)
    target = write_target(root / "target", seed=seed, layer_std=layer_std)
    return TinyModels(
        target=target,
        draft=write_draft(target, root / "draft", layers=draft_layers),
        eagle3=write_eagle3(target, root / "eagle3"),
    )
