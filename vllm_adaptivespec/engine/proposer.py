"""Drafter subclasses: draft each request's chain or tree, shaped by its policy.

vLLM's EAGLE / draft-model proposers draft one fixed-length chain for the whole batch. Ours run the
same first pass (the drafter catches up on the tokens the target just accepted, rejected rows
dropped), read each request's top-1 confidence from it and ask the request's policy for this step's
shape (depth, width, nodes).

* Chain mode: vLLM's own loop drafts the remaining levels (draft KV in the paged cache, the stock
  attention kernel, the buffers it was sized for), for as many passes as the deepest chain of the
  batch; every request's chain is cut to its own depth. Where the step plan sizes the chains
  (``replan_each_pass``), the step is planned again after every pass with that pass's confidences
  (``AdaptiveState.continue_chains``): the loop stops where one more pass no longer pays, or goes on
  past the first plan, up to ``max_depth``. Apart from the policy calls this is the stock proposer's
  work, pass for pass.
* Tree mode: the frontier is expanded one level per drafter pass: every frontier node gets its
  top-``width`` children, all frontier nodes of the batch in one forward under an ancestor mask
  (``tree_attention``). The engine-free ``TreeBuilder`` picks the frontier and the kept nodes.

Free drafts (chain mode, ``engine.free_draft``): before the plan, every request is offered a copy from
its own text; rows the plan drafts from it get depth 0 in the drafter's loop and their copy in its place,
and a step whose drafts are all copies skips the drafter like a step off.

Tree passes write nothing to the drafter's paged cache (their keys/values live beside it for the
duration of the call): the next first pass recomputes the accepted tokens' drafter KV anyway.
Drafts are the top-k candidates (deterministic), so the sampler treats them as one-hot proposals,
which keeps recursive rejection sampling exact for trees; no draft probabilities are returned.
"""

from __future__ import annotations

import dataclasses
import time

import torch
from vllm.config import CUDAGraphMode
from vllm.forward_context import set_forward_context
from vllm.v1.spec_decode.draft_model import DraftModelProposer
from vllm.v1.spec_decode.eagle import EagleProposer

from vllm_adaptivespec.engine.state import AdaptiveState
from vllm_adaptivespec.engine.tree_attention import DraftTreeAttention
from vllm_adaptivespec.policy import tree_capacity
from vllm_adaptivespec.tree import ROOT, DraftTrees, TreeBuilder


