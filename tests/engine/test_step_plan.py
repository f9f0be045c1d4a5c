"""When a step runs the drafter: AdaptiveState.drafter_off on a fake runner, with made-up step costs.

No engine is built: the state only reads the runner's batch (request ids) and its own measured costs.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_adaptivespec.config import AdaptiveSpecConfig
from vllm_adaptivespec.engine.state import HISTORY_PRIOR_WEIGHT, PROBE_BACKOFF, AdaptiveState
from vllm_adaptivespec.step_cost import StepCosts


def _state(batch: int, per_token: float, base: float, draft: float, **settings) -> AdaptiveState:
    """A state for ``batch`` requests whose target forward costs base + per_token * q (q query tokens)
    and whose drafter pass costs ``draft``, all seconds, already measured."""
    runner = SimpleNamespace(input_batch=SimpleNamespace(req_ids=[f"r{i}" for i in range(batch)]), requests={})
    state = AdaptiveState(AdaptiveSpecConfig(**{"max_depth": 4, **settings}), runner)
    costs = StepCosts(window=1, target=state.cost)
    for q in (1, 2, 4, 8, 16, 32, 64):
        costs.target.observe(q, base + per_token * q)
    costs.draft_pass.observe(batch, draft)
    costs.fixed = 0.0
    state.step_costs = costs
    return state


def _steps_with_drafter(state: AdaptiveState, steps: int, accepted: int = 0) -> list[int]:
    """Run ``steps`` drafter decisions; after each step that drafts, every request has its one-token
    draft judged (``accepted`` of 1). Returns the step numbers that ran the drafter."""
    ran = []
    for step in range(steps):
        if not state.drafter_off():
            ran.append(step)
            for rid in state.request_ids():
                state.policies[rid].observe(1, accepted, 0)
                state.pooled.observe(1, accepted)
    return ran


def test_speculation_that_cannot_pay_never_runs_the_drafter():
    # Compute bound (a forward costs what its tokens cost) and a drafter pass as dear as a target forward
    # of the batch: even a drafter that is never wrong loses, so no probe is ever made.
    state = _state(batch=8, per_token=0.01, base=0.0, draft=0.08)
    assert _steps_with_drafter(state, 2000) == []
    assert state.off_streak == 2000


def test_probes_back_off_while_they_find_nothing():
    # Verification nearly free and a cheap drafter: speculation would pay if the drafter agreed, but it
    # never does. Probes come after 16, then 32, 64, ... steps off, up to probe_every * PROBE_BACKOFF.
    state = _state(batch=1, per_token=0.0005, base=0.05, draft=0.01, prior_acceptance=0.0)
    ran = _steps_with_drafter(state, 3000)
    gaps = [b - a - 1 for a, b in zip([-1, *ran], ran)]
    cap = 16 * PROBE_BACKOFF
    assert gaps[:5] == [16, 32, 64, 128, 256]
    assert all(gap == cap for gap in gaps[5:]) and len(gaps) > 6


def test_a_probe_that_finds_agreement_turns_speculation_on_and_resets_the_interval():
    # A drafter pass a tenth of a forward: one agreeing probe is clearly worth drafting for (beyond
    # ``MIN_GAIN_OVER_PLAIN``), not a borderline call.
    state = _state(batch=1, per_token=0.0005, base=0.05, draft=0.005, prior_acceptance=0.0)
    ran = _steps_with_drafter(state, 200)
    assert state.probe_interval > 16 and ran
    # From now on the drafter is always right: the next probe turns speculation on for good.
    ran = _steps_with_drafter(state, 400, accepted=1)
    assert ran and ran[-1] == 399 and len(ran) >= 400 - state.config.probe_every * PROBE_BACKOFF
    assert state.probe_interval == 16


def test_a_probe_looks_at_the_request_with_the_smallest_backlog_only():
    # As in the back-off test, at batch 3: the drafter never agrees. A probe catches up and drafts one
    # request, the one owing the fewest tokens (its catch-up is what looking costs); the other two stay
    # behind and draft nothing. Steps off run no pass and choose no request.
    state = _state(batch=3, per_token=0.0005, base=0.05, draft=0.01, prior_acceptance=0.0)
    lags = [[40 + step, 9 + step, 300 + step] for step in range(200)]
    probes = []
    for step, lag in enumerate(lags):
        if state.drafter_off(rows=3 + sum(lag), lags=lag):
            assert state.probe_only is None
            continue
        probes.append(step)
        assert state.probe_only == "r1"
        assert [state._must_probe(rid) for rid in state.request_ids()] == [False, True, False]
        state.policies["r1"].observe(1, 0, 0)
        state.pooled.observe(1, 0)
    assert probes[:3] == [16, 49, 114]  # after 16, 32 and 64 steps off, as with the whole batch
    # Without backlogs to compare (an EAGLE head never skips, so it never asks) every due request drafts.
    state = _state(batch=2, per_token=0.0005, base=0.05, draft=0.01, prior_acceptance=0.0)
    assert [state.drafter_off() for _ in range(17)] == [True] * 16 + [False]
    assert state.probe_only is None and all(state._must_probe(rid) for rid in state.request_ids())


def test_a_new_request_starts_from_the_pooled_acceptance_and_its_own_history_is_shrunk_toward_it():
    state = _state(batch=2, per_token=0.0005, base=0.05, draft=0.01)
    for _ in range(10):
        state.pooled.observe(3, 0)  # every recent draft was rejected at once
    state.policies["r0"].observe(3, 3, 0)  # r0 has its own history: 3 judged positions, all accepted
    w = HISTORY_PRIOR_WEIGHT
    assert state.acceptance_estimates(["r0", "r1"]) == pytest.approx([3 / (3 + w), 0.0])
    for _ in range(30):
        state.policies["r0"].observe(3, 3, 0)
    assert state.acceptance_estimates(["r0"])[0] > 0.9  # a long history of its own outweighs the pool
    # One rejected first token does not make a request's drafter look hopeless where the pool is good.
    for _ in range(30):
        state.pooled.observe(3, 3)
    pooled = state.pooled.rate()
    assert pooled > 0.85
    state.policies["r1"].observe(3, 0, 0)
    assert state.acceptance_estimates(["r1"]) == pytest.approx([w * pooled / (1 + w)])
    assert state.acceptance_estimates(["r1"])[0] > 0.65


def test_before_the_first_pass_a_confidence_counts_at_its_calibrated_expectation():
    # The drafter's first token was accepted 1 time in 4 so far, whatever its confidence said: before the
    # first pass (no confidence yet) the fused estimate takes that in place of cal(c_i), as the plan after
    # the pass will most likely see it; with no judged first token, history alone.
    state = _state(batch=2, per_token=0.0005, base=0.05, draft=0.01, confidence_weight=0.5)
    state.policies["r0"].observe(4, 4, 0)
    state.policies["r1"].observe(4, 0, 0)
    w, prior = HISTORY_PRIOR_WEIGHT, state.config.prior_acceptance  # no pooled acceptance yet: the prior
    a0, a1 = (4 + w * prior) / (4 + w), w * prior / (1 + w)  # histories shrunk toward it (``_history``)
    assert state.acceptance_estimates(["r0", "r1"]) == pytest.approx([a0, a1])
    for accepted in (True, False, False, False):
        state.calibration.observe(0.95, accepted)
    assert state.calibration.mean() == 0.25
    assert state.acceptance_estimates(["r0", "r1"]) == pytest.approx([0.125 + 0.5 * a0, 0.125 + 0.5 * a1])
    # After the pass each request's own confidence is read through the calibration, as before.
    c = state.calibration(0.95)
    assert state.acceptance_estimates(["r0", "r1"], [0.95, 0.95]) == pytest.approx([0.5 * c + 0.5 * a0,
                                                                                    0.5 * c + 0.5 * a1])


def _chain_step(state: AdaptiveState, confidences: list[list[float]]) -> tuple[list[int], int]:
    """Draft one chain step: the first pass's confidences choose the shapes, each later pass's go to
    ``continue_chains`` until it stops. Returns (chain lengths, drafter passes run)."""
    shapes = state.choose_shapes(torch.tensor(confidences[0]), 8)
    if state.chain_step is None:
        return [shape.depth for shape in shapes], 1
    for passes, confidence in enumerate(confidences[1:], start=2):
        lengths = state.continue_chains(confidence)
        if lengths is not None:
            return lengths, passes
    raise AssertionError("drafting did not stop by the last pass given")


def test_a_chain_step_stops_at_a_doubted_token_and_goes_on_while_the_drafter_is_sure():
    # Batch 1, verification nearly free, a drafter pass a fifth of a step; the request's history and the
    # drafter's calibration say a sure token is accepted 90% of the time.
    def state():
        s = _state(batch=1, per_token=0.0005, base=0.05, draft=0.01, max_depth=8, confidence_weight=0.5)
        s.policies["r0"].observe(10, 9, 0)
        for accepted in [True] * 9 + [False]:
            s.calibration.observe(0.97, accepted)
        return s

    first = state().choose_shapes(torch.tensor([0.8]), 8)[0].depth  # a less sure first token
    assert 2 <= first < 8
    lengths, passes = _chain_step(state(), [[0.8], [0.05], [0.97], [0.97]])
    assert passes == 2 and lengths[0] <= 2  # no third pass after the doubted second token
    lengths, passes = _chain_step(state(), [[0.8]] + [[0.97]] * 7)
    assert passes > first and lengths == [passes]  # surer tokens after it: past the first plan
    assert state().step.depth_counts == []  # nothing recorded before a step stops
    s = state()
    _chain_step(s, [[0.97], [0.05], [0.97]])
    assert sum(s.step.depth_counts) == 1  # one request's depth, recorded once


def test_a_re_planned_chain_keeps_min_depth():
    s = _state(batch=1, per_token=0.0005, base=0.05, draft=0.01, max_depth=8, min_depth=3)
    s.policies["r0"].observe(10, 9, 0)
    lengths, passes = _chain_step(s, [[0.97], [0.01], [0.01], [0.01]])
    assert passes == 3 and lengths == [3]


def test_the_drafter_lags_from_where_it_first_saw_a_request():
    state = _state(batch=2, per_token=0.0005, base=0.05, draft=0.01)
    state.drafter_seen([30, 0])  # r0 came with 30 prefix-cached tokens, r1 with none
    state.drafter_seen([38, 20])  # seen again later: nothing changes
    assert state.drafter_lag([40, 25]) == [10, 25]
    state.behind = {"r1": None}  # nothing of r1's backlog was caught up
    state.drafter_caught_up([41, 26])
    assert state.drafter_next == {"r0": 42, "r1": 0} and state.behind == {}
    state.behind = {"r1": 12}  # a chunk of it was: positions 0..11
    state.drafter_caught_up([42, 12])
    assert state.drafter_next == {"r0": 43, "r1": 12}


def _free_state(batch: int, draft: float, **settings) -> AdaptiveState:
    """A state whose requests' token tables repeat "1 2 3 4 5 6" (a copy to be made), with a prompt of 6."""
    state = _state(batch=batch, per_token=0.0005, base=0.05, draft=draft, **settings)
    table = np.array([[1, 2, 3, 4, 5, 6] * 4] * batch, dtype=np.int32)
    state._runner.input_batch.token_ids_cpu = table
    state._runner.requests = {rid: SimpleNamespace(num_prompt_tokens=6, output_token_ids=[]) for rid in state.request_ids()}
    return state


