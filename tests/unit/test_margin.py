"""Verification: strict matching at tau = 1, brute-force agreement, distribution preservation,
and the margin rule's ratio test."""

from __future__ import annotations

import math
import random

import pytest
import torch
from core_reference import chi_square_pvalue, greedy_reference, node_path, random_tree, sampled_reference
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_adaptivespec import margin
from vllm_adaptivespec.margin import VerifyResult, verify_greedy, verify_sampled
from vllm_adaptivespec.policy import TreeShape
from vllm_adaptivespec.tree import DraftTrees, TreeBuilder

VOCAB = 5
FAST = settings(max_examples=150, deadline=None, derandomize=True)


@st.composite
def batches(draw, max_batch=4, max_nodes=7, integer_logits=True):
    """A padded batch of random trees over a small vocabulary, with target logits for every row."""
    batch = draw(st.integers(1, max_batch))
    tokens, parents = [], []
    for _ in range(batch):
        n = draw(st.integers(0, max_nodes))
        parents.append([draw(st.integers(-1, i - 1)) for i in range(n)])
        tokens.append([draw(st.integers(0, VOCAB - 1)) for _ in range(n)])
    trees = DraftTrees.from_parents(tokens, parents)
    rows = trees.num_slots + 1
    if integer_logits:  # small integers: many exact ties between tokens
        values = draw(st.lists(st.integers(-3, 3), min_size=batch * rows * VOCAB, max_size=batch * rows * VOCAB))
        logits = torch.tensor(values, dtype=torch.float32).reshape(batch, rows, VOCAB)
    else:
        seed = draw(st.integers(0, 2**31 - 1))
        logits = torch.randn(batch, rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 2
    return tokens, parents, trees, logits


def strict_match_chain(tokens, logits_rows):
    """Greedy decoding's answer for one drafted chain: the matching prefix, then the target's argmax."""
    out = []
    for i, token in enumerate(tokens):
        top = int(torch.argmax(logits_rows[i]))
        if token != top:
            return out + [top]
        out.append(token)
    return out + [int(torch.argmax(logits_rows[len(tokens)]))]


# --- greedy, tau = 1 -------------------------------------------------------------------------


@FAST
@given(st.data())
def test_greedy_tau_one_is_strict_matching_on_chains(data):
    batch = data.draw(st.integers(1, 4))
    length = data.draw(st.integers(0, 6))
    lengths = [data.draw(st.integers(0, length)) for _ in range(batch)]
    values = data.draw(
        st.lists(st.integers(-2, 2), min_size=batch * (length + 1) * VOCAB, max_size=batch * (length + 1) * VOCAB)
    )
    logits = torch.tensor(values, dtype=torch.float32).reshape(batch, length + 1, VOCAB)
    chains = torch.tensor(
        [[data.draw(st.integers(0, VOCAB - 1)) for _ in range(length)] for _ in range(batch)], dtype=torch.long
    ).reshape(batch, length)
    trees = DraftTrees.chain(chains, torch.tensor(lengths))
    allowance = torch.tensor([data.draw(st.integers(0, 3)) for _ in range(batch)])
    result = verify_greedy(logits, trees, tau=1.0, promotion_allowance=allowance)
    for b in range(batch):
        want = strict_match_chain(chains[b, : lengths[b]].tolist(), logits[b])
        got = result.output_tokens()[b]
        assert got[: len(want)].tolist() == want
        assert (got[len(want) :] == -1).all()
    assert (result.num_promoted == 0).all()


@FAST
@given(batches())
def test_greedy_tau_one_never_promotes_and_equals_zero_allowance(sample):
    tokens, parents, trees, logits = sample
    strict = verify_greedy(logits, trees, tau=1.0, promotion_allowance=torch.full((trees.batch_size,), 5))
    off = verify_greedy(logits, trees, tau=0.5, promotion_allowance=torch.zeros(trees.batch_size, dtype=torch.long))
    assert torch.equal(strict.output_tokens(), off.output_tokens())
    assert torch.equal(strict.accepted_nodes, off.accepted_nodes)
    assert (strict.num_promoted == 0).all() and not strict.promoted.any()
    top = logits.argmax(-1)
    for b in range(trees.batch_size):
        for k in range(int(strict.num_accepted[b])):
            node = int(strict.accepted_nodes[b, k])
            assert tokens[b][node] == int(top[b, parents[b][node] + 1])


def test_exact_tie_is_not_promoted_at_tau_one():
    logits = torch.tensor([[[0.0, 3.0, 3.0, 1.0], [5.0, 0.0, 0.0, 0.0]]])  # tokens 1 and 2 tie at the top
    trees = DraftTrees.chain(torch.tensor([[2]]))
    strict = verify_greedy(logits, trees, tau=1.0, promotion_allowance=torch.tensor([4]))
    assert strict.output_tokens().tolist() == [[1, -1]]  # argmax takes the first of the tie
    lossy = verify_greedy(logits, trees, tau=0.99, promotion_allowance=torch.tensor([4]))
    assert lossy.output_tokens().tolist() == [[2, 0]] and lossy.num_promoted.tolist() == [1]


# --- greedy vs brute force -------------------------------------------------------------------


def test_greedy_tree_verification_matches_brute_force_on_10000_trees():
    rng = random.Random(1234)
    checked = 0
    for round_index in range(20):
        batch = 500
        # Mostly bushy trees (the argmax runs on parent rows only); every 4th round long chains
        # (nearly every row is a parent row, so the argmax runs on all rows).
        sample = [random_tree(rng, 7, VOCAB) for _ in range(batch)]
        if round_index % 4 == 3:
            sample = [(tokens, list(range(-1, len(tokens) - 1))) for tokens in
                      ([rng.randrange(VOCAB) for _ in range(rng.randint(5, 7))] for _ in range(batch))]
        trees = DraftTrees.from_parents([s[0] for s in sample], [s[1] for s in sample])
        rows = trees.num_slots + 1
        gen = torch.Generator().manual_seed(round_index)
        logits = torch.randint(-3, 4, (batch, rows, VOCAB), generator=gen).float()
        if round_index % 2:  # break the integer ties in half of the rounds
            logits = logits + 0.3 * torch.rand(batch, rows, VOCAB, generator=gen)
        taus = torch.tensor([rng.choice([1.0, 0.9, 0.5, 0.3, 0.1]) for _ in range(batch)])
        allowance = torch.tensor([rng.randint(0, 3) for _ in range(batch)])
        if round_index == 0:
            taus.fill_(1.0)  # one all-lossless batch: the score-free tie rule
        result = verify_greedy(logits, trees, tau=taus, promotion_allowance=allowance)
        use_score = bool(((taus < 1) & (allowance > 0)).any())
        for b, (tokens, parents) in enumerate(sample):
            n = len(tokens)
            best_len, cands, top = greedy_reference(
                logits[b, : n + 1], tokens, parents, float(taus[b]), int(allowance[b]), use_score
            )
            assert int(result.num_accepted[b]) == best_len
            if best_len == 0:
                end = -1
                assert int(result.num_promoted[b]) == 0
            else:
                end = int(result.accepted_nodes[b, best_len - 1])
                assert end in cands
                if use_score:
                    assert cands[end][1] >= max(v[1] for v in cands.values()) - 1e-5
                else:
                    assert end == min(cands)
                assert result.accepted_nodes[b, :best_len].tolist() == node_path(parents, end)
                assert int(result.num_promoted[b]) == cands[end][2]
            assert (result.accepted_nodes[b, best_len:] == -1).all()
            assert int(result.next_token[b]) == top[end + 1]
            checked += 1
    assert checked == 10_000


# --- sampled vs the sequential walk ----------------------------------------------------------


def random_probs(batch, rows, gen):
    probs = (torch.randn(batch, rows, VOCAB, generator=gen) * 1.5).softmax(-1)
    zeros = torch.rand(batch, rows, VOCAB, generator=gen) < 0.15
    probs = probs.masked_fill(zeros, 0.0)
    probs[..., 0] += 1e-3  # never an all-zero row
    return probs / probs.sum(-1, keepdim=True)


def test_sampled_tree_verification_matches_sequential_walk():
    rng = random.Random(99)
    checked = skipped = 0
    for round_index in range(10):
        batch = 400
        sample = [random_tree(rng, 7, VOCAB) for _ in range(batch)]
        trees = DraftTrees.from_parents([s[0] for s in sample], [s[1] for s in sample])
        gen = torch.Generator().manual_seed(round_index)
        probs = random_probs(batch, trees.num_slots + 1, gen)
        uniforms = torch.rand(batch, trees.num_slots, generator=gen)
        taus = torch.tensor([rng.choice([1.0, 0.8, 0.5, 0.2]) for _ in range(batch)])
        allowance = torch.tensor([rng.randint(0, 2) for _ in range(batch)])
        result = verify_sampled(probs, trees, tau=taus, promotion_allowance=allowance, generator=gen, uniforms=uniforms)
        for b, (tokens, parents) in enumerate(sample):
            n = len(tokens)
            path, promoted, residual, near = sampled_reference(
                probs[b, : n + 1], tokens, parents, float(taus[b]), int(allowance[b]), uniforms[b].tolist()
            )
            if near:
                skipped += 1
                continue
            k = len(path)
            assert result.accepted_nodes[b, :k].tolist() == path
            assert int(result.num_accepted[b]) == k
            assert result.promoted[b, :k].tolist() == promoted
            assert int(result.num_promoted[b]) == sum(promoted)
            assert float(residual[int(result.next_token[b])]) > 0
            checked += 1
    assert skipped < checked / 100


def test_sampled_chain_with_draft_probs_matches_sequential_walk():
    rng = random.Random(7)
    gen = torch.Generator().manual_seed(7)
    batch, length = 300, 4
    draft = random_probs(batch, length, gen)
    chains = torch.multinomial(draft.reshape(-1, VOCAB), 1, generator=gen).reshape(batch, length)
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    trees = DraftTrees.chain(chains, lengths)
    probs = random_probs(batch, length + 1, gen)
    uniforms = torch.rand(batch, length, generator=gen)
    taus = torch.tensor([rng.choice([1.0, 0.5]) for _ in range(batch)])
    allowance = torch.tensor([rng.randint(0, 2) for _ in range(batch)])
    result = verify_sampled(probs, trees, taus, allowance, gen, draft_probs=draft, uniforms=uniforms)
    for b in range(batch):
        n = int(lengths[b])
        path, promoted, residual, near = sampled_reference(
            probs[b, : n + 1], chains[b, :n].tolist(), list(range(-1, n - 1)), float(taus[b]), int(allowance[b]),
            uniforms[b].tolist(), draft_probs=draft[b],
        )
        if near:
            continue
        assert result.accepted_nodes[b, : len(path)].tolist() == path
        assert result.promoted[b, : len(path)].tolist() == promoted
        assert float(residual[int(result.next_token[b])]) > 0


def test_draft_probs_reject_trees():
    trees = DraftTrees.from_parents([[1, 2]], [[-1, -1]])
    with pytest.raises(ValueError, match="chains only"):
        verify_sampled(torch.full((1, 3, 4), 0.25), trees, draft_probs=torch.full((1, 2, 4), 0.25))


# --- distribution preservation (seeded statistical test) -------------------------------------

STAT_VOCAB, STAT_LENGTH, STAT_RUNS = 4, 3, 20_000


def _markov(seed):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(STAT_VOCAB, STAT_VOCAB, generator=gen) * 1.2).softmax(-1)


