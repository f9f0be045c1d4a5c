"""Verification of padded draft trees against the target, with the margin rule.

Rows of the target distribution: ``[B, N+1, V]``, row 0 = after the context (for children of
the root), row i+1 = after node i; node i is judged by row ``parents[i] + 1``.

Margin rule: a node whose token is not the target's top-1 is still accepted ("promoted") when
``p(token) / p(top1) >= tau`` with ``tau < 1``. With tau >= 1 (or no allowance left) nothing is
promoted and verification is exact: greedy = strict argmax matching, sampled = exact
speculative rejection sampling. A path may use at most ``promotion_allowance[b]`` promotions.

Greedy: every node that matches or is promotable is accepted; the result is the longest
accepted root-to-node path whose promotions fit the allowance, ties broken by the cumulative
target log-probability of the path (normalising only the rows on tied paths, and only when a
promotion is possible: without one, equally long matching paths differ only by duplicate
sibling tokens and the lowest index wins), then by the lowest node index. The next token is
the target's argmax after that path.

Sampled, deterministic drafts (one-hot q): recursive rejection over siblings in index order;
after rejecting siblings t_1..t_{j-1} the residual is p with those tokens removed, so child j
passes with probability p(t_j) / (1 - sum_{i<j} p(t_i)) (a duplicate token never passes). The
first passing child is taken; if none passes, the rejected child with the largest p(token) that
satisfies the margin test is promoted (when the allowance permits); otherwise the walk stops
and the next token is drawn from the residual (p without the children's tokens; p itself at a
leaf). This is exactly distribution preserving when nothing is promoted. With ``draft_probs``
(chains only) a child passes with min(1, p/q) and the residual is norm(max(p - q, 0)).
Every node's pass/fail is decided up front from one uniform draw per node, so at most one
child per node is taken and the walk is the deepest node whose root path (read off the tree's
ancestor table) was taken throughout: a fixed number of batched tensor ops, no Python loop.

Vocabulary-wide work per call: greedy = one argmax over the rows that are some node's parent,
plus the row after the chosen path (for a chain that is every row: the pass vLLM's own greedy
verification makes); sampled = one max over the rows only when a promotion is possible, plus a
copy and one block-sum pass of one residual row per sequence for the next token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm_adaptivespec.tree import DraftTrees


@dataclass
class VerifyResult:
    """Outcome of one verification step for a batch."""

    accepted_nodes: torch.Tensor  # [B, D] node indices along the accepted path, -1 padded
    accepted_tokens: torch.Tensor  # [B, D] their tokens, -1 padded
    promoted: torch.Tensor  # [B, D] bool: this accepted position was promoted by the margin rule
    num_accepted: torch.Tensor  # [B]
    next_token: torch.Tensor  # [B] bonus (after a full path) or correction token
    num_promoted: torch.Tensor  # [B]

    def output_tokens(self) -> torch.Tensor:
        """[B, D+1]: accepted tokens, then the next token, -1 padded (vLLM's rejection-sampler rows)."""
        batch, depth = self.accepted_tokens.shape
        out = torch.full((batch, depth + 1), -1, dtype=torch.long, device=self.next_token.device)
        out[:, :depth] = self.accepted_tokens
        out.scatter_(1, self.num_accepted[:, None], self.next_token[:, None])
        return out


def _per_sequence(value, batch: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.as_tensor(value, dtype=dtype, device=device).expand(batch)


def _check_rows(target: torch.Tensor, trees: DraftTrees) -> None:
    batch, slots = trees.tokens.shape
    if target.dim() != 3 or target.shape[:2] != (batch, slots + 1):
        raise ValueError(f"target rows must be [B={batch}, N+1={slots + 1}, V], got {tuple(target.shape)}")


def _promotion_inputs(tau, allowance, batch: int, slots: int, device) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(tau [B] float64, allowance [B] long, whether any sequence may promote at all)."""
    tau_t = _per_sequence(tau, batch, torch.float64, device)
    allowance_t = _per_sequence(slots if allowance is None else allowance, batch, torch.long, device)
    return tau_t, allowance_t, bool(((tau_t < 1.0) & (allowance_t > 0)).any()) if batch else False


def _on_paths(trees: DraftTrees, values: torch.Tensor, fill) -> torch.Tensor:
    """[B, N, D]: ``values`` [B, N] of the nodes on each node's root path (``fill`` beyond it)."""
    ids = trees.ancestor_ids()
    batch, slots, depth = ids.shape
    gathered = values.gather(1, ids.clamp(min=0).reshape(batch, slots * depth)).reshape(batch, slots, depth)
    return torch.where(ids >= 0, gathered, fill)


def _reachable(trees: DraftTrees, ok: torch.Tensor, promoted: torch.Tensor | None, allowance: torch.Tensor) -> torch.Tensor:
    """[B, N] bool: every node on the root path is ``ok`` and at most ``allowance`` of them are promoted."""
    path_ok = _on_paths(trees, ok, True).all(-1) & trees.node_mask
    if promoted is not None:
        path_ok &= _on_paths(trees, promoted, False).sum(-1) <= allowance[:, None]
    return path_ok


def _deepest(trees: DraftTrees, path_ok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(number accepted [B], the first reachable node of the greatest depth [B], -1 if none)."""
    batch = trees.batch_size
    if trees.num_slots == 0:
        return torch.zeros(batch, dtype=torch.long, device=trees.device), torch.full(
            (batch,), -1, dtype=torch.long, device=trees.device
        )
    reach = torch.where(path_ok, trees.depths, 0)
    num_accepted = reach.amax(1)
    return num_accepted, torch.where(num_accepted > 0, reach.argmax(1), -1)


def _take_path(
    trees: DraftTrees, best: torch.Tensor, promoted: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(promotions used [B], the root path of ``best`` as node indices [B, D], -1 padded)."""
    batch, slots, depth = trees.batch_size, trees.num_slots, trees.max_depth
    if slots == 0:
        return torch.zeros_like(best), torch.full((batch, depth), -1, dtype=torch.long, device=best.device)
    path = trees.ancestor_ids().gather(1, best.clamp(min=0)[:, None, None].expand(batch, 1, depth))[:, 0]
    path = torch.where((best >= 0).unsqueeze(1), path, -1)
    if promoted is None:
        return torch.zeros_like(best), path
    used = (promoted.gather(1, path.clamp(min=0)) & (path >= 0)).sum(1)
    return used, path


def _result(
    trees: DraftTrees, path: torch.Tensor, promoted: torch.Tensor | None, num_accepted, next_token, num_promoted
) -> VerifyResult:
    on_path = path >= 0
    safe = path.clamp(min=0)
    return VerifyResult(
        accepted_nodes=path,
        accepted_tokens=torch.where(on_path, trees.tokens.gather(1, safe), -1),
        promoted=on_path & promoted.gather(1, safe) if promoted is not None else torch.zeros_like(on_path),
        num_accepted=num_accepted,
        next_token=next_token,
        num_promoted=num_promoted,
    )


def verify_greedy(
    # [B, N+1, V]: row 0 = the target's logits after the context, row i+1 = after node i
    target_logits: torch.Tensor,
    # B trees of at most N nodes (tokens, parents, depths [B, N])
    trees: DraftTrees,
    # float, or [B] float: margin threshold per sequence (>= 1: strict matching)
    tau: float | torch.Tensor = 1.0,
    # [B] long: promotions a sequence may use on its path (None: no limit)
    promotion_allowance: torch.Tensor | None = None,
) -> VerifyResult:
    """Greedy (temperature 0) verification; ``target_logits`` [B, N+1, V] (see the module docstring)."""
    _check_rows(target_logits, trees)
    batch, slots = trees.tokens.shape
    device = target_logits.device
    tokens = trees.tokens
    rows = (trees.parents + 1).clamp(min=0)  # padding (parent -2) reads row 0; it is masked anyway

    top, all_rows = _parent_row_argmax(target_logits, trees, rows)
    match = (tokens == top.gather(1, rows)) & trees.node_mask
    tau_t, allowance, any_promotion = _promotion_inputs(tau, promotion_allowance, batch, slots, device)
    promotable = None
    if any_promotion:
        batch_index = torch.arange(batch, device=device)[:, None]
        token_logit = target_logits[batch_index, rows, tokens].float()
        top_logit = target_logits.gather(2, top.clamp(min=0).unsqueeze(-1)).squeeze(-1).float().gather(1, rows)
        can_promote = (tau_t < 1.0) & (allowance > 0)
        ratio = (token_logit - top_logit).double().exp()
        promotable = trees.node_mask & ~match & can_promote[:, None] & (ratio >= tau_t[:, None])
        path_ok = _reachable(trees, match | promotable, promotable, allowance)
        num_accepted, best = _deepest(trees, path_ok)
        best = _break_ties(target_logits, trees, rows, token_logit, path_ok, num_accepted, best)
    else:  # strict matching: nothing else to compute
        num_accepted, best = _deepest(trees, _reachable(trees, match, None, allowance))
    used, path = _take_path(trees, best, promotable)
    if all_rows:
        next_token = top.gather(1, (best + 1)[:, None])[:, 0]
    else:  # one more row per sequence: the one after the accepted path
        next_token = target_logits[torch.arange(batch, device=device), best + 1].argmax(-1)
    return _result(trees, path, promotable, num_accepted, next_token, used)


@dataclass
class ChainResult:
    """Outcome of `verify_greedy_chains`, in vLLM's rejection-sampler layout."""

    output_tokens: torch.Tensor  # [B, K+1] int32: accepted drafts, then the next token, `placeholder` after
    num_accepted: torch.Tensor  # [B] drafts accepted (strict matches and promotions)
    num_promoted: torch.Tensor  # [B] of those, accepted by the margin rule alone


def _ragged_layout(
    num_draft_tokens: torch.Tensor, device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """vLLM's ragged draft layout of ``num_draft_tokens`` [B]: (counts [B] long, each draft's request [T],
    each request's first draft [B], each draft's index within its chain [T])."""
    counts = num_draft_tokens.to(device=device, dtype=torch.long)
    request = torch.repeat_interleave(torch.arange(counts.shape[0], device=device), counts)  # [T]
    start = torch.cumsum(counts, 0) - counts  # [B]
    position = torch.arange(request.shape[0], device=device) - start[request]  # [T] index within its chain
    return counts, request, start, position


def _accept_chains(
    # [T] bool: the draft is accepted without the margin rule (a match; a passed rejection test)
    ok: torch.Tensor,
    # () -> [T] float64: p(draft) / p(top1), called only when some request may promote
    ratio,
    counts: torch.Tensor,  # [B] long
    request: torch.Tensor,  # [T] long
    position: torch.Tensor,  # [T] long
    tau: torch.Tensor,  # [B] float
    promotion_allowance: torch.Tensor,  # [B] long
    max_spec_len: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(accepted [B], of those promoted [B], kept [T]: the draft is on its request's accepted prefix).
    A draft that is not ``ok`` is promoted when ``ratio >= tau`` while its request's promotions up to it stay
    within the allowance; a request keeps its drafts up to the first that is neither."""
    device, batch = ok.device, counts.shape[0]
    promoted = torch.zeros_like(ok)
    can_promote = (tau.to(device) < 1.0) & (promotion_allowance.to(device) > 0)  # [B]
    if bool(can_promote.any()):
        promotable = ~ok & can_promote[request] & (ratio() >= tau.to(device, torch.float64)[request])
        per_request = torch.zeros(batch, dtype=torch.long, device=device).index_add_(0, request, promotable.long())
        before = torch.cumsum(per_request, 0) - per_request  # [B] promotable drafts of earlier requests
        used = torch.cumsum(promotable.long(), 0) - before[request]  # [T] promotions so far within its chain
        promoted = promotable & (used <= promotion_allowance.to(device)[request])
        ok = ok | promoted
    # Accepted = index of the first draft that is not ok (the chain's length when all are).
    first_bad = torch.where(ok, max_spec_len + 1, position)
    num_accepted = torch.full((batch,), max_spec_len + 1, dtype=torch.long, device=device)
    num_accepted = num_accepted.scatter_reduce(0, request, first_bad, reduce="amin").clamp(max=counts)
    kept = position < num_accepted[request]
    num_promoted = torch.zeros(batch, dtype=torch.long, device=device).index_add_(0, request, (promoted & kept).long())
    return num_accepted, num_promoted, kept


def verify_greedy_chains(
    # [num_tokens]: every request's drafts, concatenated (request 0's first)
    draft_token_ids: torch.Tensor,
    # [num_tokens, V]: the target's logits at each draft's position (the row that judges the draft)
    target_logits: torch.Tensor,
    # [B]: drafts per request (0 allowed)
    num_draft_tokens: torch.Tensor,
    # [B, 1] or [B]: the target's token after the last draft (taken when every draft is accepted)
    bonus_token_ids: torch.Tensor,
    max_spec_len: int,
    # [B] float: margin threshold per request (>= 1: strict matching)
    tau: torch.Tensor,
    # [B] long: promotions a request may still use this step
    promotion_allowance: torch.Tensor,
    placeholder: int = -1,
) -> ChainResult:
    """Greedy margin verification of chains on vLLM's ragged layout (no padding, no vocabulary copy).

    Terms: a draft is *accepted* when it is the target's argmax at its position (a match) or, failing
    that, *promoted* by the margin rule: ``p(draft) / p(top1) = exp(logit(draft) - logit(top1)) >= tau``
    while the request's promotions so far this step stay within its allowance. A request accepts its
    drafts up to the first one that is neither; the *next token* is then the target's argmax at that
    position, or the *bonus* token when every draft was accepted. This is ``verify_greedy`` on
    width-1 trees (same decisions, same arithmetic), with one argmax pass over the draft rows, the
    pass vLLM's own greedy rejection sampler makes; the margin adds two gathers, no softmax.

    Worked example: B = 2, num_draft_tokens = [3, 1], tau = [0.5, 1], allowance = [1, 0],
    drafts [a b c | d]; argmax [a x c | y]; ratio of b 0.7. Request 0: a matches, b is promoted
    (0.7 >= 0.5, 1 <= allowance 1), c matches: 3 accepted, output [a b c bonus0]. Request 1:
    d != y and tau 1: 0 accepted, output [y - - -] (- = placeholder).
    """
    device = target_logits.device
    batch = num_draft_tokens.shape[0]
    counts, request, _, position = _ragged_layout(num_draft_tokens, device)
    drafts = draft_token_ids.long()
    top = target_logits.argmax(-1)  # [T], first index on ties, like greedy decoding
    ok = drafts == top

    def ratio() -> torch.Tensor:  # [T] p(draft) / p(top1)
        token_logit = target_logits.gather(1, drafts[:, None])[:, 0].float()
        top_logit = target_logits.gather(1, top[:, None])[:, 0].float()
        return (token_logit - top_logit).double().exp()

    num_accepted, num_promoted, kept = _accept_chains(
        ok, ratio, counts, request, position, tau, promotion_allowance, max_spec_len
    )

    output = torch.full((batch, max_spec_len + 1), placeholder, dtype=torch.int32, device=device)
    stop = position == num_accepted[request]  # the first rejected draft: the target's argmax replaces it
    write = kept | stop
    output[request[write], position[write]] = torch.where(kept, drafts, top)[write].to(torch.int32)
    full = num_accepted == counts
    rows = torch.arange(batch, device=device)[full]
    output[rows, counts[full]] = bonus_token_ids.view(-1)[full].to(torch.int32)
    return ChainResult(output, num_accepted, num_promoted)


def verify_sampled_chains(
    # [num_tokens]: every request's drafts, concatenated (request 0's first)
    draft_token_ids: torch.Tensor,
    # [num_tokens, V]: the target's processed logits (temperature, top-k/p) at each draft's position
    target_logits: torch.Tensor,
    # [B]: drafts per request (0 allowed)
    num_draft_tokens: torch.Tensor,
    # [B, 1] or [B]: the token vLLM sampled after the last draft (taken when every draft is accepted)
    bonus_token_ids: torch.Tensor,
    max_spec_len: int,
    # [B] float: margin threshold per request (>= 1: exact rejection sampling)
    tau: torch.Tensor,
    # [B] long: promotions a request may still use this step
    promotion_allowance: torch.Tensor,
    placeholder: int = -1,
    # [num_tokens, V] or None (one-hot drafts): the distribution each draft was drawn from
    draft_probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    # {request: generator}: a seeded request's draws come from its own generator, one per draft
    generators: dict[int, torch.Generator] | None = None,
    # [num_tokens] or None: the per-draft uniform draws (tests)
    uniforms: torch.Tensor | None = None,
) -> ChainResult:
    """Speculative rejection sampling with the margin rule, for chains on vLLM's ragged layout: what
    ``verify_sampled`` decides for width-1 trees (same draws, same decisions), without padding the target's
    rows to ``[B, K+1, V]`` or a softmax over the padding.

    Terms: with p the target's distribution at a draft's position (softmax of its processed logits) and q
    the drafter's (one-hot at the draft without ``draft_probs``), a draft *passes* when its uniform draw
    u < p(draft) / q(draft); failing that it is *promoted* when ``p(draft) / p(top1) >= tau`` while the
    request's promotions this step stay within its allowance. A request
    accepts its drafts up to the first one that does neither; the *next token* is drawn from the residual
    at that draft's position (p without the draft's token; ``norm(max(p - q, 0))`` with ``draft_probs``),
    or is the *bonus* token when every draft was accepted. Vocabulary-wide work: one softmax over the draft
    rows (the pass vLLM's own random rejection sampler makes), one max pass when a request may promote, and
    one residual row per request. A request with its own generator takes one draw per draft from it, then
    two for the next token, as ``verify_sampled`` does.

    Worked example: B = 2, num_draft_tokens = [2, 1], tau = [0.5, 1], allowance = [1, 0], drafts [a b | c];
    p(a) 0.6, u 0.3: a passes; p(b) 0.2, u 0.9: b fails, p(b) / p(top1) 0.8 >= 0.5: promoted; output
    [a b bonus0]. Request 1: p(c) 0.1, u 0.5 fails, tau 1: 0 accepted, output [x - -], x drawn from p
    without c (- = placeholder).
    """
    device = target_logits.device
    batch = num_draft_tokens.shape[0]
    counts, request, start, position = _ragged_layout(num_draft_tokens, device)
    drafts = draft_token_ids.long()
    # One fused softmax pass over the draft rows (on CPU 1.5x faster than a logsumexp, whose broadcast
    # subtraction is a slow separate pass), the pass vLLM's own random rejection sampler makes.
    probs = target_logits.float().softmax(-1)  # [T, V]
    p_token = probs.gather(1, drafts[:, None])[:, 0].double()  # [T] p(draft)
    if draft_probs is None:
        pass_prob = p_token
    else:
        pass_prob = p_token / draft_probs.gather(1, drafts[:, None])[:, 0].double().clamp(min=1e-30)
    if uniforms is None:  # [B, K] as for padded chains (a seeded row: its own drafts' draws), read ragged
        width = int(counts.max()) if batch else 0
        uniforms = uniform_draws(batch, width, generator, generators, device, row_counts=counts)[request, position]
    num_accepted, num_promoted, kept = _accept_chains(
        uniforms.double() < pass_prob, lambda: p_token / probs.amax(-1).double(),
        counts, request, position, tau, promotion_allowance, max_spec_len,
    )  # fmt: skip

    # Next token: the residual at the first rejected draft; a one-hot of the bonus where every draft passed.
    full = num_accepted == counts  # [B]
    stop = start + num_accepted.clamp(max=(counts - 1).clamp(min=0))  # [B] the rejected draft's row
    vocab = target_logits.shape[1]
    residual = torch.zeros((batch, vocab), dtype=torch.float32, device=device)
    rejected = (~full).nonzero()[:, 0]
    if rejected.numel():
        rows = stop[rejected]
        row_probs = probs[rows]  # [R, V], a copy
        if draft_probs is None:
            trimmed = row_probs.scatter(1, drafts[rows][:, None], 0.0)
        else:
            trimmed = (row_probs - draft_probs[rows].float()).clamp(min=0.0)
        empty = trimmed.sum(1, keepdim=True) <= 0  # numerically nothing left: the row itself
        residual[rejected] = torch.where(empty, row_probs, trimmed)
    bonus = bonus_token_ids.view(-1).long()
    residual[full.nonzero()[:, 0], bonus[full]] = 1.0
    next_token = sample_from_weights(residual, generator, generators)

    output = torch.full((batch, max_spec_len + 1), placeholder, dtype=torch.int32, device=device)
    output[request[kept], position[kept]] = drafts[kept].to(torch.int32)
    output[torch.arange(batch, device=device), num_accepted] = next_token.to(torch.int32)
    return ChainResult(output, num_accepted, num_promoted)


def _parent_row_argmax(target_logits: torch.Tensor, trees: DraftTrees, rows: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """([B, N+1] target argmax per row, whether every row has it).

    The argmax over the vocabulary dominates the cost of greedy verification. Only rows that are
    some node's parent row are judged against; the rows after leaves matter only for the one
    leaf a path may end on. When leaves are many (wide trees) only the parent rows are reduced
    here (-1 elsewhere) and the caller reduces the single row after the chosen path."""
    batch, total = target_logits.shape[:2]
    is_parent_row = torch.zeros(batch, total + 1, dtype=torch.bool, device=target_logits.device)
    is_parent_row.scatter_(1, torch.where(trees.node_mask, rows, total), True)
    is_parent_row = is_parent_row[:, :total]
    needed = int(is_parent_row.sum()) + batch
    # Picking rows out costs a copy of them, about twice an argmax pass on CPU: worth it only
    # when well under half of the rows are needed.
    if needed > 0.4 * batch * total:
        return target_logits.argmax(-1), True  # first index on ties, exactly like greedy decoding
    batch_index, row_index = is_parent_row.nonzero(as_tuple=True)
    top = torch.full((batch, total), -1, dtype=torch.long, device=target_logits.device)
    top[batch_index, row_index] = target_logits[batch_index, row_index].argmax(-1)
    return top, False


def _break_ties(target_logits, trees, rows, token_logit, path_ok, num_accepted, best) -> torch.Tensor:
    """Among several reachable nodes of the greatest depth, the one whose path has the highest
    target log-probability (first on ties). Only the rows on tied paths are normalised."""
    if trees.num_slots == 0:
        return best
    deepest = path_ok & (trees.depths == num_accepted[:, None]) & (num_accepted[:, None] > 0)
    tied = deepest.sum(1) > 1
    if not bool(tied.any()):
        return best
    ids = trees.ancestor_ids()
    batch, slots, depth = ids.shape
    on_tied_paths = torch.zeros(batch, slots + 1, dtype=torch.bool, device=ids.device)
    candidates = deepest & tied[:, None]
    on_tied_paths.scatter_(1, torch.where(candidates.unsqueeze(2) & (ids >= 0), ids, slots).reshape(batch, -1), True)
    batch_index, node_index = on_tied_paths[:, :slots].nonzero(as_tuple=True)
    log_norm = torch.logsumexp(target_logits[batch_index, rows[batch_index, node_index]].float(), dim=-1)
    score = torch.zeros_like(token_logit).index_put_(
        (batch_index, node_index), token_logit[batch_index, node_index] - log_norm
    )
    path_score = _on_paths(trees, score, 0.0).sum(-1)
    chosen = torch.where(deepest, path_score, float("-inf")).argmax(1)
    return torch.where(tied, chosen, best)


def verify_sampled(
    # [B, N+1, V]: processed target probabilities, rows as in `verify_greedy`, each summing to 1
    target_probs: torch.Tensor,
    # B trees of at most N nodes (tokens, parents, depths [B, N])
    trees: DraftTrees,
    # float, or [B] float: margin threshold per sequence (>= 1: exact rejection sampling)
    tau: float | torch.Tensor = 1.0,
    # [B] long: promotions a sequence may use on its path (None: no limit)
    promotion_allowance: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    # [B, N, V] or None (one-hot drafts): row i = the distribution node i's token was drawn from
    draft_probs: torch.Tensor | None = None,
    # [B, N] or None: the per-node uniform draws (tests)
    uniforms: torch.Tensor | None = None,
    generators: dict[int, torch.Generator] | None = None,
) -> VerifyResult:
    """Speculative rejection sampling over trees; ``target_probs`` [B, N+1, V] already processed
    (temperature, top-p, ...), each row summing to 1; ``draft_probs`` [B, N, V], row i = the distribution node i's token
    was drawn from (chains only). ``uniforms`` [B, N] replaces the per-node random draws (tests).
    ``generators`` {row: generator} draws a row's randomness from its own generator (seeded requests,
    as vLLM's sampler does), the other rows from ``generator``."""
    _check_rows(target_probs, trees)
    batch, slots = trees.tokens.shape
    device = target_probs.device
    valid = trees.node_mask
    parents, tokens = trees.parents, trees.tokens
    rows = (parents + 1).clamp(min=0)
    batch_index = torch.arange(batch, device=device)[:, None]

    p_token = torch.where(valid, target_probs[batch_index, rows, tokens].float(), 0.0)
    same_parent = valid.unsqueeze(2) & valid.unsqueeze(1) & (parents.unsqueeze(2) == parents.unsqueeze(1))
    node_index = torch.arange(slots, device=device)
    earlier = same_parent & (node_index[None, :] < node_index[:, None])  # [b, i, j]: j is an earlier sibling of i

    if draft_probs is None:
        duplicate = (earlier & (tokens.unsqueeze(2) == tokens.unsqueeze(1))).any(-1)
        p_fresh = torch.where(duplicate, 0.0, p_token)
        mass_before = torch.bmm(earlier.float(), p_fresh.unsqueeze(-1)).squeeze(-1)
        pass_prob = p_fresh / (1.0 - mass_before).clamp(min=1e-30)
    else:
        if bool(earlier.any()):
            raise ValueError("verify_sampled with draft_probs supports chains only (a node has siblings)")
        q_token = torch.where(valid, draft_probs[batch_index, node_index.expand(batch, slots), tokens].float(), 1.0)
        pass_prob = p_token / q_token.clamp(min=1e-30)
    if uniforms is None:
        uniforms = uniform_draws(batch, slots, generator, generators, device, row_counts=valid.sum(1))
    passed = valid & (uniforms < pass_prob)
    first_pass = passed & ~(earlier & passed.unsqueeze(1)).any(-1)

    tau_t, allowance, any_promotion = _promotion_inputs(tau, promotion_allowance, batch, slots, device)
    promoted = None
    if any_promotion:
        p_top = target_probs.amax(-1).float().gather(1, rows)
        can_promote = (tau_t < 1.0) & (allowance > 0)
        sibling_passed = (same_parent & passed.unsqueeze(1)).any(-1)
        margin_ok = (p_token.double() / p_top.double().clamp(min=1e-300)) >= tau_t[:, None]
        promotable = valid & can_promote[:, None] & margin_ok & ~sibling_passed
        # Among promotable siblings keep the one with the largest p(token), the lowest index on ties.
        other, this = p_token.unsqueeze(1), p_token.unsqueeze(2)
        beaten = same_parent & promotable.unsqueeze(1) & ((other > this) | ((other == this) & earlier))
        promoted = promotable & ~beaten.any(-1)
    accepted = first_pass | promoted if promoted is not None else first_pass
    num_accepted, best = _deepest(trees, _reachable(trees, accepted, promoted, allowance))
    used, path = _take_path(trees, best, promoted)

    # Next token: from the residual at the last accepted node (the row itself at a leaf).
    # Row copies by indexing (a gather with a vocab-wide index is several times slower on CPU).
    last_row = (batch_index[:, 0], best + 1)
    residual = target_probs[last_row].float()  # a fresh copy: edited in place
    children = valid & (parents == best[:, None])
    if draft_probs is None:
        # Zero the children's tokens (multiply by 0; other slots multiply their own token by 1).
        residual.scatter_reduce_(1, tokens, (~children).float(), reduce="prod")
    elif slots:
        child = (best + 1).clamp(max=slots - 1)
        q_child = draft_probs[batch_index[:, 0], child].float()
        residual = torch.where(children.any(1, keepdim=True), (residual - q_child).clamp(min=0.0), residual)
    empty = residual.sum(1) <= 0
    if bool(empty.any()):  # numerically nothing left: fall back to the row itself
        residual = torch.where(empty[:, None], target_probs[last_row].float(), residual)
    next_token = sample_from_weights(residual, generator, generators)
    return _result(trees, path, promoted, num_accepted, next_token, used)


SAMPLE_BLOCK = 1024


def uniform_draws(
    batch: int,
    count: int,
    generator: torch.Generator | None,
    generators: dict[int, torch.Generator] | None,
    device,
    dtype: torch.dtype = torch.float32,
    # [batch] long or None: draws a seeded row takes from its own generator (None: ``count`` each)
    row_counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """[batch, count] uniforms in [0, 1): row i from ``generators[i]`` when it has one, the rest from
    ``generator``. A seeded row takes only its own ``row_counts[i]`` draws (its tree's nodes), not the padded
    ``count`` the batch's largest tree sets, so its stream depends on its seed and its own drafts alone, not on
    the batch it shares (as vLLM's rejection sampler draws one uniform per draft token of the request)."""
    draws = torch.rand(batch, count, generator=generator, device=device, dtype=dtype)
    counts = row_counts.tolist() if row_counts is not None and generators else None
    for row, own in (generators or {}).items():
        n = count if counts is None else int(counts[row])
        draws[row, :n] = torch.rand(n, generator=own, device=device, dtype=dtype)
    return draws


def sample_from_weights(
    # [B, V]: non-negative, positive total per row
    weights: torch.Tensor,
    generator: torch.Generator | None = None,
    generators: dict[int, torch.Generator] | None = None,
) -> torch.Tensor:
    """One draw per row of ``weights`` [B, V] (non-negative, positive total), proportional to them
    (randomness as in `uniform_draws`).

    Two-level inverse CDF: pick a block of SAMPLE_BLOCK tokens by its total, then a token inside
    it. That is one vectorised pass over the vocabulary (the block sums) instead of a full cumsum
    or multinomial, which are slow on CPU for a 150k vocabulary; exact up to float rounding."""
    batch, vocab = weights.shape
    weights = weights.contiguous()
    full = vocab // SAMPLE_BLOCK * SAMPLE_BLOCK
    sums = [weights[:, :full].reshape(batch, -1, SAMPLE_BLOCK).sum(-1)] if full else []
    if full < vocab:
        sums.append(weights[:, full:].sum(-1, keepdim=True))
    block_cdf = torch.cat(sums, dim=1).double().cumsum(1)
    total = block_cdf[:, -1]
    if not bool((torch.isfinite(total) & (total > 0)).all()):
        # Sampling would silently return an out-of-vocabulary index; fail where the cause is visible.
        raise ValueError("sample_from_weights: a row has no positive finite mass (NaN/inf probabilities?)")
    uniforms = uniform_draws(batch, 2, generator, generators, weights.device, torch.float64)
    block = torch.searchsorted(block_cdf, uniforms[:, :1] * block_cdf[:, -1:], right=True)
    start = block.clamp(max=block_cdf.shape[1] - 1) * SAMPLE_BLOCK  # [B, 1]
    index = start + torch.arange(SAMPLE_BLOCK, device=weights.device)
    inside = torch.where(index < vocab, weights.gather(1, index.clamp(max=vocab - 1)), 0.0).double().cumsum(1)
    offset = torch.searchsorted(inside, uniforms[:, 1:] * inside[:, -1:], right=True).clamp(max=SAMPLE_BLOCK - 1)
    return (start + offset)[:, 0]
