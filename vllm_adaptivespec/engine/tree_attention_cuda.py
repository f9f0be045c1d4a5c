"""CUDA path of draft-tree attention: vLLM's FlashAttention backend for the stock rows plus
ancestor-masked branch rows of draft trees.

Same plan objects and mask code as the CPU path (``tree_attention``); only the cache access differs
(``paged_kv.FlashPagedKV``) and how the stock rows' metadata is made. Kept in its own module so CPU
installs never import flash-attn.
"""

from __future__ import annotations

import dataclasses

from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend, FlashAttentionImpl

from vllm_adaptivespec.engine.tree_attention import TreeRowsAttention


class TreeFlashAttentionImpl(TreeRowsAttention, FlashAttentionImpl):
    """vLLM's FlashAttention for the stock rows, ancestor-masked attention for draft-tree branch rows."""

    def stock_rows_metadata(self, layer, metadata, query_start_loc, seq_lens, num_tokens, dtype):
        """FlashAttention: no ahead-of-time scheduler metadata (it was planned for the longer queries;
        FlashAttention then plans its own split); ``max_query_len`` / ``max_seq_len`` stay as upper bounds."""
        if metadata.mm_prefix_query_range_tensor is not None or getattr(self, "dcp_world_size", 1) > 1:
            raise NotImplementedError("AdaptiveSpec tree attention supports neither prefix-LM ranges nor DCP")
        return dataclasses.replace(
            metadata, num_actual_tokens=num_tokens, query_start_loc=query_start_loc, seq_lens=seq_lens,
            scheduler_metadata=None, max_num_splits=0,
        )  # fmt: skip


class TreeFlashAttentionBackend(FlashAttentionBackend):
    @staticmethod
    def get_impl_cls() -> type[TreeFlashAttentionImpl]:
        return TreeFlashAttentionImpl