TARGET, DRAFTER = _markov(11), _markov(12)


def _emitted_prefixes(verify, shape, seed=0, stochastic_chain=False):
    """Decode STAT_RUNS sequences from token 0 with a Markov target and drafter; count the first
    STAT_LENGTH emitted tokens. ``verify(probs, trees, draft_probs, generator)`` -> VerifyResult."""
    gen = torch.Generator().manual_seed(seed)
    runs = STAT_RUNS
    last = torch.zeros(runs, dtype=torch.long)
    emitted = torch.zeros(runs, dtype=torch.long)
    out = torch.full((runs, STAT_LENGTH + shape.depth + 1), -1, dtype=torch.long)
    while bool((emitted < STAT_LENGTH).any()):
        draft_probs = None
        if stochastic_chain:
            tokens, rows, previous = [], [], last
            for _ in range(shape.depth):
                q = DRAFTER[previous]
                previous = torch.multinomial(q, 1, generator=gen)[:, 0]
                rows.append(q)
                tokens.append(previous)
            trees = DraftTrees.chain(torch.stack(tokens, 1))
            draft_probs = torch.stack(rows, 1)
        else:
            builder = TreeBuilder([shape] * runs)
            while not builder.done:
                ids, _ = builder.frontier()
                context = torch.where(ids >= 0, builder.frontier_tokens(), last[:, None])
                logprobs, cand = DRAFTER[context].log().topk(shape.width, dim=-1)
                builder.add_level(cand, logprobs)
            trees = builder.finish()
        probs = TARGET[torch.cat([last[:, None], trees.tokens], 1)]
        result = verify(probs, trees, draft_probs, gen)
        tokens = result.output_tokens()
        count = result.num_accepted + 1
        for k in range(tokens.shape[1]):
            write = k < count
            column = (emitted + k).clamp(max=out.shape[1] - 1)
            out[write, column[write]] = tokens[write, k]
        emitted += count
        last = result.next_token
    prefix = out[:, :STAT_LENGTH]
    index = (prefix * torch.tensor([STAT_VOCAB**2, STAT_VOCAB, 1])).sum(1)
    counts = torch.bincount(index, minlength=STAT_VOCAB**STAT_LENGTH)
    grid = torch.cartesian_prod(*[torch.arange(STAT_VOCAB)] * STAT_LENGTH)
    expected = TARGET[0, grid[:, 0]] * TARGET[grid[:, 0], grid[:, 1]] * TARGET[grid[:, 1], grid[:, 2]]
    return chi_square_pvalue(counts, expected)


