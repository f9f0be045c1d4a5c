"""Target side of one engine step with draft trees: positions and attention before the forward,
KV compaction and row order after verification.

vLLM schedules a request's flattened tree as if it were a chain: query rows [root, node 0, ...],
KV slots by row. Before the target forward (``begin``) the rows of real trees get positions
``context + depth`` and an ancestor-mask attention plan (``plan``, which the runner puts on the
forward's attention metadata: the stock kernel for each tree's chain rows, the masked path for its
other rows). A step whose drafts are all chains gets no ``TreeStep`` at all (``TreeStep.of``): it is
verified as chain mode verifies it. After the sampler has picked each request's accepted path c_1..c_a
(``finish``), everything downstream expects a chain again:

* KV: node c_d's keys/values move from its row's slot to the slot of position context + d (copies
  in increasing d are safe: c_d >= d - 1, so a destination is never a later source). The
  scheduler's rollback (num_computed -= rejected) then keeps exactly those, and later steps
  overwrite the rest.
* Rows: the drafter reads the target's input ids, positions and hidden states of rows 0..a as the
  accepted tokens; the accepted path's rows are copied there and positions made sequential again.
"""

from __future__ import annotations

import torch

from vllm_adaptivespec.engine.tree_attention import (
    VerificationPlan,
    chain_rows,
    paged_kv,
    query_positions,
    query_tree_mask,
)
from vllm_adaptivespec.tree import DraftTrees


class TreeStep:
    """The drafts of one target step that holds at least one real tree, as trees over the batch rows
    (rows without drafts: empty; chains: width-1 trees). ``tree_rows``: the batch rows whose drafts
    are not a chain."""

    def __init__(
        self,
        runner,
        tokens: list[list[int]],  # [B][nodes]: each batch row's scheduled drafts
        parents: list[list[int]],  # [B][nodes]: their parents (-1: the root)
        tree_rows: list[int],  # the rows whose parents are not a chain (at least one)
        num_tokens: int,  # query rows of the step's target forward
    ):
        batch = runner.input_batch
        num_reqs = batch.num_reqs
        self.trees = DraftTrees.from_parents(tokens, parents)
        self.num_nodes = [len(t) for t in tokens]
        self.chain_len = [chain_rows(p) for p in parents]  # [B] root + leading chain nodes
        self.query_start = runner.query_start_loc.np[:num_reqs].astype("int64").tolist()
        self.context_len = torch.from_numpy(batch.num_computed_tokens_cpu[:num_reqs].astype("int64"))
        self.tree_rows = tree_rows
        self.num_tokens = num_tokens

    @classmethod
    def of(cls, runner, state, scheduler_output) -> TreeStep | None:
        """The step's trees, or None when every scheduled draft is a chain (no tree objects then: the
        causal kernel and the chain verifiers are exact)."""
        batch = runner.input_batch
        num_reqs = batch.num_reqs
        tokens: list[list[int]] = [[] for _ in range(num_reqs)]
        parents: list[list[int]] = [[] for _ in range(num_reqs)]
        for req_id, drafts in scheduler_output.scheduled_spec_decode_tokens.items():
            row = batch.req_id_to_index[req_id]
            tokens[row] = list(drafts)
            parents[row] = state.scheduled_parents(req_id, list(drafts))
        tree_rows = [row for row, p in enumerate(parents) if chain_rows(p) <= len(p)]
        if not tree_rows:
            return None
        return cls(runner, tokens, parents, tree_rows, int(scheduler_output.total_num_scheduled_tokens))

    def begin(self, runner) -> None:
        """Depth positions and the attention plan for the rows that hold real trees (``plan``: the
        runner hands it to the target forward's attention metadata)."""
        rows = torch.tensor(self.tree_rows)
        positions = query_positions(self.trees, self.context_len)
        for row in self.tree_rows:
            start, length = self.query_start[row], 1 + self.num_nodes[row]
            runner.positions[start : start + length] = positions[row, :length].to(runner.positions.device)
        self.plan = VerificationPlan(
            batch_rows=rows,
            query_start=[self.query_start[r] for r in self.tree_rows],
            query_len=[1 + self.num_nodes[r] for r in self.tree_rows],
            chain_len=[self.chain_len[r] for r in self.tree_rows],
            context_len=self.context_len[rows],
            mask=query_tree_mask(self.trees)[rows],
            num_tokens=self.num_tokens,
            device=runner.positions.device,
        )

    def finish(self, runner, paths: list[list[int]] | None, step_outputs) -> None:
        """After verification: chain order for the accepted paths (KV, ids, positions, hidden states)."""
        if not self.plan.used:
            raise RuntimeError(
                "AdaptiveSpec: the attention backend ignored the draft-tree mask; tree verification "
                "needs vLLM's CPU_ATTN or FLASH_ATTN backend"
            )
        device = runner.positions.device
        for row in self.tree_rows:  # sequential positions again, as vLLM and the drafter expect
            start, length = self.query_start[row], 1 + self.num_nodes[row]
            runner.positions[start : start + length] = self.context_len[row] + torch.arange(length, device=device)
        if paths is None:
            return
        sources, targets = [], []
        for row in self.tree_rows:
            start = self.query_start[row]
            for depth, node in enumerate(paths[row], start=1):
                if node < 0:
                    break
                if node != depth - 1:
                    sources.append(start + 1 + node)
                    targets.append(start + depth)
        if not sources:
            return
        source = torch.tensor(sources, dtype=torch.long, device=device)
        target = torch.tensor(targets, dtype=torch.long, device=device)
        move_kv(runner, step_outputs.slot_mappings, source, target)
        runner.input_ids.gpu[target] = runner.input_ids.gpu[source]
        for hidden in step_outputs.hidden:
            hidden[target] = hidden[source]


def move_kv(runner, slot_mappings, source_rows: torch.Tensor, target_rows: torch.Tensor) -> None:
    """Copy the target model's cached keys/values of query rows ``source_rows`` to the slots of
    ``target_rows`` (the slots this step's forward wrote those rows to)."""
    if not isinstance(slot_mappings, dict):
        raise NotImplementedError("AdaptiveSpec trees do not support micro-batched forwards")
    drafter_layers = set(getattr(getattr(runner, "drafter", None), "_draft_attn_layer_names", ()) or ())
    done: set[int] = set()
    for name, layer in runner.compilation_config.static_forward_context.items():
        slots = slot_mappings.get(name)
        kv_cache = getattr(layer, "kv_cache", None)
        if name in drafter_layers or slots is None or not isinstance(kv_cache, torch.Tensor):
            continue
        if getattr(layer, "kv_sharing_target_layer_name", None) is not None or kv_cache.data_ptr() in done:
            continue
        done.add(kv_cache.data_ptr())
        cache = paged_kv(layer.impl, layer, kv_cache)
        keys, values = cache.read_slots(slots[source_rows].long())
        cache.write_slots(layer, slots[target_rows].long(), keys, values)