def _offer(state: AdaptiveState, k: int = 4) -> None:
    # Every request's query token is 2 at position 13 and the token just sampled is 3, so its history is
    # 1 2 3 4 5 6 1 2 3 4 5 6 1 2 3: its last 4 tokens "6 1 2 3" occurred before, followed by "4 5 6 1".
    batch = len(state.request_ids())
    state.offer_free_drafts([13] * batch, [[2]] * batch, [3] * batch, k)


def test_free_drafts_alone_run_no_drafter_pass_and_feed_their_own_estimates():
    # A drafter pass as dear as a target forward: only copies pay, so the step drafts them without the drafter.
    state = _free_state(batch=2, draft=0.05)
    _offer(state)
    assert state.free_drafts.offers["r0"] == ([4, 5, 6, 1], 4)
    assert state.drafter_off()
    drafts = state.with_free_drafts([[], []])
    assert drafts == [[4, 5, 6, 1], [4, 5, 6, 1]] and state.step.free_tokens == 8
    with state.verifying([4, 4]) as verification:
        verification.num_accepted, verification.num_promoted = [4, 1], [0, 0]
    copies = state.free_drafts
    # Both first tokens held; after them r0's copy ran to its end (3 of 3), r1's failed at once (0 of 1 judged).
    assert copies.first["r0"].acceptance_rate == copies.first["r1"].acceptance_rate == 1.0
    assert copies.continued["r0"].acceptance_rate == 1.0 and copies.continued["r1"].acceptance_rate == 0.0
    assert state.policies["r0"].judged == 0  # the drafter's history is not touched by copies
    assert copies.pooled_first.rate() == 1.0 and copies.pooled_continued.rate() == 3 / 4
    # The next estimates, every rate shrunk with 8 prior positions: the pools toward prior_acceptance (0.6), f from
    # the match length's calibration and the first-token history (each shrunk toward the first-token pool), c
    # toward the continuation pool: r0 (3 judged at 1.0) above r1 (1 judged at 0.0).
    _offer(state)
    (n0, f0, c0), (n1, f1, c1) = copies.estimates(["r0", "r1"])
    pool_first, pool_continued = (2 * 1.0 + 8 * 0.6) / 10, (4 * 0.75 + 8 * 0.6) / 12
    w = state.config.confidence_weight
    assert n0 == n1 == 4
    assert f0 == f1 == pytest.approx(w * (2 + 8 * pool_first) / 10 + (1 - w) * (1 * 1.0 + 8 * pool_first) / 9)
    assert c0 == pytest.approx((3 * 1.0 + 8 * pool_continued) / 11)
    assert c1 == pytest.approx((1 * 0.0 + 8 * pool_continued) / 9)