def _exact(probs, trees, draft_probs, gen):
    return verify_sampled(probs, trees, tau=1.0, generator=gen, draft_probs=draft_probs)


@pytest.mark.parametrize("shape", [TreeShape(2, 2, 4), TreeShape(3, 3, 9), TreeShape(3, 1, 3)])
def test_tau_one_sampling_preserves_the_target_distribution(shape):
    assert _emitted_prefixes(_exact, shape) > 1e-3


def test_tau_one_sampling_with_stochastic_chain_draft_preserves_the_distribution():
    assert _emitted_prefixes(_exact, TreeShape(3, 1, 3), stochastic_chain=True) > 1e-3


def test_statistical_check_fails_a_verifier_that_ignores_the_residual():
    """Negative control: the same check must reject a verifier with the classic bug of drawing the
    correction token from the full target row instead of the residual."""

    def biased(probs, trees, draft_probs, gen):
        result = verify_sampled(probs, trees, tau=1.0, generator=gen)
        last_node = torch.where(result.num_accepted > 0, result.accepted_nodes.gather(
            1, (result.num_accepted - 1).clamp(min=0)[:, None])[:, 0], -1)
        row = probs[torch.arange(probs.shape[0]), last_node + 1]
        result.next_token = torch.multinomial(row, 1, generator=gen)[:, 0]
        return result

    assert _emitted_prefixes(biased, TreeShape(2, 2, 4)) < 1e-6


