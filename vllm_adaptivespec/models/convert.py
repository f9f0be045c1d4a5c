"""Checkpoint conversions: GGUF -> dense safetensors, and cutting a layer prefix off a checkpoint.

Both write a plain Hugging Face directory (config.json, model.safetensors, tokenizer,
generation_config.json) that vLLM loads like any other.
"""

from __future__ import annotations

import gc
import json
import logging
import re
import shutil
from pathlib import Path

from .errors import ConversionError

log = logging.getLogger(__name__)

# Files copied unchanged when a checkpoint is derived from another one.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)

# Keys a GGUF load leaves in config.json that describe the GGUF, not the dense checkpoint.
_GGUF_ONLY_KEYS = ("quantization_config", "_name_or_path", "_model_name_or_path")


def gguf_to_safetensors(gguf_file: Path, out_dir: Path, dtype: str = "bfloat16") -> dict:
    """Dequantize ``gguf_file`` with transformers and save it, with its tokenizer, to ``out_dir``.

    Returns a short summary (architecture, layers, parameters) for the manifest.
    Peak memory is about one dense copy of the model in ``dtype`` plus the GGUF itself.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    torch_dtype = getattr(torch, dtype)
    folder, name = str(gguf_file.parent), gguf_file.name
    try:
        model = AutoModelForCausalLM.from_pretrained(
            folder,
            gguf_file=name,
            dtype=torch_dtype,
            quantization_config=GgufConfig(dequantize=True),
        )
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except Exception as err:  # transformers raises many kinds; all mean "cannot read this GGUF"
        raise ConversionError(f"transformers could not load {gguf_file}: {err}") from err
    architecture = type(model).__name__
    summary = {
        "architecture": architecture,
        "num_hidden_layers": model.config.num_hidden_layers,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": dtype,
    }
    log.info("dequantized %s: %s, %d parameters; writing safetensors", gguf_file.name,
             architecture, summary["parameters"])
    model.save_pretrained(out_dir, max_shard_size="4GB")
    del model
    gc.collect()
    tokenizer.save_pretrained(out_dir)
    _clean_config(out_dir / "config.json", architecture, dtype)
    return summary


def _clean_config(path: Path, architecture: str, dtype: str) -> None:
    config = json.loads(path.read_text())
    for key in _GGUF_ONLY_KEYS:
        config.pop(key, None)
    config["architectures"] = [architecture]
    config["dtype"] = dtype
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def cut_layer_prefix(src_dir: Path, out_dir: Path, layers: int) -> dict:
    """Write the checkpoint made of the first ``layers`` decoder layers of ``src_dir``.

    Embeddings, final norm and LM head are kept, so the result is a complete,
    smaller model of the same architecture and vocabulary.
    """
    from safetensors import safe_open
    from safetensors.torch import save_file

    config = json.loads((src_dir / "config.json").read_text())
    total = config["num_hidden_layers"]
    if not 1 <= layers < total:
        raise ConversionError(f"a layer prefix needs 1 <= layers < {total}, got {layers}")
    tensors = {}
    for shard in sorted(src_dir.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            for key in f.keys():
                match = _LAYER.search(key)
                if match is None or int(match.group(1)) < layers:
                    tensors[key] = f.get_tensor(key)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config["num_hidden_layers"] = layers
    if isinstance(config.get("layer_types"), list):
        config["layer_types"] = config["layer_types"][:layers]
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for name in TOKENIZER_FILES:
        if (src_dir / name).exists():
            shutil.copy2(src_dir / name, out_dir / name)
    return {"architecture": config["architectures"][0], "num_hidden_layers": layers,
            "of_layers": total}
