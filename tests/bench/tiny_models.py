"""Builds a pair of tiny random Llama checkpoints (with an offline word-level tokenizer and a
chat template) so the harness can be driven through vLLM in seconds on CPU."""

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
_WORDS = (
    "def return if else for in range while print import from the a an of to and is are was "
    "write explain story number add list sum python function code value x y n i 0 1 2 3 4 5 "
    "6 7 8 9 + - * / = ( ) : , . ? ! ``` \" ' [ ] { } < > # _ true false none"
).split()
SPECIAL = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]


def _save_tokenizer(directory: Path) -> int:
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + sorted(set(_WORDS)))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    return len(vocab)


def make_tiny_llama(directory: Path, seed: int, layers: int = 2) -> Path:
    """A random bf16 Llama with hidden size 128 (head_dim 64: vLLM CPU attention has no kernel for 16) and the shared toy tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    directory.mkdir(parents=True, exist_ok=True)
    vocab_size = _save_tokenizer(directory)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=256,
        num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
        max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(directory)
    return directory


if __name__ == "__main__":
    import sys

    root = Path(sys.argv[1])
    make_tiny_llama(root / "target", seed=0, layers=2)
    make_tiny_llama(root / "drafter", seed=0, layers=1)
    print(root)