def test_statistical_check_fails_the_lossy_margin_rule():
    """Negative control: tau < 1 with an unlimited allowance is biased on purpose; the check sees it."""

    def lossy(probs, trees, draft_probs, gen):
        return verify_sampled(probs, trees, tau=0.3, generator=gen)

    assert _emitted_prefixes(lossy, TreeShape(2, 2, 4)) < 1e-6


# --- margin promotions -----------------------------------------------------------------------


@FAST
@given(batches(integer_logits=False), st.floats(0.05, 0.99), st.integers(0, 3))
def test_every_greedy_promotion_passes_the_ratio_test(sample, tau, allowance):
    tokens, parents, trees, logits = sample
    result = verify_greedy(logits, trees, tau=tau, promotion_allowance=torch.full((trees.batch_size,), allowance))
    top = logits.argmax(-1)
    assert (result.num_promoted <= allowance).all()
    assert torch.equal(result.num_promoted, result.promoted.sum(1))
    for b in range(trees.batch_size):
        for k in range(int(result.num_accepted[b])):
            node = int(result.accepted_nodes[b, k])
            row = logits[b, parents[b][node] + 1]
            token = tokens[b][node]
            if result.promoted[b, k]:
                assert token != int(top[b, parents[b][node] + 1])
                assert math.exp(float(row[token] - row.max())) >= tau
            else:
                assert token == int(top[b, parents[b][node] + 1])