def test_one_rejected_copy_does_not_rule_out_every_later_copy():
    # The run's first copy is rejected at its first token. Unshrunk, that set the pooled and the request's
    # first-token rates to 0: f = 0 for every later copy of every request, so none was chosen or judged again.
    # Shrunk, one rejection moves each rate by 1/9 of the way, and with a drafter as dear as a forward the
    # next step still drafts the copies.
    state = _free_state(batch=2, draft=0.05)
    _offer(state)
    assert state.drafter_off()
    assert state.with_free_drafts([[], []]) == [[4, 5, 6, 1]] * 2
    with state.verifying([4, 4]) as verification:
        verification.num_accepted, verification.num_promoted = [0, 0], [0, 0]
    copies = state.free_drafts
    assert copies.pooled_first.rate() == 0.0 and copies.first["r0"].acceptance_rate == 0.0
    _offer(state)
    pool_first = (2 * 0.0 + 8 * 0.6) / 10
    (_, f0, _), _ = copies.estimates(["r0", "r1"])
    w = state.config.confidence_weight
    assert f0 == pytest.approx(w * (0 + 8 * pool_first) / 10 + (1 - w) * (1 * 0.0 + 8 * pool_first) / 9)
    assert state.drafter_off()
    assert state.with_free_drafts([[], []]) == [[4, 5, 6, 1]] * 2


