"""Write a tiny Llama checkpoint as a GGUF file the way llama.cpp's converter does.

The q/k projections are permuted to llama.cpp's rotary layout, one tensor is stored
as Q8_0 and the rest as F32, and the tokenizer travels in the metadata, so converting
it back exercises the same transformers paths a real GGUF does.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def llama_cpp_permute(weight: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute`: HF rotate-half rows -> interleaved rotary rows."""
    return (
        weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def write_gguf_from_hf(hf_dir: Path, gguf_path: Path, q8_tensor: str = "blk.0.ffn_up.weight") -> dict:
    """Write ``hf_dir`` (a tiny Llama from `tiny.write_target`) to ``gguf_path``; return the HF tensors."""
    import gguf
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    config = json.loads((hf_dir / "config.json").read_text())
    tensors = load_file(str(hf_dir / "model.safetensors"))
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]

    writer = gguf.GGUFWriter(str(gguf_path), "llama")
    writer.add_name("tiny-llama-test")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_vocab_size(config["vocab_size"])

    backend = json.loads(Tokenizer.from_file(str(hf_dir / "tokenizer.json")).to_str())
    vocab = backend["model"]["vocab"]
    specials = {t["content"]: t["id"] for t in backend["added_tokens"]}
    tokens = [None] * config["vocab_size"]
    for token, idx in {**vocab, **specials}.items():
        tokens[idx] = token
    merges = [m if isinstance(m, str) else " ".join(m) for m in backend["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in specials else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(config["bos_token_id"])
    writer.add_eos_token_id(config["eos_token_id"])
    writer.add_pad_token_id(config["pad_token_id"])
    writer.add_chat_template((hf_dir / "chat_template.jinja").read_text())

    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    per_layer = {
        "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
        "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }  # fmt: skip
    for i in range(config["num_hidden_layers"]):
        for hf, gg in per_layer.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    for hf_name, gguf_name in names.items():
        data = tensors[hf_name].astype(np.float32)
        if gguf_name.endswith("attn_q.weight"):
            data = llama_cpp_permute(data, heads)
        elif gguf_name.endswith("attn_k.weight"):
            data = llama_cpp_permute(data, kv_heads)
        if gguf_name == q8_tensor:
            packed = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(gguf_name, packed, raw_shape=packed.shape,
                              raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(gguf_name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tensors