@FAST
@given(batches(integer_logits=False), st.floats(0.05, 0.99), st.integers(0, 3), st.integers(0, 2**31 - 1))
def test_every_sampled_promotion_passes_the_ratio_test(sample, tau, allowance, seed):
    tokens, parents, trees, logits = sample
    probs = logits.softmax(-1)
    gen = torch.Generator().manual_seed(seed)
    result = verify_sampled(probs, trees, tau=tau, promotion_allowance=torch.full((trees.batch_size,), allowance), generator=gen)
    assert (result.num_promoted <= allowance).all()
    assert torch.equal(result.num_promoted, result.promoted.sum(1))
    for b in range(trees.batch_size):
        for k in range(int(result.num_accepted[b])):
            if result.promoted[b, k]:
                node = int(result.accepted_nodes[b, k])
                row = probs[b, parents[b][node] + 1]
                assert float(row[tokens[b][node]]) / float(row.max()) >= tau


def test_allowance_cuts_the_path_where_promotions_run_out():
    # Chain 1 -> 2 -> 3 where every token is the runner-up (ratio e^-0.1) of its row.
    logits = torch.zeros(1, 4, 4)
    for row, runner_up in enumerate([1, 2, 3]):
        logits[0, row, 0] = 1.0
        logits[0, row, runner_up] = 0.9
    trees = DraftTrees.chain(torch.tensor([[1, 2, 3]]))
    for allowance in range(4):
        result = verify_greedy(logits, trees, tau=0.5, promotion_allowance=torch.tensor([allowance]))
        assert int(result.num_accepted[0]) == allowance == int(result.num_promoted[0])
        assert int(result.next_token[0]) == 0


def test_output_tokens_layout():
    result = VerifyResult(
        accepted_nodes=torch.tensor([[0, 1, -1], [-1, -1, -1]]),
        accepted_tokens=torch.tensor([[7, 8, -1], [-1, -1, -1]]),
        promoted=torch.zeros(2, 3, dtype=torch.bool),
        num_accepted=torch.tensor([2, 0]),
        next_token=torch.tensor([9, 4]),
        num_promoted=torch.tensor([0, 0]),
    )
    assert result.output_tokens().tolist() == [[7, 8, 9, -1], [4, -1, -1, -1]]


def test_shape_errors_are_reported():
    trees = DraftTrees.chain(torch.tensor([[1, 2]]))
    with pytest.raises(ValueError, match=r"\[B=1, N\+1=3, V\]"):
        verify_greedy(torch.zeros(1, 2, 4), trees)


