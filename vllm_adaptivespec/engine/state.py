"""Per-runner AdaptiveSpec state: one policy per request, each request's pending draft tree, the
step being verified, step stats.

Lives in the worker next to vLLM's model runner. The proposer asks it for tree shapes and hands it
the trees it drafted (vLLM schedules only their flattened tokens); the margin sampler asks it for
each request's tau and promotion allowance and reports back what was accepted; it feeds that to
the request's policy and keeps counts for the metrics.
"""

from __future__ import annotations

import random
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import numpy as np
import torch

from vllm_adaptivespec.config import AdaptiveSpecConfig
from vllm_adaptivespec.engine.free_draft import FreeDrafts
from vllm_adaptivespec.engine.request_params import request_tau
from vllm_adaptivespec.engine.verify_cost import DraftCost, VerifyCost
from vllm_adaptivespec.policy import PolicyBank, TreeShape, tree_capacity
from vllm_adaptivespec.step_cost import (
    ConfidenceCalibration,
    Continuation,
    OutputLengths,
    PooledAcceptance,
    StepCosts,
    Stretches,
    catch_up_per_token,
    continue_chains,
    copy_yield,
    could_pay,
    plan_depths,
    shrunk_rate,
)
from vllm_adaptivespec.tree import DraftTrees

# A probe that ends in "off" doubles the steps until the next one, up to probe_every * PROBE_BACKOFF.
PROBE_BACKOFF = 16


@dataclass
class StepStats:
    """What one engine step did, shipped to the scheduler with the model runner output."""

    promoted: int = 0
    free_tokens: int = 0  # draft tokens copied from the requests' own text (no drafter pass)
    drafter_passes: int = 0  # forward passes of the drafter model this step (0: it was skipped)
    depth_counts: list[int] = field(default_factory=list)  # index = chosen depth
    promotion_counts: list[int] = field(default_factory=list)  # index = promotions in one request's verified draft
    draft_cost: float | None = None  # the drafter cost the policy priced depth with this step
    overhead_seconds: float = 0.0  # the plugin's own work this step (policy, bookkeeping, margin verification)

    def add_depths(self, depths: Iterable[int]) -> None:
        add_counts(self.depth_counts, depths)

    def add_promotions(self, promotions: Iterable[int]) -> None:
        add_counts(self.promotion_counts, promotions)


def add_counts(counts: list[int], values: Iterable[int]) -> list[int]:
    """Histogram by index, in place: ``counts[v] += 1`` for each value, growing ``counts`` as needed."""
    for value in values:
        if value >= len(counts):
            counts.extend([0] * (value + 1 - len(counts)))
        counts[value] += 1
    return counts


@dataclass
class ChainStep:
    """A chain step re-planned after every drafter pass (``AdaptiveState.continue_chains``), per batch row."""

    drafted: list[list[float]]  # fused estimate of each token drafted so far ([]: no drafter chain this step)
    must: list[bool]  # the row drafts this step whatever its estimates (a probe)
    copies: tuple[float, int]  # expected accepted tokens and query tokens of the step's free drafts
    copy_lengths: list[int]  # each row's free draft length (0: none)
    max_depth: int
    first_depths: list[int]  # the first pass's depths (random shapes: each chain's, cut where the step stops)
    passes: int = 1  # drafter passes run so far


@dataclass(frozen=True)
class DraftRecord:
    """A request's drafted tree as vLLM will schedule it: flattened tokens and their parents."""

    tokens: list[int]
    parents: list[int]  # -1: child of the root (the request's last token)


@dataclass
class Verification:
    """The inputs the margin sampler needs for the batch it is verifying, in batch-row order."""

    tau: torch.Tensor  # [B] float
    allowance: torch.Tensor  # [B] long
    num_draft_tokens: list[int]
    trees: DraftTrees | None = None  # the scheduled trees, [B, max drafts]; None: every draft is a chain
    num_accepted: list[int] | None = None
    num_promoted: list[int] | None = None
    accepted_nodes: torch.Tensor | None = None  # [B, D] node indices of each accepted path, -1 padded
    overhead_seconds: float = 0.0  # time the margin sampler spent beyond vLLM's own rejection sampler
    _paths: list[list[int]] | None = field(default=None, init=False, repr=False)

    def accepted_paths(self) -> list[list[int]] | None:
        """``accepted_nodes`` on the host (read once: the tree step's KV moves and the policies both use it)."""
        if self._paths is None and self.accepted_nodes is not None:
            self._paths = self.accepted_nodes.tolist()
        return self._paths

    def may_promote(self) -> bool:
        """Whether any request could accept a draft by the margin rule this step (else: strict)."""
        return bool(((self.tau < 1.0) & (self.allowance > 0)).any())

    def depths(self) -> list[int]:
        """Each row's draft depth (its longest acceptable path), what its policy observes."""
        if self.trees is None or self.trees.num_slots == 0:
            return list(self.num_draft_tokens)
        return self.trees.depths.amax(1).tolist()