def test_no_probe_runs_beside_copies_that_even_a_never_wrong_drafter_could_not_beat():
    # The back-off test's costs, where a probe would be due every 16 steps off: while the request's whole
    # 4-token copy is accepted every step, a drafter that was never wrong could add nothing but its passes,
    # so none runs; once the copies stop, the probes come back.
    state = _free_state(batch=1, draft=0.01, prior_acceptance=0.0)
    for _ in range(8):  # earlier requests' copies held: the pooled rates a new request's copy starts from
        state.free_drafts.pooled_first.observe(1, 1)
        state.free_drafts.pooled_continued.observe(3, 3)
    for _ in range(100):
        _offer(state)
        assert state.drafter_off()
        assert state.with_free_drafts([[]]) == [[4, 5, 6, 1]]
        with state.verifying([4]) as verification:
            verification.num_accepted, verification.num_promoted = [4], [0]
    state._runner.input_batch.token_ids_cpu[:] = np.arange(100, 124)  # nothing repeats: no copy on offer
    offs = []
    for _ in range(40):
        _offer(state)
        assert state.free_drafts.offers["r0"][0] == []
        offs.append(state.drafter_off())
        if not offs[-1]:
            state.policies["r0"].observe(1, 0, 0)
            state.pooled.observe(1, 0)
    assert not all(offs)