@pytest.mark.parametrize("block", [16, 1024])
def test_block_sampler_draws_in_proportion_to_the_weights(monkeypatch, block):
    """The two-level draw behind every correction / bonus token: exact frequencies across full
    blocks and a ragged tail, never a zero-weight token."""
    monkeypatch.setattr(margin, "SAMPLE_BLOCK", block)
    gen = torch.Generator().manual_seed(3)
    vocab = 100 if block == 16 else 2500
    weights = torch.rand(vocab, generator=gen) ** 3
    weights[torch.rand(vocab, generator=gen) < 0.2] = 0.0
    weights[16:32] = 0.0  # a whole empty block at the small block size
    draws = margin.sample_from_weights(weights.expand(60_000, vocab), generator=gen)
    assert weights[draws].min() > 0
    assert chi_square_pvalue(torch.bincount(draws, minlength=vocab), weights / weights.sum()) > 1e-3


def test_sampling_refuses_rows_without_finite_mass():
    from vllm_adaptivespec.margin import sample_from_weights

    for bad in (torch.zeros(1, 300), torch.full((1, 300), float("nan"))):
        with pytest.raises(ValueError, match="no positive finite mass"):
            sample_from_weights(bad)


def test_seeded_rows_draw_from_their_own_generators():
    """A row with its own generator (vLLM's seeded request) verifies the same way whatever the global RNG
    and the other rows draw; rows without one follow the global RNG."""
    gen = torch.Generator().manual_seed(3)
    probs = (torch.randn(3, 5, 64, generator=gen) * 0.5).softmax(-1)
    trees = DraftTrees.chain(torch.randint(0, 64, (3, 4), generator=gen), torch.tensor([4, 4, 4]))

    def verify(global_seed: int) -> VerifyResult:
        torch.manual_seed(global_seed)
        return verify_sampled(probs, trees, generators={1: torch.Generator().manual_seed(7)})

    results = [verify(seed) for seed in range(6)]
    seeded = {(r.num_accepted[1].item(), tuple(r.output_tokens()[1].tolist())) for r in results}
    unseeded = {(r.num_accepted[0].item(), tuple(r.output_tokens()[0].tolist())) for r in results}
    assert len(seeded) == 1
    assert len(unseeded) > 1


def test_a_seeded_rows_draws_do_not_depend_on_how_wide_the_batch_is_padded():
    """A seeded row verifies its 3-token chain the same way, and leaves its generator in the same state, whether
    its neighbour's draft pads the batch to 8 nodes or to 3 (the neighbour's copy length varies step to step)."""
    gen = torch.Generator().manual_seed(5)
    probs = (torch.randn(2, 9, 64, generator=gen) * 0.5).softmax(-1)
    tokens = torch.randint(0, 64, (2, 8), generator=gen)
    outcomes = []
    for width, neighbour in ((8, 8), (3, 1)):
        own = torch.Generator().manual_seed(11)
        trees = DraftTrees.chain(tokens[:, :width].clone(), torch.tensor([neighbour, 3]))
        result = verify_sampled(probs[:, : width + 1].contiguous(), trees, generators={1: own})
        outcomes.append((result.num_accepted[1].item(), tuple(result.output_tokens()[1, :4].tolist()),
                         torch.rand(4, generator=own).tolist()))  # fmt: skip
    assert outcomes[0] == outcomes[1]


def _ragged(counts, gen, vocab=6, integer_logits=True):
    """Random chains on vLLM's ragged layout: drafts [T], logits [T, V], bonus [B]."""
    total = sum(counts)
    logits = torch.randint(-3, 4, (total, vocab), generator=gen).float() if integer_logits else torch.randn(
        total, vocab, generator=gen
    )
    drafts = torch.randint(0, vocab, (total,), generator=gen)
    bonus = torch.randint(0, vocab, (len(counts),), generator=gen)
    return drafts, logits, bonus