HISTORY_PRIOR_WEIGHT = 4.0  # judged positions the pooled acceptance counts as in a request's estimate (``_history``)


class AdaptiveState:
    def __init__(
        self,
        config: AdaptiveSpecConfig,
        runner: Any,
        random_shapes_seed: int | None = None,
        random_off_seed: int | None = None,
        record_steps: int = 0,
    ):
        self.config = config
        self.policies = PolicyBank(config)
        self._runner = runner
        self.step = StepStats()
        self.verification: Verification | None = None
        self.drafts: dict[str, DraftRecord] = {}
        self.tree_step = None  # the scheduled trees of the step in flight (engine.tree_step.TreeStep)
        self.chain_step: ChainStep | None = None  # a chain step being drafted and re-planned pass by pass
        self.cost = VerifyCost()  # target forward time by query tokens, measured by the runner hooks
        self.draft_cost = DraftCost()  # drafter pass vs target forward, measured by the proposer and the hooks
        self.step_costs = StepCosts(target=self.cost)  # + drafter pass by rows + fixed step cost
        self.calibration = ConfidenceCalibration()  # drafter confidence -> observed first-draft acceptance
        self.pooled = PooledAcceptance()  # all requests' recent acceptance: where a new request's estimate starts
        self.output_lengths = OutputLengths()  # finished requests' output lengths: the tokens a batch has ahead
        self.stretches = Stretches()  # how long the drafter stayed on when the plan turned it on
        # The second draft source: drafts copied from the request's own text, no drafter pass.
        self.free_drafts = (
            FreeDrafts(config, getattr(runner, "max_model_len", 1 << 30))
            if config.free_drafter != "off"
            else None
        )
        self.confidence: dict[str, float] = {}  # each request's drafter confidence, until its draft is verified
        self.drafter_next: dict[str, int] = {}  # first position whose drafter KV is missing (``drafter_seen``)
        # Requests whose drafter KV could not be caught up whole this pass (no draft for them), each with where
        # its KV now ends if a chunk of its backlog was caught up (None: nothing was).
        self.behind: dict[str, int | None] = {}
        self.idle: dict[str, int] = {}  # steps in a row each request went without a draft
        self.off_streak = 0  # steps in a row that ran no drafter pass
        self._off_batch: list[str] | None = None  # the batch those steps ran (re-planned when it changes)
        self._hopeless = False  # that batch cannot gain from speculation at all on the measured costs
        self.probe_interval = config.probe_every  # steps off in a row before the batch probes again
        self._probing = False  # the last drafter step ran only because the batch was due a probe
        self.probe_only: str | None = None  # the one request a probe step catches up and drafts for (``drafter_off``)
        self._cost_probed: int | None = None  # ``cost.clock`` at the last cost probe (``_cost_probe``)
        self.forward_started: float | None = None
        self._step_started: float | None = None
        self._step_target_seconds = self._step_draft_seconds = 0.0
        self._step_verified = False  # the step in flight verified drafts (its rest is ``StepCosts``' verifying kind)
        self.step_outputs = None  # the target forward's hidden states and slot mappings of that step
        # Debug knobs: shapes drawn at random every step (exercises every tree layout and KV move);
        # speculation off for a whole step at random, or one request's backlog caught up (exercises the
        # drafter's catch-up).
        self._random_shapes = None if random_shapes_seed is None else random.Random(random_shapes_seed)
        self._random_off = None if random_off_seed is None else random.Random(random_off_seed)
        # Opt-in step log for the benchmark's hindsight oracle: per verification step, what each request
        # drafted and had accepted, and how many drafter passes produced those drafts.
        self.step_log: deque[dict] | None = deque(maxlen=record_steps) if record_steps > 0 else None
        self._pending_passes = 0  # drafter passes of the last propose (0: it skipped the drafter)
        self._pending_empty = False  # the last propose drafted nothing for anyone

    def request_ids(self) -> list[str]:
        return list(self._runner.input_batch.req_ids)

    def choose_shapes(self, confidence: torch.Tensor, node_ceiling: int) -> list[TreeShape]:
        """Each batch row's tree shape this step, from its first-pass confidence ``confidence`` [B].

        Chains (unless pinned, see ``planned``): the batch step plan (``step_cost.plan_depths``) on the
        measured step costs, depth 0 allowed, each request's free draft (``offer_free_drafts``) a second
        source; a request drafting from it gets depth 0 here (no drafter pass for it) and its copy later
        (``with_free_drafts``); a request due a probe drafts at least ``min_depth`` from the drafter.
        Trees, and chains until the cost model is measured: a request the plan drafts from its free draft
        alone (trees, with the free source) gets depth 0 here and its copy as a chain later; every other
        request its policy's shape, at most
        ``node_ceiling`` nodes (what vLLM's draft buffers hold) and no more than the measured
        verification cost says pay off (``VerifyCost.node_cap``), but never below ``min_nodes`` (so a
        pinned shape stays pinned); depth priced by the measured drafter cost."""
        req_ids = self.request_ids()
        batch = len(req_ids)
        for rid, c in zip(req_ids, confidence.tolist()):
            self.confidence[rid] = c
        measured = self.draft_cost.ratio() if self.config.measure_draft_cost else None
        draft_cost = self.config.draft_cost if measured is None else measured
        self.step.draft_cost = draft_cost
        plan = None
        chains = self.config.mode == "chain"
        # An EAGLE head cannot skip its first pass (``drafter_off``), so its cost probe is a step of no drafts.
        probe = self._random_shapes is None and self._random_off is None and self._cost_probe(batch)
        if probe:
            self._choose_free(req_ids, [0] * batch, [False] * batch)
        elif self._random_shapes is None and self.planned and (chains or self.free_drafts is not None):
            estimates = self.acceptance_estimates(req_ids, confidence.tolist())
            plan = plan_depths(
                estimates, self.step_costs, self.config.min_depth, min(self.config.max_depth, node_ceiling),
                allow_off=self.config.allow_off, free=self._free_estimates(req_ids),
            )  # fmt: skip
        free_rows = [False] * batch
        if plan is not None:  # the requests it drafts from their copy alone (a request due a probe: the drafter)
            free_rows = [f and not self._must_probe(rid) for rid, f in zip(req_ids, plan.free or free_rows)]
            self._choose_free(req_ids, plan.depths, free_rows)
        if self._random_shapes is not None:
            shapes = [self._random_shape(node_ceiling) for _ in req_ids]
        elif plan is not None and chains:
            floor = min(self.config.min_depth, node_ceiling)
            depths = [
                0 if free else max(depth, floor) if self._must_probe(rid) else depth
                for rid, depth, free in zip(req_ids, plan.depths, free_rows)
            ]
            shapes = [TreeShape(depth, 1, depth) for depth in depths]
        else:  # trees (the plan, if any, chose only the copy-alone rows), and chains before the costs are measured
            policies = [self.policies[rid] for rid in req_ids]
            acceptance = sum(p.acceptance_rate for p in policies) / max(1, batch)
            cap = min(node_ceiling, max(self.config.min_nodes, self.cost.node_cap(batch, acceptance, node_ceiling)))
            shapes = [
                TreeShape(0, 1, 0) if free
                else policy.shape(float(confidence[row]), batch_size=batch, node_cap=cap, draft_cost=draft_cost)
                for row, (policy, free) in enumerate(zip(policies, free_rows))
            ]  # fmt: skip
        if self.behind or probe:  # a hole in their drafter KV this pass: their drafts would be guesses
            shapes = [TreeShape(0, 1, 0) if probe or rid in self.behind else shape for rid, shape in zip(req_ids, shapes)]
        for rid, shape in zip(req_ids, shapes):
            self.idle[rid] = 0 if shape.depth else self.idle.get(rid, 0) + 1  # steps without a drafter draft
        copies = [d if free else 0 for d, free in zip(plan.depths if plan else [0] * batch, free_rows)]
        self.chain_step = None
        replanned = plan is not None or self._random_shapes is not None
        if replanned and chains and self.config.replan_each_pass and max(s.depth for s in shapes) >= 2:
            # Re-planned after every further pass (``continue_chains``); the depths are recorded when it stops.
            free_estimates = self._free_estimates(req_ids) or [(0, 0.0, 0.0)] * batch
            if plan is None:  # random shapes: the estimates are never read
                estimates = [0.5] * batch
            self.chain_step = ChainStep(
                drafted=[[] if f or rid in self.behind else [p] for rid, f, p in zip(req_ids, free_rows, estimates)],
                must=[self._must_probe(rid) and rid not in self.behind for rid in req_ids],
                copies=(sum(copy_yield(f, c, n) for (_, f, c), n in zip(free_estimates, copies)), sum(copies)),
                copy_lengths=copies,
                max_depth=min(self.config.max_depth, node_ceiling),
                first_depths=[shape.depth for shape in shapes],
            )  # fmt: skip
        else:
            self.step.add_depths(c if f else shape.depth for c, f, shape in zip(copies, free_rows, shapes))
        return shapes

    def continue_chains(self, confidence: list[float]) -> list[int] | None:
        """After one more drafter pass of a chain step (``confidence`` [B]: each row's top-1 confidence for the
        token that pass drafted): each chain's length if the step stops drafting here, None to run another pass
        (``step_cost.continue_chains``, each drafted token priced by ``acceptance_estimates`` of its own
        confidence). A chain that drafts keeps at least ``min_depth`` tokens (a probe's request always drafts),
        so the step runs at least ``min_depth`` passes while one does; it stops at ``max_depth`` passes."""
        chain = self.chain_step
        chain.passes += 1
        if self._random_shapes is not None:  # debug: stop at a random pass, each chain its random depth cut there
            if chain.passes < chain.max_depth and self._random_shapes.random() < 0.5:
                return None
            self.chain_step = None
            lengths = [min(depth, chain.passes) for depth in chain.first_depths]
            self.step.add_depths(lengths)
            return lengths
        for drafted, estimate in zip(chain.drafted, self.acceptance_estimates(self.request_ids(), confidence)):
            if drafted:
                drafted.append(estimate)
        plan = continue_chains(chain.drafted, chain.passes, self.step_costs, chain.max_depth, chain.copies)
        if plan is None:  # the cost model lost its prices (a stale bucket restarted): the chains drafted so far
            plan = Continuation([chain.passes if d else 0 for d in chain.drafted], chain.passes, 0.0)
        floor = min(self.config.min_depth, chain.passes)
        lengths = [
            max(n, floor) if drafted and (n or must) else 0
            for n, drafted, must in zip(plan.lengths, chain.drafted, chain.must)
        ]  # fmt: skip
        short = chain.passes < self.config.min_depth and any(lengths)
        if chain.passes < chain.max_depth and (plan.passes > chain.passes or short):
            return None
        self.chain_step = None
        self.step.add_depths(c or n for c, n in zip(chain.copy_lengths, lengths))
        return lengths

    def _free_estimates(self, req_ids: list[str]) -> list[tuple[int, float, float]] | None:
        """Each request's free draft for the step plan, (L_i, f_i, c_i); None without the free source."""
        return None if self.free_drafts is None else self.free_drafts.estimates(req_ids)

    def _choose_free(self, req_ids: list[str], depths: list[int], free: list[bool] | None) -> None:
        if self.free_drafts is not None:
            self.free_drafts.choose(req_ids, depths, free)

    def offer_free_drafts(
        self, first_positions: list[int], query_tokens: list[list[int]], next_tokens: list[int], k: int
    ) -> None:
        """This step's free drafts, before the drafter runs or is skipped: each batch row's history is its
        tokens before ``first_positions[row]`` (the runner's token table), this step's accepted query tokens
        and the token just sampled. Rows still prefilling their prompt get none."""
        if self.free_drafts is None:
            return
        table = self._runner.input_batch.token_ids_cpu
        histories, prompt_lens = [], []
        for row, (rid, first, query, last) in enumerate(zip(self.request_ids(), first_positions, query_tokens,
                                                            next_tokens)):  # fmt: skip
            request = self._runner.requests.get(rid)
            prompt_lens.append(0 if request is None else request.num_prompt_tokens)
            if request is None or first + len(query) < request.num_prompt_tokens:
                histories.append(None)
                continue
            history = np.empty(first + len(query) + 1, dtype=np.int32)
            history[:first] = table[row, :first]
            history[first:-1] = query
            history[-1] = last
            histories.append(history)
        self.free_drafts.offer(self.request_ids(), histories, prompt_lens, k)

    def with_free_drafts(self, drafts: list[list[int]]) -> list[list[int]]:
        """The proposer's drafts with the rows the plan drafts from their free drafts replaced (all chains:
        no tree recorded earlier stays to be read as these drafts' parents)."""
        if self.free_drafts is not None:
            self.step.free_tokens += self.free_drafts.apply(self.request_ids(), drafts)
        self.drafts.clear()
        self._pending_empty = not any(drafts)
        return drafts

    @property
    def planned(self) -> bool:
        """Whether the step plan sizes chains and may switch speculation off: not when the user pinned
        the depth (``min_depth == max_depth``) or fixed the drafter's cost (``measure_draft_cost`` false)."""
        return self.config.measure_draft_cost and self.config.min_depth != self.config.max_depth

    def acceptance_estimates(self, req_ids: list[str], confidence: list[float] | None = None) -> list[float]:
        """Each request's per-position acceptance estimate p_i for the step plan: its rolling history a_i,
        fused with its calibrated drafter confidence once the first pass has given one:
        p_i = w * cal(c_i) + (1 - w) * a_i, w = ``confidence_weight``. Before the first pass (whether
        to run the drafter at all) c_i is unknown and cal(c_i) is taken at its expectation, the drafter's
        first-token acceptance so far: p_i = w * mean_cal + (1 - w) * a_i (a_i alone before any draft was
        judged). So whether to pay for the first pass is priced on the estimate the plan after it sees on
        average; with a_i alone a drafter whose confidence the calibration reads low was run for its
        first pass and then given depth 0 (one batch-8 run on 2 CPU cores: 5 of its first 11 steps; such
        steps still occur with the expectation, since single confidences vary around it)."""
        pooled = self.pooled.rate()
        history = [self._history(rid, pooled) for rid in req_ids]
        w = self.config.confidence_weight
        if confidence is None:
            expected = self.calibration.mean()
            return history if expected is None else [w * expected + (1.0 - w) * a for a in history]
        return [w * self.calibration(c) + (1.0 - w) * a for c, a in zip(confidence, history)]

    def _history(self, rid: str, pooled: float | None) -> float:
        """The request's rolling acceptance a_i, shrunk toward the pooled acceptance of recent drafts of every
        request (``PooledAcceptance``; ``prior_acceptance`` before any) while its own window holds few judged
        positions n_i:

            a_i = (n_i * rate_i + HISTORY_PRIOR_WEIGHT * pooled) / (n_i + HISTORY_PRIOR_WEIGHT)

        so before its first judged draft a request starts from the pool, and one rejected first token does not
        read as a drafter that is never right (unshrunk, it set a_i = 0 and, at batch 1 on HumanEval where 88% of
        drafted tokens were accepted, kept the drafter off for the next 16 steps, every few requests)."""
        policy = self.policies[rid]
        prior = self.config.prior_acceptance if pooled is None else pooled
        return shrunk_rate(policy.judged, policy.acceptance_rate, prior, HISTORY_PRIOR_WEIGHT)

    def _cost_probe(self, batch: int) -> bool:
        """Whether this step decodes plainly, no drafts at all, to re-measure plain decoding's forward: the
        step plan prices every plan against t_target(B), which a step that drafts never runs, so once its
        bucket's reading is stale (``BucketedTime.age`` over ``stale_after`` forwards, or never read) one step
        reads it again. At most one probe per ``stale_after // 4`` forwards (a probe that meets a prefill
        reads a larger forward and is retried then). Only where the plan may switch speculation off; costs
        at most one step's drafts in ``stale_after`` steps."""
        cost = self.cost
        if not (self.planned and self.config.allow_off and self.step_costs.ready()):
            return False
        age = cost.age(batch)
        if age is not None and age <= cost.stale_after:
            return False
        if self._cost_probed is not None and cost.clock - self._cost_probed <= cost.stale_after // 4:
            return False
        self._cost_probed = cost.clock
        return True

    def _must_probe(self, rid: str) -> bool:
        """The request drafts ``min_depth`` this step, to refresh the acceptance estimates (the cost of
        looking): the request a probe step chose (``probe_only``), else any that went ``probe_interval``
        steps without a draft."""
        if self.probe_only is not None:
            return rid == self.probe_only
        return self.idle.get(rid, 0) >= self.probe_interval

    def drafter_off(self, rows: int | None = None, lags: list[int] | None = None) -> bool:
        """Whether this step runs no drafter pass at all. Called by draft-model proposers only: they can
        catch up later (``drafter_lag``), prompts included, so a request whose drafter never pays never
        runs it, not even over its prompt. ``rows``: what the first pass would run over if it ran now (the
        last step's tokens and the drafter's backlog; None: unknown, the catch-up is not priced); ``lags``:
        each batch row's backlog (``drafter_lag``), which picks the request a probe looks at.

        Off when the step plan, priced before the first pass on the requests' acceptance estimates and with the
        catch-up over ``rows`` charged per token the batch has ahead (``step_cost.catch_up_per_token``,
        ``tokens_ahead``), drafts nothing, unless the batch is due a probe: after ``probe_interval`` steps off in a
        row one request, the one with the smallest backlog (``probe_only``: its catch-up is the probe's cost; the
        others' backlogs wait), drafts ``min_depth`` once, to refresh the estimates: the pooled acceptance every
        request without a judged draft of its own starts from, and its own. A probe after which the plan still says
        off doubles the interval (up to ``probe_every * PROBE_BACKOFF``); a plan that drafts resets it to
        ``probe_every``. A batch that cannot gain from the drafter even if it were never wrong, over plain decoding
        or the step's copies (``step_cost.could_pay`` on the measured costs, its catch-up priced over every token the
        batch has ahead: such a drafter is never turned off, so the cap by recent stretches does not apply to it) is
        not probed: no
        estimate could change that answer, and a probe would pay the drafter's catch-up for nothing (while the same
        batch stays off its backlog grows and what it has ahead shrinks, so that answer holds until the batch
        changes). Priced over the capped T instead, the verdict sealed itself: no stretch ran, so the cap that
        caused it never changed (batch 1, HumanEval: one early stretch of one step kept every later request's
        drafter off for good). The other way round, a batch that
        drafts is switched off for one step when the plain forward's cost reading is stale (``_cost_probe``)."""
        cfg = self.config
        req_ids = self.request_ids()
        free_depths = [0] * len(req_ids)
        free = self._free_estimates(req_ids)  # this step's copies: a new one is worth a new plan
        probe = False
        on_merits = True  # off, if it is, whatever the drafter's backlog (``Stretches``)
        self.probe_only = None
        if self._random_off is not None:  # debug knob: whatever the settings; half the passes catch up one request
            off = self._random_off.random() < 0.5
            if not off and lags and self._random_off.random() < 0.5:
                self.probe_only = req_ids[self._random_off.randrange(len(req_ids))]
        elif self._random_shapes is not None:  # debug knob: a random drafter shape every step, so the drafter runs
            off = False
        elif not cfg.allow_off or not self.planned:
            off = False
        elif self._cost_probe(len(req_ids)):
            off = probe = True
        elif self.off_streak and req_ids == self._off_batch and not any(n for n, _, _ in free or ()):
            off = self._hopeless or self.off_streak < self.probe_interval  # nothing verified since: same answer
            self._probing = not off
        else:
            catch_up = 0.0 if rows is None else catch_up_per_token(
                self.step_costs, len(req_ids), rows, self.tokens_ahead(req_ids)  # T: at most recent stretches on
            )  # fmt: skip
            estimates = self.acceptance_estimates(req_ids)
            plan = plan_depths(estimates, self.step_costs, cfg.min_depth, cfg.max_depth, free=free, catch_up=catch_up)
            if plan is None or plan.passes > 0:
                off = self._hopeless = self._probing = False
                if plan is not None:
                    self.probe_interval = cfg.probe_every
            else:
                if catch_up > 0:
                    unpriced = plan_depths(estimates, self.step_costs, cfg.min_depth, cfg.max_depth, free=free)
                    on_merits = unpriced is None or unpriced.passes == 0
                if self._probing:  # the probe found nothing worth drafting: look half as often
                    self.probe_interval = min(2 * self.probe_interval, cfg.probe_every * PROBE_BACKOFF)
                # A drafter that is never wrong is never turned off on the merits: its stretch lasts as long as
                # the batch has tokens ahead, so its catch-up is priced over all of them.
                perfect = 0.0 if rows is None else catch_up_per_token(
                    self.step_costs, len(req_ids), rows, self.tokens_ahead(req_ids, stretches=False)
                )  # fmt: skip
                self._hopeless = not could_pay(self.step_costs, len(req_ids), cfg.max_depth, perfect, free=free)
                off = self._hopeless or self.off_streak < self.probe_interval
                self._probing = not off
                if off:  # free drafts, if the plan took any, are this step's only drafts
                    self._choose_free(req_ids, plan.depths, plan.free)
                    free_depths = [d if f else 0 for d, f in zip(plan.depths, plan.free or [False] * len(req_ids))]
        if self._probing and not off and lags is not None and req_ids:
            self.probe_only = req_ids[min(range(len(req_ids)), key=lags.__getitem__)]
        self.off_streak = self.off_streak + 1 if off else 0
        if not probe:  # a step off to re-measure plain decoding does not end a stretch of drafting
            self.stretches.step(not off, len(req_ids), started_by_plan=not self._probing, on_merits=on_merits)
        # The same batch, off again with nothing verified in between and no copy on offer, gets the same answer
        # without a new plan.
        self._off_batch = req_ids if off and not probe and not any(free_depths) else None
        if off:
            self._pending_passes, self._pending_empty = 0, True
            for rid in req_ids:
                self.idle[rid] = self.idle.get(rid, 0) + 1
            self.step.add_depths(free_depths)
        return off

    def tokens_ahead(self, req_ids: list[str], stretches: bool = True) -> float | None:
        """T of ``step_cost``: the tokens the requests are expected to emit from here, each request's
        ``OutputLengths.ahead`` given its output so far and the most it may emit (its ``max_tokens``, or what
        its context leaves), with ``stretches`` at most the mean of the drafter's recent stretches on
        (``Stretches``). None when a request's state is unknown to the runner."""
        total = 0.0
        for rid in req_ids:
            request = self._runner.requests.get(rid)
            if request is None or request.sampling_params is None:
                return None
            n = len(request.output_token_ids)
            left = getattr(self._runner, "max_model_len", 1 << 30) - request.num_tokens
            if request.sampling_params.max_tokens is not None:
                left = min(left, request.sampling_params.max_tokens - n)
            total += self.output_lengths.ahead(n, n + left)
        stretch = self.stretches.mean() if stretches else None
        return total if stretch is None else min(total, stretch)

    def drafter_seen(self, first_positions: list[int]) -> None:
        """The batch rows' first query positions this step, before the drafter runs or is skipped. A request
        seen for the first time has the drafter KV vLLM has for it: none past its first query token (what
        came before was prefix-cached, KV of the drafter included, as stock vLLM assumes), so a skipped
        prefill is a backlog from there."""
        for rid, first in zip(self.request_ids(), first_positions):
            self.drafter_next.setdefault(rid, first)

    def drafter_lag(self, first_positions: list[int]) -> list[int]:
        """Per batch row: positions before the row's first query token the drafter has no KV for."""
        return [max(0, first - self.drafter_next[rid]) for rid, first in zip(self.request_ids(), first_positions)]

    def token_history(self, rows: list[int], positions: list[int]) -> torch.Tensor:
        """[n] token ids of batch row ``rows[j]`` at ``positions[j]`` (prompt and output alike)."""
        return torch.from_numpy(self._runner.input_batch.token_ids_cpu[rows, positions].astype("int64"))

    def drafter_caught_up(self, seq_lens: list[int]) -> None:
        """The drafter's first pass covered every row up to ``seq_lens`` and the next token after it, except
        the rows left ``behind``: their hole stays, less the chunk of it caught up, for a later pass."""
        for rid, seq in zip(self.request_ids(), seq_lens):
            if rid not in self.behind:
                self.drafter_next[rid] = seq + 1
            elif self.behind[rid] is not None:
                self.drafter_next[rid] = self.behind[rid]
        self.behind = {}

    def begin_step(self) -> None:
        """A new engine step starts: the last one's wall-clock, minus its target forward and drafter
        passes, is the step's fixed cost, of a step that verified drafts or of one that did not."""
        now = time.perf_counter()
        if self._step_started is not None:
            self.step_costs.observe_step(
                now - self._step_started, self._step_target_seconds, self._step_draft_seconds, self._step_verified
            )
        self._step_started, self._step_target_seconds, self._step_draft_seconds = now, 0.0, 0.0
        self._step_verified = False

    def observe_target(self, num_tokens: int, seconds: float) -> None:
        """The step's target forward over ``num_tokens`` query tokens took ``seconds``."""
        self.cost.observe(num_tokens, seconds)
        self.draft_cost.observe_target(seconds)
        self._step_target_seconds += seconds

    def observe_draft(
        self, seconds: float, passes: int, drafts: list[list[int]], first_rows: int, first_seconds: float
    ) -> None:
        """The step's drafter ran ``passes`` passes over ``len(drafts)`` requests in ``seconds``, the first of
        them over ``first_rows`` rows (accepted tokens, caught-up tokens, prompts) in ``first_seconds``; each
        pass is priced by its own rows (a first pass over a prompt says nothing of a pass over B rows)."""
        self.draft_cost.observe_draft(seconds, passes)
        self.step_costs.draft_pass.observe(first_rows, first_seconds)
        if passes > 1:
            self.step_costs.draft_pass.observe(len(drafts), (seconds - first_seconds) / (passes - 1))
        self._step_draft_seconds += seconds
        self.step.drafter_passes += passes
        self._pending_passes, self._pending_empty = passes, not any(drafts)

    def _random_shape(self, node_ceiling: int) -> TreeShape:
        rng, cfg = self._random_shapes, self.config
        depth = rng.randint(1, min(cfg.max_depth, cfg.max_nodes, node_ceiling))
        width = 1 if cfg.mode == "chain" else rng.randint(1, cfg.max_width)
        nodes = rng.randint(depth, min(cfg.max_nodes, node_ceiling, tree_capacity(depth, width)))
        return TreeShape(depth, width, nodes)

    def record_drafts(self, trees: DraftTrees, node_ceiling: int) -> list[list[int]]:
        """Each row's tree, with its free draft as one more branch where it has one (``FreeDrafts.add_branches``,
        at most ``node_ceiling`` nodes), remembered until vLLM schedules it; returns the flattened token lists."""
        counts = trees.num_nodes.tolist()
        tokens = [row[:n] for row, n in zip(trees.tokens.tolist(), counts)]
        parents = [row[:n] for row, n in zip(trees.parents.tolist(), counts)]
        req_ids = self.request_ids()
        if self.free_drafts is not None and self.planned:  # a pinned shape stays the drafter's, as in chain mode
            self.step.free_tokens += self.free_drafts.add_branches(req_ids, tokens, parents, node_ceiling)
        for rid, row_tokens, row_parents in zip(req_ids, tokens, parents):
            self.drafts[rid] = DraftRecord(row_tokens, row_parents)
        return tokens

    def scheduled_parents(self, req_id: str, scheduled: list[int]) -> list[int]:
        """Parents of the drafts vLLM scheduled for ``req_id``: a prefix of the recorded tree (the
        scheduler may cut drafts to its token budget, and a topological prefix is still a tree).
        Drafts we did not record (vLLM's zero drafts near max_model_len) are a chain."""
        record = self.drafts.pop(req_id, None)
        n = len(scheduled)
        if record is None or record.tokens[:n] != list(scheduled):
            return list(range(-1, n - 1))
        return record.parents[:n]

    @contextmanager
    def verifying(self, num_draft_tokens: list[int], trees: DraftTrees | None = None) -> Iterator[Verification]:
        """Expose the batch's verification inputs to the sampler, then feed back the outcome."""
        started = time.perf_counter()
        self._step_verified = True
        req_ids = self.request_ids()
        taus, allowances = [], []
        for rid in req_ids:
            request = self._runner.requests.get(rid)
            extra = getattr(getattr(request, "sampling_params", None), "extra_args", None)
            tau = request_tau(extra, self.config)
            taus.append(tau)
            allowances.append(self.policies[rid].promotion_allowance(tau))
        self.verification = Verification(
            tau=torch.tensor(taus, dtype=torch.float32),
            allowance=torch.tensor(allowances, dtype=torch.long),
            num_draft_tokens=list(num_draft_tokens),
            trees=trees,
        )
        self.charge(started)
        try:
            yield self.verification
            started = time.perf_counter()
            done = self.verification
            if done.num_accepted is not None:
                paths = done.accepted_paths()
                for row, (rid, drafted, depth, accepted, promoted) in enumerate(zip(
                    req_ids, done.num_draft_tokens, done.depths(), done.num_accepted, done.num_promoted
                )):  # fmt: skip
                    if not drafted:
                        continue
                    confidence = self.confidence.pop(rid, None)
                    nodes = list(range(accepted)) if paths is None else paths[row][:accepted]
                    copy = None if self.free_drafts is None else self.free_drafts.judged(rid, nodes)
                    if copy is not None and copy.drafter_nodes == 0:
                        self.policies[rid].observe_promotions(promoted)  # the lossy budget is the request's
                        continue  # a free draft: its source's estimates, not the drafter's
                    # The request's history: its whole draft (a tree's copy branch included); the drafter's
                    # confidence: whether the path's first node was the drafter's.
                    self.policies[rid].observe(depth, accepted, promoted)
                    self.pooled.observe(depth, accepted)
                    if confidence is not None:
                        self.calibration.observe(confidence, accepted >= 1 and (copy is None or nodes[0] < copy.drafter_nodes))
                self.step.promoted += sum(done.num_promoted)
                self.step.add_promotions(p for p, drafted in zip(done.num_promoted, done.num_draft_tokens) if drafted)
                if self.step_log is not None:
                    self.step_log.append({"drafted": list(done.num_draft_tokens), "accepted": list(done.num_accepted),
                                          "passes": self._pending_passes})
            self.step.overhead_seconds += done.overhead_seconds
            self.charge(started)
        finally:
            self.verification = None

    def record_plain_step(self, batch: int) -> None:
        """A step verified no draft: logged when the last propose drafted nothing (speculation off, with
        or without its first pass), not when the step was a prefill."""
        if self.step_log is not None and self._pending_empty:
            self.step_log.append({"drafted": [0] * batch, "accepted": [0] * batch, "passes": self._pending_passes})

    def take_step_log(self) -> dict:
        """The step records gathered since the last call, and the fitted step costs to price them with
        (``step_cost.StepCosts.snapshot``); empty when recording is off."""
        records = list(self.step_log or [])
        if self.step_log is not None:
            self.step_log.clear()
        return {"steps": records, "costs": self.step_costs.snapshot(), "mode": self.config.mode,
                "max_depth": self.config.max_depth}

    def charge(self, started: float) -> None:
        """Count the time since ``started`` (``time.perf_counter()``) as the plugin's own work."""
        self.step.overhead_seconds += time.perf_counter() - started

    def take_step_stats(self) -> StepStats:
        stats, self.step = self.step, StepStats()
        return stats

    def free(self, req_ids: Iterable[str]) -> None:
        """Forget finished and aborted requests (called before the runner drops them: their output lengths
        are read here)."""
        for rid in req_ids:
            request = self._runner.requests.get(rid)
            if request is not None:
                self.output_lengths.observe(len(request.output_token_ids))
            self.policies.free(rid)
            self.drafts.pop(rid, None)
            self.confidence.pop(rid, None)
            self.drafter_next.pop(rid, None)
            self.behind.pop(rid, None)
            self.idle.pop(rid, None)
            if self.free_drafts is not None:
                self.free_drafts.free(rid)
