"""CUDA path of draft-tree attention: vLLM's FlashAttention backend plus ancestor-masked tree rows.

Same plan objects and mask code as the CPU path (``tree_attention``); only the cache access differs
(``paged_kv.FlashPagedKV``). Kept in its own module so CPU installs never import flash-attn.
"""

from __future__ import annotations

from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend, FlashAttentionImpl

from vllm_adaptivespec.engine.tree_attention import DraftTreeAttention, verification_plan


class TreeFlashAttentionImpl(FlashAttentionImpl):
    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None):  # fmt: skip
        if isinstance(attn_metadata, DraftTreeAttention):
            return attn_metadata.attend(self, layer, query, key, value, kv_cache, output)
        output = super().forward(
            layer, query, key, value, kv_cache, attn_metadata, output, output_scale, output_block_scale
        )
        plan = verification_plan()
        if plan is not None and attn_metadata is not None:
            plan.attend(self, layer, query, key, value, kv_cache, attn_metadata, output)
        return output


class TreeFlashAttentionBackend(FlashAttentionBackend):
    @staticmethod
    def get_impl_cls() -> type[TreeFlashAttentionImpl]:
        return TreeFlashAttentionImpl