@pytest.mark.parametrize("integer_logits", [True, False])
def test_ragged_greedy_chains_match_padded_verification_and_brute_force(integer_logits):
    gen = torch.Generator().manual_seed(7)
    rng = random.Random(7)
    for _ in range(2000):
        batch = rng.randint(1, 5)
        max_spec = rng.randint(1, 6)
        counts = [rng.randint(0, max_spec) for _ in range(batch)]
        drafts, logits, bonus = _ragged(counts, gen, integer_logits=integer_logits)
        tau = torch.tensor([rng.choice([1.0, 0.9, 0.5, 0.2, 0.05]) for _ in range(batch)])
        allowance = torch.tensor([rng.randint(0, 3) for _ in range(batch)])
        got = margin.verify_greedy_chains(
            drafts, logits, torch.tensor(counts), bonus[:, None], max_spec, tau, allowance, placeholder=-1
        )
        # Padded reference: rows after node i, then the bonus token as a one-hot row.
        vocab = logits.shape[1]
        padded = torch.zeros(batch, max_spec + 1, vocab)
        tokens = torch.zeros(batch, max_spec, dtype=torch.long)
        offset = 0
        for b, n in enumerate(counts):
            padded[b, :n] = logits[offset : offset + n]
            tokens[b, :n] = drafts[offset : offset + n]
            padded[b, n] = float("-inf")
            padded[b, n, bonus[b]] = 0.0
            offset += n
        expected = verify_greedy(padded, DraftTrees.chain(tokens, torch.tensor(counts)), tau, allowance)
        assert got.num_accepted.tolist() == expected.num_accepted.tolist()
        assert got.num_promoted.tolist() == expected.num_promoted.tolist()
        want = torch.full((batch, max_spec + 1), -1, dtype=torch.long)
        width = min(expected.output_tokens().shape[1], max_spec + 1)
        want[:, :width] = expected.output_tokens()[:, :width]
        assert got.output_tokens.long().tolist() == want.tolist()
        offset = 0
        for b, n in enumerate(counts):  # and the brute-force enumeration of root paths
            row_logits = padded[b, : n + 1]
            best_len, _, _ = greedy_reference(
                row_logits, tokens[b, :n].tolist(), list(range(-1, n - 1)), float(tau[b]), int(allowance[b]), False
            )
            assert int(got.num_accepted[b]) == best_len