def test_in_tree_mode_a_copy_is_one_more_branch_and_is_judged_on_its_own_path():
    import torch

    from vllm_adaptivespec.tree import DraftTrees

    state = _free_state(batch=2, draft=0.05, mode="tree")
    _offer(state)  # both copies: 4 5 6 1
    drafter = DraftTrees.from_parents([[4, 9], [7]], [[-1, 0], [-1]])  # r0's drafter drafted 4 too
    state.confidence = {"r0": 0.9, "r1": 0.9}
    drafts = state.record_drafts(drafter, node_ceiling=6)
    # r0: 4 is the drafter's node 0, then 5 6 1 below it; r1: the copy beside the drafter's 7.
    assert drafts == [[4, 9, 5, 6, 1], [7, 4, 5, 6, 1]] and state.step.free_tokens == 3 + 4
    assert state.drafts["r0"].parents == [-1, 0, 0, 2, 3] and state.drafts["r1"].parents == [-1, -1, 1, 2, 3]
    trees = DraftTrees.from_parents(drafts, [state.drafts["r0"].parents, state.drafts["r1"].parents])
    with state.verifying([5, 5], trees) as verification:
        # r0 accepted 4 5 6 (the copy's first three), r1 the copy's 4 (not the drafter's 7).
        verification.num_accepted, verification.num_promoted = [3, 1], [0, 0]
        verification.accepted_nodes = torch.tensor([[0, 2, 3, -1], [1, -1, -1, -1]])
    copies = state.free_drafts
    assert copies.first["r0"].acceptance_rate == copies.first["r1"].acceptance_rate == 1.0
    assert copies.continued["r0"].acceptance_rate == 2 / 3 and copies.continued["r1"].acceptance_rate == 0.0
    assert state.policies["r0"].judged == 4 and state.policies["r1"].judged == 2  # the whole tree, depth 4
    # The drafter's confidence was worth its first node for r0 only (r1's path began on the copy).
    assert state.calibration.judged.sum() == 2 and state.calibration.accepted.sum() == 1


def test_in_tree_mode_a_request_drafted_from_its_copy_alone_gets_no_drafter_nodes():
    import torch

    from vllm_adaptivespec.tree import DraftTrees

    # A drafter pass as dear as a target forward: the plan drafts both requests from their copies.
    state = _free_state(batch=2, draft=0.05, mode="tree")
    _offer(state)
    shapes = state.choose_shapes(torch.tensor([0.5, 0.5]), node_ceiling=8)
    assert [shape.depth for shape in shapes] == [0, 0]
    empty = DraftTrees.from_parents([[], []], [[], []])
    drafts = state.record_drafts(empty, node_ceiling=8)
    assert drafts == [[4, 5, 6, 1], [4, 5, 6, 1]] and state.drafts["r0"].parents == [-1, 0, 1, 2]
    with state.verifying([4, 4]) as verification:  # chains: no tree objects
        verification.num_accepted, verification.num_promoted = [2, 4], [0, 0]
    assert state.free_drafts.continued["r0"].acceptance_rate == 1 / 2  # 4 5 6 1 copied: 4 and 5 held, 6 did not
    assert state.policies["r0"].judged == 0  # the drafter's history is not touched by copies


def test_without_free_drafts_a_row_is_judged_as_the_drafters():
    state = _free_state(batch=1, draft=0.05, free_drafter="off")
    assert state.free_drafts is None
    _offer(state)  # nothing to offer: no free source
    assert state.with_free_drafts([[7]]) == [[7]] and state.step.free_tokens == 0
    with state.verifying([1]) as verification:
        verification.num_accepted, verification.num_promoted = [1], [0]
    assert state.policies["r0"].judged == 1


def test_the_suffix_source_drafts_from_the_request_and_from_earlier_responses():
    pytest.importorskip("arctic_inference.suffix_decoding", reason="arctic-inference is optional (scripts/setup.sh)")
    state = _free_state(batch=2, draft=0.05, free_drafter="suffix")
    _offer(state)
    tokens, match = state.free_drafts.offers["r0"]
    assert tokens[:2] == [4, 5] and match >= 4  # what followed "... 1 2 3" in the request's own text
    source = state.free_drafts.source
    assert source.cache.active_requests == {"r0", "r1"}
    state.free(["r0"])  # finished: no longer active, its response stays cached for later requests
    assert source.cache.active_requests == {"r1"} and "r0" in source.cache.cached_requests


def test_a_batch_that_drafts_re_measures_plain_decoding_when_its_reading_goes_stale():
    # A cheap drafter that is always right: the batch drafts every step, so plain decoding's forward
    # (B = 8 query tokens) is never run; once that reading is stale, one step decodes plainly to read it
    # again, and then the batch drafts again. The probe is the only off step, once per stale reading.
    state = _state(batch=8, per_token=0.0005, base=0.05, draft=0.01)
    stale = state.cost.stale_after
    ran, off_steps = 0, []
    for step in range(3 * stale):
        if state.drafter_off():
            off_steps.append(step)
            state.cost.observe(8, 0.054)  # the probe's forward: plain decoding's bucket is read
        else:
            ran += 1
            state.cost.observe(8 * 5, 0.07)  # a deep step's forward
            for rid in state.request_ids():
                state.policies[rid].observe(4, 4, 0)
    assert len(off_steps) == 2 and ran == 3 * stale - 2
    assert off_steps[1] - off_steps[0] == stale + 2  # the probe, stale_after + 1 forwards, then the next probe
    assert state.off_streak == 0