class AdaptiveProposerMixin:
    """Mixed into a vLLM proposer; `adaptive_state` is attached by the runner hook."""

    adaptive_state: AdaptiveState
    _chain_depths: list[int] | None = None  # set by the first draft sample of a chain propose
    _levels: list = []  # the tokens of each drafter pass of the chain propose under way ([batch_size] each)
    _choosing_depths = False  # True between the start of a chain propose and its first draft sample

    def propose(
        self,
        num_speculative_tokens,
        target_token_ids,  # [num_tokens]
        target_positions,  # [num_tokens]
        target_hidden_states,  # [num_tokens, hidden]
        next_token_ids,  # [batch_size]
        token_indices_to_sample,  # [batch_size] or None
        common_attn_metadata,
        sampling_metadata,
        mm_embed_inputs=None,
        num_rejected_tokens_gpu=None,  # [batch_size] or None
        slot_mappings=None,
    ):
        if num_speculative_tokens == 0:  # vLLM still runs the first pass to keep the drafter's KV in sync
            return super().propose(
                num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                mm_embed_inputs, num_rejected_tokens_gpu, slot_mappings,
            )  # fmt: skip
        started = time.perf_counter()
        state = self.adaptive_state
        if num_rejected_tokens_gpu is not None:
            common_attn_metadata, target_token_ids, target_positions, target_hidden_states = accepted_rows_only(
                common_attn_metadata, num_rejected_tokens_gpu, target_token_ids, target_positions, target_hidden_states
            )
        # A draft model can skip a step (no pass at all) and catch up at its next pass; an EAGLE head
        # would need the target's hidden states of the skipped tokens, so it always runs its first pass.
        can_skip = self.method == "draft_model"
        first_positions = _first_positions(common_attn_metadata).tolist()
        state.drafter_seen(first_positions)
        if state.free_drafts is not None:  # drafts copied from each request's own text, before the plan
            start = common_attn_metadata.query_start_loc_cpu.tolist()
            query = target_token_ids.tolist()
            state.offer_free_drafts(
                first_positions, [query[a:b] for a, b in zip(start, start[1:])], next_token_ids.tolist(),
                min(state.config.max_depth, num_speculative_tokens),
            )  # fmt: skip
        # What the first pass would run over now: the last step's accepted tokens and the drafter's backlog.
        lags = state.drafter_lag(first_positions) if can_skip else []
        if can_skip and state.drafter_off(target_token_ids.shape[0] + sum(lags), lags):
            self._last_draft_probs = None
            drafts = state.with_free_drafts([[] for _ in range(common_attn_metadata.batch_size())])
            state.charge(started)
            return drafts
        if can_skip:
            common_attn_metadata, target_token_ids, target_positions, target_hidden_states = self._catch_up(
                common_attn_metadata, target_token_ids, target_positions, target_hidden_states, state.probe_only
            )
        # Where each request's rows end, read before vLLM's loop advances seq_lens in place.
        seq_lens = common_attn_metadata.seq_lens[: common_attn_metadata.batch_size()].tolist()
        first_rows, self._propose_started, self._first_pass_seconds = target_token_ids.shape[0], started, None
        if state.config.mode == "chain":
            drafts, passes = self._propose_chains(
                num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                next_token_ids, common_attn_metadata, sampling_metadata, mm_embed_inputs,
            )  # fmt: skip
        else:
            drafts, passes = self._propose_trees(
                num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                next_token_ids, common_attn_metadata, mm_embed_inputs,
            )  # fmt: skip
        state.drafter_caught_up(seq_lens)
        seconds = time.perf_counter() - started
        state.observe_draft(seconds, passes, drafts, first_rows, self._first_pass_seconds or seconds / passes)
        return drafts

    def _first_pass_finished(self) -> None:
        """Called once the first pass's confidence has reached the host (the device has finished it): times
        the pass (catch-up rows included) for ``observe_draft``."""
        self._first_pass_seconds = time.perf_counter() - self._propose_started

    def _catch_up(self, attn, token_ids, positions, hidden_states, probe_only: str | None = None):
        """Put before each request's first-pass rows the tokens whose drafter KV is missing
        (``AdaptiveState.drafter_lag``: steps that ran without a drafter pass, a skipped prefill included): their
        ids come from the request's token history, their slots from its block table. Requests are caught up fewest
        missing tokens first while the drafter's buffers hold them. The first request that does not fit whole gets
        the room that is left as a chunk of its backlog in place of its own rows (a chunked prefill of the drafter:
        its next chunk at a later pass); it and the requests after it are left ``behind``, with no draft this step.
        A probe (``probe_only``, the request ``AdaptiveState.drafter_off`` chose) catches up that request alone:
        every other request that owes tokens stays ``behind`` too, its backlog kept whole for a later pass. Returns
        the inputs unchanged when nothing is missing."""
        start = attn.query_start_loc_cpu.long()
        batch = start.shape[0] - 1
        length = start[1:] - start[:-1]  # [B] rows per request
        seq_lens = attn.seq_lens[:batch].cpu().long()
        first = seq_lens - length  # [B] position of each request's first row
        lag = torch.tensor(self.adaptive_state.drafter_lag(first.tolist()), dtype=torch.long)  # [B]
        total = int(start[-1])
        room = self.input_ids.shape[0] - total - batch  # rows the buffers hold beyond this pass's own
        # Worked example: lag [0, 700, 30, 90], length [2, 1, 3, 1], room 300 -> fewest first: rows 0, 2
        # and 3 fit whole (30 + 90 <= 300); row 1 gets the 300 - 120 + 1 = 181 rows left (its own row
        # freed one) as positions first[1] - 700 ... first[1] - 520 in place of its own row, and stays behind.
        # A probe catches up one request only (``probe_only``): the others' backlogs wait.
        req_ids = self.adaptive_state.request_ids()
        waits = torch.tensor([probe_only not in (None, rid) for rid in req_ids], dtype=torch.bool) & (lag > 0)  # [B]
        owed = torch.where(waits, 0, lag)  # [B] backlog to catch up this pass if room allows
        order = torch.argsort(owed, stable=True)
        before = torch.cumsum(owed[order], 0) - owed[order]  # [B] backlog of the requests caught up earlier
        fits = torch.zeros(batch, dtype=torch.bool)
        fits[order] = before + owed[order] <= room  # a prefix of that order
        whole = fits & ~waits
        chunk = torch.zeros(batch, dtype=torch.long)  # [B] backlog rows replacing a behind request's own
        if not fits.all():
            row = int(order[int(fits.sum())])  # the first request in that order that does not fit
            chunk[row] = max(0, min(int(lag[row]), room - int(lag[whole].sum()) + int(length[row])))
        behind = ~whole
        if behind.any():
            self.adaptive_state.behind = {req_ids[r]: None for r in behind.nonzero()[:, 0].tolist()}
            for row in (chunk > 0).nonzero()[:, 0].tolist():  # its drafter KV is whole up to the chunk's end
                self.adaptive_state.behind[req_ids[row]] = int(first[row] - lag[row] + chunk[row])
        caught_rows = torch.where(whole, lag, chunk)  # [B] backlog rows each request gets this pass
        own = torch.where(chunk > 0, 0, length)  # [B] own rows kept (a chunk replaces them)
        if int(caught_rows.sum()) == 0:
            return attn, token_ids, positions, hidden_states
        device = token_ids.device
        new_length = caught_rows + own
        new_start = torch.zeros_like(attn.query_start_loc_cpu)
        new_start[1:] = torch.cumsum(new_length, 0)
        num_rows = int(new_start[-1])
        # Kept row r of request i goes to new_start[i] + caught_rows[i] + (r - start[i]); backlog row j of
        # request i (position first[i] - lag[i] + j) goes to new_start[i] + j.
        kept_from = torch.repeat_interleave(start[:-1], own) + _ranks(own)  # [kept] old row index
        kept = torch.repeat_interleave(new_start[:-1].long() + caught_rows, own) + _ranks(own)
        request = torch.repeat_interleave(torch.arange(batch), caught_rows)  # [extra]
        offset = _ranks(caught_rows)
        position = first[request] - lag[request] + offset
        caught = new_start[:-1].long()[request] + offset
        history = self.adaptive_state.token_history(request.tolist(), position.tolist())
        kept_from_d, kept_d, caught_d, request_d, position_d = (
            t.to(device) for t in (kept_from, kept, caught, request, position)
        )

        new_ids = token_ids.new_empty(num_rows)
        new_ids[kept_d] = token_ids[kept_from_d]
        new_ids[caught_d] = history.to(device=device, dtype=token_ids.dtype)
        new_positions = positions.new_empty(num_rows)
        new_positions[kept_d] = positions[kept_from_d]
        new_positions[caught_d] = position_d.to(positions.dtype)
        new_hidden = hidden_states.new_zeros(num_rows, hidden_states.shape[-1])  # unused by draft models
        new_hidden[kept_d] = hidden_states[kept_from_d]
        block_size = self.block_size
        blocks = attn.block_table_tensor[request_d, position_d // block_size].long()
        new_slots = attn.slot_mapping.new_empty(num_rows)
        new_slots[kept_d] = attn.slot_mapping[kept_from_d]
        new_slots[caught_d] = (blocks * block_size + position_d % block_size).to(new_slots.dtype)
        # A chunked request's sequence ends where its chunk does.
        shortened = torch.where(chunk > 0, first - lag + chunk, seq_lens) - seq_lens  # [B] <= 0
        caught_up = dataclasses.replace(
            attn,
            query_start_loc=new_start.to(device),
            query_start_loc_cpu=new_start,
            seq_lens=attn.seq_lens + shortened.to(device=device, dtype=attn.seq_lens.dtype),
            seq_lens_cpu_upper_bound=None
            if attn.seq_lens_cpu_upper_bound is None
            else attn.seq_lens_cpu_upper_bound + shortened.to(attn.seq_lens_cpu_upper_bound.dtype),
            num_actual_tokens=num_rows,
            max_query_len=int(new_length.max()),
            slot_mapping=new_slots,
            positions=None if attn.positions is None else new_positions,
            _num_computed_tokens_cache=None,
            _token_to_req_indices_cache=None,
        )
        return caught_up, new_ids, new_positions, new_hidden

    def _propose_chains(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                        next_token_ids, common_attn_metadata, sampling_metadata, mm_embed_inputs):  # fmt: skip
        """Chains: vLLM's own drafting loop (draft KV in the paged cache, the stock attention kernel),
        run for as many passes as the deepest chain the policies chose (``_sample_draft_tokens``
        picks the depths at the first pass); each request's chain is then cut to its own depth.
        Returns (drafts per request, drafter passes run)."""
        self._choosing_depths, self._chain_depths, self._levels = True, None, []
        try:
            draft = super().propose(
                num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                next_token_ids, None, common_attn_metadata, sampling_metadata, mm_embed_inputs, None, None,
            )  # fmt: skip  # [batch_size, passes run]
        except _DraftingStopped:  # the re-plan after a pass stopped vLLM's loop early
            draft = torch.stack(self._levels, dim=1)  # [batch_size, passes run]
        finally:
            self._choosing_depths = False
            self.adaptive_state.chain_step = None
        started = time.perf_counter()
        depths = self._chain_depths
        drafts = self.adaptive_state.with_free_drafts([row[:depth] for row, depth in zip(draft.tolist(), depths)])
        self.adaptive_state.charge(started)
        return drafts, int(draft.shape[1])

    def _sample_draft_tokens(self, hidden_states: torch.Tensor, sampling_metadata):
        """Tokens of one drafter pass of vLLM's loop ([batch_size] from [batch_size, hidden]): the argmax
        (drafts are one-hot proposals, see the module docstring). At the first pass of a chain
        propose each request's policy also reads its top-1 confidence and picks its depth, and the
        loop is told to run only as many more passes as the deepest chain needs. Where the step is
        re-planned pass by pass (``AdaptiveState.chain_step``), the loop may run up to ``max_depth``
        passes, each later pass's confidences go to ``AdaptiveState.continue_chains``, and when that
        stops drafting the loop is left by raising ``_DraftingStopped`` (vLLM's loop has no early exit;
        nothing follows the pass in it but stacking the tokens, which ``_propose_chains`` does instead)."""
        if not self._choosing_depths and self.adaptive_state.chain_step is None:
            return self._greedy_sample(hidden_states), None
        logits = self.model.compute_logits(hidden_states)  # [batch_size, vocab]
        started = time.perf_counter()
        tokens, _, confidence = top_candidates(logits, 1)  # [batch_size, 1], _, [batch_size]
        self._levels.append(tokens[:, 0])
        if not self._choosing_depths:  # a later pass of a re-planned step
            lengths = self.adaptive_state.continue_chains(confidence.tolist())
            self.adaptive_state.charge(started)
            if lengths is not None:
                self._chain_depths = lengths
                raise _DraftingStopped
            return tokens[:, 0], None
        self._choosing_depths = False
        confidence = confidence.cpu()
        self._first_pass_finished()
        shapes = self.adaptive_state.choose_shapes(confidence, self.num_speculative_tokens)
        self._chain_depths = [shape.depth for shape in shapes]
        # vLLM's loop reads it after this call (at least 1: its k = 1 exit reshapes by it; depth-0 rows are cut)
        chain_step = self.adaptive_state.chain_step
        deepest = chain_step.max_depth if chain_step is not None else max(self._chain_depths, default=1)
        self.num_speculative_tokens = max(1, deepest)
        self.adaptive_state.charge(started)
        return tokens[:, 0], None

    def _greedy_sample(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """vLLM's greedy draft token ([batch_size] from [batch_size, hidden]), the row maximum's index taken with
        ``max(dim)`` instead of ``argmax``: the same token (the first maximum), and on 2 CPU cores over bf16 rows of
        151,936 logits 0.18 ms a row where ``argmax`` takes 0.62 (8 rows: 0.64 against 3.05 ms), once per drafter
        pass. Drafts only: verification decides what is emitted. vLLM's other paths (a reduced or mapped
        vocabulary) as they are."""
        if getattr(self, "use_local_argmax_reduction", False) or getattr(self, "use_heterogeneous_vocab", False):
            return super()._greedy_sample(hidden_states)
        return self.model.compute_logits(hidden_states).max(dim=-1).indices

    def _propose_trees(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                       next_token_ids, common_attn_metadata, mm_embed_inputs):  # fmt: skip
        """Trees: the first pass as vLLM runs it, then one drafter pass per further level under the
        ancestor mask (``_grow``). Returns (drafts per request, drafter passes run)."""
        self.num_speculative_tokens = num_speculative_tokens
        self._last_draft_probs = None
        if self.method == "eagle3":
            target_hidden_states = self.model.combine_hidden_states(target_hidden_states)
        last, hidden, sample_rows, attn = self._first_pass(
            target_token_ids, target_positions, target_hidden_states, next_token_ids, common_attn_metadata,
            mm_embed_inputs,
        )  # fmt: skip
        root_position = self.positions[sample_rows]
        trees = self._grow(last[sample_rows], hidden[sample_rows], root_position, attn, num_speculative_tokens)
        started = time.perf_counter()
        drafts = self.adaptive_state.record_drafts(trees, num_speculative_tokens)  # reads the tokens: the device has finished
        self.adaptive_state.charge(started)
        return drafts, max(1, trees.max_depth)  # the first pass drafts level 1, one more pass per further level

    def _first_pass(self, target_token_ids, target_positions, target_hidden_states, next_token_ids,
                    common_attn_metadata, mm_embed_inputs):  # fmt: skip
        """vLLM's own first drafter pass (SpecDecodeBaseProposer.propose up to its first sample)."""
        num_tokens, sample_rows, attn = self.set_inputs_first_pass(
            target_token_ids=target_token_ids,
            next_token_ids=next_token_ids,
            target_positions=target_positions,
            target_hidden_states=target_hidden_states,
            token_indices_to_sample=None,  # the last row of each request (rejected rows are gone)
            cad=common_attn_metadata,
            num_rejected_tokens_gpu=None,
        )
        _, per_layer = self.build_per_group_and_layer_attn_metadata(attn)
        mode, num_input_tokens, across_dp = self._determine_batch_execution_and_padding(num_tokens)
        model_kwargs, slot_mapping_size = self.build_model_inputs_first_pass(
            num_tokens, num_input_tokens, mm_embed_inputs
        )
        with set_forward_context(
            per_layer,
            self.vllm_config,
            num_tokens=num_input_tokens,
            num_tokens_across_dp=across_dp,
            cudagraph_runtime_mode=mode,
            slot_mapping=self._get_slot_mapping(slot_mapping_size, attn.slot_mapping),
        ):
            last, hidden = self._outputs(self.model(**model_kwargs))
        return last, hidden, sample_rows, attn

    def _outputs(self, returned):
        """(hidden states for logits, hidden states fed to the next pass)."""
        return returned if self.model_returns_tuple() else (returned, returned)

    def _candidates(self, hidden_states: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-``width`` draft tokens and their draft log-probs per row ([n, width] each)."""
        tokens, logprobs, _ = top_candidates(self.model.compute_logits(hidden_states), width)
        return tokens, logprobs

    def _grow(self, root_last, root_hidden, root_position, attn, node_ceiling: int) -> DraftTrees:
        """Build every request's tree: level 1 from the first pass, then one drafter pass per level."""
        batch, device = root_last.shape[0], root_last.device
        logits = self.model.compute_logits(root_last)
        started = time.perf_counter()
        confidence, log_norm = confidence_of(logits)
        confidence = confidence.cpu()
        self._first_pass_finished()
        shapes = self.adaptive_state.choose_shapes(confidence, node_ceiling)
        builder = TreeBuilder(shapes, device=device)
        self.adaptive_state.charge(started)
        if builder.done:  # no request drafts from the drafter this step (copies only, or none)
            return builder.finish()
        width = builder.max_width
        tokens, logprobs, _ = top_candidates(logits, width, log_norm)  # one logsumexp for both
        builder.add_level(tokens[:, None, :], logprobs[:, None, :])
        if builder.done:
            return builder.finish()

        tree_attention = DraftTreeAttention(  # the requests whose trees go deeper than level 1 only
            attn.block_table_tensor[:batch], root_position + 1, [shape.depth for shape in shapes],
            max_tree_tokens=(builder.max_depth - 1) * width,
        )
        node_slot = torch.full((batch, tree_capacity(builder.max_depth, width)), -1, dtype=torch.long, device=device)
        slot_hidden = None
        if self.pass_hidden_states_to_model:
            slot_hidden = root_hidden.new_zeros(batch, tree_attention.capacity, root_hidden.shape[-1])
        layer_metadata = {name: tree_attention for name in self._draft_attn_layer_names}
        while not builder.done:
            ids, valid = builder.frontier()
            tokens = builder.frontier_tokens()
            _, parent_of, _ = builder.nodes_so_far()
            request, column = valid.nonzero(as_tuple=True)  # grouped by request, in order
            node = ids[request, column]
            parent = parent_of[request, node]
            parent_slot = torch.where(parent != ROOT, node_slot[request, parent.clamp(min=0)], -1)
            slot = tree_attention.begin_pass(request, parent_slot)
            node_slot[request, node] = slot
            model_kwargs = {
                "input_ids": tokens[request, column].to(self.input_ids.dtype),
                "positions": root_position[request] + builder.level,
                "inputs_embeds": None,
            }
            if slot_hidden is not None:
                model_kwargs["hidden_states"] = torch.where(
                    (parent_slot >= 0)[:, None], slot_hidden[request, parent_slot.clamp(min=0)], root_hidden[request]
                )
            rows = request.shape[0]
            _, _, across_dp = self._determine_batch_execution_and_padding(rows, use_cudagraphs=False)
            with set_forward_context(
                layer_metadata,
                self.vllm_config,
                num_tokens=rows,
                num_tokens_across_dp=across_dp,
                cudagraph_runtime_mode=CUDAGraphMode.NONE,
                slot_mapping={},
            ):
                last, hidden = self._outputs(self.model(**model_kwargs))
            if slot_hidden is not None:
                slot_hidden[request, slot] = hidden[:rows]
            cand_tokens, cand_logprobs = self._candidates(last[:rows], width)
            grid_tokens = torch.zeros(*ids.shape, width, dtype=torch.long, device=device)
            grid_logprobs = torch.full((*ids.shape, width), float("-inf"), device=device)
            grid_tokens[request, column] = cand_tokens
            grid_logprobs[request, column] = cand_logprobs
            builder.add_level(grid_tokens, grid_logprobs)
        return builder.finish()


class _DraftingStopped(Exception):
    """Raised from the last drafter pass a re-planned chain step runs, out of vLLM's drafting loop."""


def top_candidates(
    logits: torch.Tensor, width: int, log_norm: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``width`` most likely tokens of each row of ``logits`` [n, vocab]: (tokens [n, width],
    their log-probs [n, width], top-1 probability [n]) from one top-k (width 1: ``max(dim)`` on the logits as
    they come, see ``_greedy_sample``) and one logsumexp in float32, with no vocabulary-sized softmax
    materialised; ``log_norm`` [n, 1], if given, is that logsumexp."""
    if width == 1:
        values, indices = logits.max(dim=-1, keepdim=True)  # [n, 1] each
    else:
        values, indices = logits.float().topk(width, dim=-1)
    if log_norm is None:
        log_norm = logits.float().logsumexp(dim=-1, keepdim=True)
    logprobs = values.float() - log_norm
    return indices, logprobs, logprobs[:, 0].exp()


def _first_positions(attn) -> torch.Tensor:
    """[B] position of each request's first query row (its sequence length less its query rows)."""
    start = attn.query_start_loc_cpu.long()
    batch = start.shape[0] - 1
    return attn.seq_lens[:batch].cpu().long() - (start[1:] - start[:-1])


def _ranks(counts: torch.Tensor) -> torch.Tensor:
    """[sum(counts)] 0, 1, ..., counts[i] - 1 for each i in turn (counts [n], long)."""
    return torch.arange(int(counts.sum())) - torch.repeat_interleave(torch.cumsum(counts, 0) - counts, counts)


def confidence_of(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(top-1 probability [n], logsumexp [n, 1]) of each row of ``logits`` [n, vocab] (float32)."""
    logits = logits.float()
    log_norm = logits.logsumexp(dim=-1, keepdim=True)
    return (logits.amax(dim=-1, keepdim=True) - log_norm).exp()[:, 0], log_norm


def accepted_rows_only(attn, num_rejected, token_ids, positions, hidden_states):
    """Drop the rejected rows of the step just verified from the drafter's first pass.

    vLLM's padded drafter batch re-runs every verified row and masks the rejected ones; with trees
    most rows are rejected nodes. The accepted rows are already rows 0..a of each request (the tree
    step put the accepted path there), so keeping them is a per-request prefix, as in vLLM's own
    unpadded ``prepare_inputs``."""
    device = attn.query_start_loc.device
    start = attn.query_start_loc_cpu.long()
    keep = ((start[1:] - start[:-1]) - num_rejected.cpu().long()).clamp(min=1)
    new_start = torch.zeros_like(attn.query_start_loc_cpu)
    new_start[1:] = keep.cumsum(0)
    total = int(new_start[-1])
    rows = torch.repeat_interleave(start[:-1] - new_start[:-1].long(), keep) + torch.arange(total)
    rows = rows.to(device)
    dropped = (start[1:] - start[:-1]) - keep
    compact = dataclasses.replace(
        attn,
        query_start_loc=new_start.to(device),
        query_start_loc_cpu=new_start,
        seq_lens=attn.seq_lens - dropped.to(device=device, dtype=attn.seq_lens.dtype),
        seq_lens_cpu_upper_bound=None
        if attn.seq_lens_cpu_upper_bound is None
        else attn.seq_lens_cpu_upper_bound - dropped.to(attn.seq_lens_cpu_upper_bound.dtype),
        num_actual_tokens=total,
        max_query_len=int(keep.max()),
        slot_mapping=attn.slot_mapping[rows],
        positions=None if attn.positions is None else attn.positions[rows],
        _num_computed_tokens_cache=None,
        _token_to_req_indices_cache=None,
    )
    return compact, token_ids[rows], positions[..., rows], hidden_states[rows]


class AdaptiveDraftModelProposer(AdaptiveProposerMixin, DraftModelProposer):
    pass


class AdaptiveEagleProposer(AdaptiveProposerMixin, EagleProposer):
    pass