@pytest.mark.parametrize("with_draft_probs", [False, True])
def test_ragged_sampled_chains_match_padded_sampled_verification(with_draft_probs):
    """`verify_sampled_chains` (ragged, no padded copy) takes the decisions `verify_sampled` takes on the same
    chains padded to [B, K+1, V]: same per-draft uniforms, same accepted, promoted and next tokens, and a
    seeded request's generator left in the same state. Integer logits keep p(draft) / p(top1) away from the
    taus, and draws within 1e-4 of a pass probability are redrawn, so float rounding cannot split them."""
    gen = torch.Generator().manual_seed(11)
    rng = random.Random(11)
    vocab = 6
    seen = {"promoted": 0, "rejected": 0, "full": 0}
    for case in range(600):
        batch = rng.randint(1, 5)
        max_spec = rng.randint(1, 6)
        counts = [rng.randint(0, max_spec) for _ in range(batch)]
        drafts, logits, bonus = _ragged(counts, gen)
        total = sum(counts)
        q = torch.rand(total, vocab, generator=gen).softmax(-1) if with_draft_probs else None
        tau = torch.tensor([rng.choice([1.0, 0.9, 0.5, 0.2, 0.05]) for _ in range(batch)])
        allowance = torch.tensor([rng.randint(0, 3) for _ in range(batch)])
        probs = logits.double().softmax(-1)
        q_draft = q.double().gather(1, drafts[:, None])[:, 0] if q is not None else 1.0
        pass_prob = probs.gather(1, drafts[:, None])[:, 0] / q_draft
        draws = torch.rand(total, generator=gen).double()
        while bool(((draws - pass_prob).abs() < 1e-4).any()):
            near = (draws - pass_prob).abs() < 1e-4
            draws[near] = torch.rand(int(near.sum()), generator=gen).double()
        seeded_row = rng.randrange(batch)
        seed = rng.randrange(1000)
        # Padded reference: rows after node i, then the bonus token as a one-hot row.
        padded = torch.zeros(batch, max_spec + 1, vocab)
        tokens = torch.zeros(batch, max_spec, dtype=torch.long)
        padded_q = torch.zeros(batch, max_spec, vocab) if q is not None else None
        padded_u = torch.ones(batch, max_spec, dtype=torch.float64)
        offset = 0
        for b, n in enumerate(counts):
            padded[b, :n] = logits[offset : offset + n].softmax(-1)
            tokens[b, :n] = drafts[offset : offset + n]
            padded_u[b, :n] = draws[offset : offset + n]
            if q is not None:
                padded_q[b, :n] = q[offset : offset + n]
            padded[b, n, bonus[b]] = 1.0
            offset += n
        results, states = [], []
        for ragged in (True, False):
            own = torch.Generator().manual_seed(seed)
            shared = torch.Generator().manual_seed(case)
            if ragged:
                got = margin.verify_sampled_chains(
                    drafts, logits, torch.tensor(counts), bonus[:, None], max_spec, tau, allowance, placeholder=-1,
                    draft_probs=q, generator=shared, generators={seeded_row: own}, uniforms=draws.float(),
                )  # fmt: skip
                out = got.output_tokens.long()
                results.append((out.tolist(), got.num_accepted.tolist(), got.num_promoted.tolist()))
            else:
                want = verify_sampled(padded, DraftTrees.chain(tokens, torch.tensor(counts)), tau, allowance,
                                      generator=shared, draft_probs=padded_q, uniforms=padded_u.float(),
                                      generators={seeded_row: own})  # fmt: skip
                out = torch.full((batch, max_spec + 1), -1, dtype=torch.long)
                width = min(want.output_tokens().shape[1], max_spec + 1)
                out[:, :width] = want.output_tokens()[:, :width]
                results.append((out.tolist(), want.num_accepted.tolist(), want.num_promoted.tolist()))
            states.append(torch.rand(3, generator=own).tolist())
        assert results[0] == results[1], case
        assert states[0] == states[1]
        seen["promoted"] += sum(results[0][2])
        seen["rejected"] += sum(a < n for a, n in zip(results[0][1], counts))
        seen["full"] += sum(a == n > 0 for a, n in zip(results[0][1], counts))
    assert min(seen.values()) > 20  # not vacuous: promotions, rejections and fully accepted chains all occur


def test_ragged_sampled_chains_draw_a_seeded_requests_uniforms_from_its_generator():
    """Without explicit uniforms a seeded request's 3 drafts are judged by its own generator's draws, one per
    draft, then two for its next token, whether its neighbour drafts 0 tokens or 5."""
    drafts, logits, bonus = _ragged([3], torch.Generator().manual_seed(4))
    other_drafts, other_logits, other_bonus = _ragged([5], torch.Generator().manual_seed(5))
    outcomes = []
    for neighbour in (0, 5):
        own = torch.Generator().manual_seed(9)
        got = margin.verify_sampled_chains(
            torch.cat([other_drafts[:neighbour], drafts]), torch.cat([other_logits[:neighbour], logits]),
            torch.tensor([neighbour, 3]), torch.cat([other_bonus, bonus])[:, None], 5, torch.tensor([1.0, 1.0]),
            torch.tensor([0, 0]), generator=torch.Generator().manual_seed(neighbour), generators={1: own},
        )  # fmt: skip
        after = torch.rand(2, generator=own).tolist()
        outcomes.append((got.output_tokens[1].tolist(), got.num_accepted[1].item(), after))
    assert outcomes[0] == outcomes[1]


def test_ragged_greedy_chains_handle_an_empty_batch_of_drafts():
    got = margin.verify_greedy_chains(
        torch.zeros(0, dtype=torch.long), torch.zeros(0, 5), torch.tensor([0, 0]), torch.tensor([[3], [4]]), 2,
        torch.tensor([0.5, 1.0]), torch.tensor([2, 2]), placeholder=-1,
    )  # fmt: skip
    assert got.output_tokens.tolist() == [[3, -1, -1], [4, -1, -1]]
    assert got.num_accepted.tolist() == [0, 0]
