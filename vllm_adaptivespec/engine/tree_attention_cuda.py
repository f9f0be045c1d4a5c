"""CUDA path of draft-tree attention: vLLM's FlashAttention backend plus ancestor-masked tree rows.

Same plan objects and mask code as the CPU path (``tree_attention``); only the cache access differs
(``paged_kv.FlashPagedKV``). Kept in its own module so CPU installs never import flash-attn.
"""

from __future__ import annotations

from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend, FlashAttentionImpl

from vllm_adaptivespec.engine.tree_attention import TreeRowsAttention


class TreeFlashAttentionImpl(TreeRowsAttention, FlashAttentionImpl):
    """vLLM's FlashAttention, plus ancestor-masked rows for draft trees."""


class TreeFlashAttentionBackend(FlashAttentionBackend):
    @staticmethod
    def get_impl_cls() -> type[TreeFlashAttentionImpl]:
        return TreeFlashAttentionImpl