def _with_requests(state: AdaptiveState, outputs: int, max_tokens: int, prompt: int = 100) -> None:
    """Give every request of the fake runner ``outputs`` tokens of output so far out of ``max_tokens``."""
    state._runner.max_model_len = 4096
    state._runner.requests = {
        rid: SimpleNamespace(output_token_ids=[7] * outputs, num_tokens=prompt + outputs,
                             sampling_params=SimpleNamespace(max_tokens=max_tokens))
        for rid in state.request_ids()
    }  # fmt: skip


def test_a_backlog_is_caught_up_only_when_the_tokens_ahead_repay_it():
    # A drafter pass over the batch a fifth of a forward (0.01 s over 8 rows, 1.28 s over 1,024); the drafter
    # is right 90% of the time: a drafting step pays (298 tok/s against 148 plain: 3.4 ms saved a token), and
    # a catch-up over 1,000 rows (1.24 s more than a pass over the batch) needs some 370 tokens to repay.
    state = _state(batch=8, per_token=0.0005, base=0.05, draft=0.01, prior_acceptance=0.9)
    state.step_costs.draft_pass.observe(1024, 1.28)
    _with_requests(state, outputs=10, max_tokens=2000)
    assert not state.drafter_off(rows=8)  # a drafting batch owes the last step's tokens only
    assert not state.drafter_off(rows=1000)  # 1,000 rows owed, 15,920 tokens ahead
    state._runner.input_batch.req_ids = list(state.request_ids())  # a fresh plan (not the same off batch)
    _with_requests(state, outputs=1990, max_tokens=2000)  # 80 tokens ahead: the catch-up cannot be repaid
    assert state.drafter_off(rows=1000)
    # Not even a never-wrong drafter repays it: no probe while this batch stays (its backlog only grows).
    assert all(state.drafter_off(rows=1000 + 8 * k) for k in range(1, 100))


def test_finished_requests_teach_how_many_tokens_a_request_has_ahead():
    state = _state(batch=2, per_token=0.0005, base=0.05, draft=0.01)
    _with_requests(state, outputs=0, max_tokens=500)
    assert state.tokens_ahead(state.request_ids()) == 1000  # nothing finished yet: max_tokens each
    state._runner.requests["r0"].output_token_ids = [7] * 40
    state.free(["r0"])  # r0 finished after 40 tokens
    del state._runner.requests["r0"]  # as the runner drops it after the hook
    assert state.tokens_ahead(["r1"]) == 40  # r1 has 0: the finished ones ran 40 more
    state._runner.requests["r1"].output_token_ids = [7] * 60
    assert state.tokens_ahead(["r1"]) == 440  # past every finished length: what max_tokens leaves
    assert state.tokens_ahead(["r0", "r1"]) is None  # the runner does not know r0 any more


def test_the_catch_up_repays_over_no_more_than_the_drafters_recent_stretches_on():
    # As in the backlog test: 1,000 rows owed needs some 370 tokens of drafting to repay. With 15,920 tokens
    # ahead the plan turns the drafter on; it stays on 5 steps (40 tokens) and the plan turns it off. The
    # next turn-on is priced over 40 tokens, not 15,920: the backlog stays uncaught.
    state = _state(batch=8, per_token=0.0005, base=0.05, draft=0.01, prior_acceptance=0.9)
    state.stretches.min_stretches = 1  # one stretch is an estimate here (``Stretches`` waits for three)
    state.step_costs.draft_pass.observe(1024, 1.28)
    _with_requests(state, outputs=10, max_tokens=2000)
    assert not state.drafter_off(rows=1000)
    for _ in range(4):
        assert not state.drafter_off(rows=8)
    for rid in state.request_ids():  # the drafter turns out wrong: every estimate falls, the plan turns it off
        state.policies[rid].observe(4, 0, 0)
    state.pooled.observe(4, 0)
    assert state.drafter_off(rows=8)
    assert state.stretches.mean() == 40 and state.tokens_ahead(state.request_ids()) == 40
    off = 1
    while state.drafter_off(rows=8):  # off until the batch is due a probe
        off += 1
    assert off == state.config.probe_every
    for rid in state.request_ids():  # the probe finds the drafter right again
        state.policies[rid].observe(4, 4, 0)
    assert not state.drafter_off(rows=8)  # with nothing owed, drafting pays
    assert state.drafter_off(rows=1000)  # but 1,000 rows owed cannot be repaid over 40 tokens
