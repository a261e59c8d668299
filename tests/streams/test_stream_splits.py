"""Document-level split assignment: disjoint, exact fill order, deterministic, clear when too small."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from streams.errors import StreamDataError
from streams.splits import TokenBudget, adapt_part_name, domain_permutation, plan_splits


def _tokens(plan_rows, costs):
    return int(costs[plan_rows].sum())


def test_parts_are_disjoint_sorted_and_filled_in_order():
    doc_tokens = np.array([9, 19, 4, 29, 14, 9, 39, 4, 24, 9] * 5)  # costs 10, 20, 5, 30, ...
    budget = TokenBudget(pretrain=200, adapt=60, eval=40)
    plan = plan_splits(doc_tokens, budget, occurrences=2, seed=3, domain="d")
    parts = plan.all_parts()
    assert list(parts) == ["eval", "pretrain", "dev", "adapt", "adapt#2"] and len(parts["dev"]) == 0
    seen: set[int] = set()
    for name, rows in parts.items():
        assert np.all(np.diff(rows) > 0), f"{name} not in source order"
        assert seen.isdisjoint(rows.tolist())
        seen |= set(rows.tolist())
    costs = doc_tokens + 1
    for name, b in [("eval", 40), ("adapt", 60), ("adapt#2", 60), ("pretrain", 200)]:
        got = _tokens(parts[name], costs)
        # Whole documents until the budget is reached: at least the budget, less than budget + one doc.
        assert b <= got < b + costs.max(), (name, got)
    # Fill order along the permutation: eval, adapt, pretrain, adapt#2.
    perm = domain_permutation(len(costs), 3, "d").tolist()
    n_eval, n_adapt, n_pre = len(plan.eval), len(plan.adapt[0]), len(plan.pretrain)
    assert sorted(perm[:n_eval]) == plan.eval.tolist()
    assert sorted(perm[n_eval : n_eval + n_adapt]) == plan.adapt[0].tolist()
    assert sorted(perm[n_eval + n_adapt : n_eval + n_adapt + n_pre]) == plan.pretrain.tolist()


def test_deterministic_and_seed_and_name_dependent():
    doc_tokens = np.arange(1, 201)
    budget = TokenBudget(pretrain=3000, adapt=1000, eval=500)
    a = plan_splits(doc_tokens, budget, 1, seed=0, domain="x")
    b = plan_splits(doc_tokens, budget, 1, seed=0, domain="x")
    assert all(np.array_equal(a.all_parts()[k], b.all_parts()[k]) for k in a.all_parts())
    assert not np.array_equal(a.eval, plan_splits(doc_tokens, budget, 1, seed=1, domain="x").eval)
    assert not np.array_equal(a.eval, plan_splits(doc_tokens, budget, 1, seed=0, domain="y").eval)


def test_recurrence_does_not_move_eval_or_pretrain():
    doc_tokens = np.full(100, 9)
    budget = TokenBudget(pretrain=300, adapt=100, eval=50)
    once = plan_splits(doc_tokens, budget, 1, seed=0, domain="m")
    thrice = plan_splits(doc_tokens, budget, 3, seed=0, domain="m")
    assert np.array_equal(once.eval, thrice.eval)
    assert np.array_equal(once.pretrain, thrice.pretrain)
    assert np.array_equal(once.adapt[0], thrice.adapt[0])
    assert len(thrice.adapt) == 3 and [adapt_part_name(i) for i in range(3)] == ["adapt", "adapt#2", "adapt#3"]
    assert set(thrice.adapt[1].tolist()).isdisjoint(thrice.adapt[2].tolist())


def test_zero_pretrain_budget_gives_empty_split():
    plan = plan_splits(np.full(20, 9), TokenBudget(pretrain=0, adapt=50, eval=50), 1, 0, "u")
    assert len(plan.pretrain) == 0 and len(plan.eval) == 5 and len(plan.adapt[0]) == 5


def test_too_small_names_domain_and_numbers():
    with pytest.raises(StreamDataError, match=r"domain 'tiny'.*too small.*10 documents hold 100 tokens") as e:
        plan_splits(np.full(10, 9), TokenBudget(pretrain=100, adapt=50, eval=50), 1, 0, "tiny")
    assert e.value.domain == "tiny"
    # The sum fits but whole documents overshoot: still refused, part by part.
    with pytest.raises(StreamDataError, match="too small"):
        plan_splits(np.array([59, 39]), TokenBudget(pretrain=0, adapt=40, eval=50), 1, 0, "tiny")


@pytest.mark.parametrize(
    "kwargs, field",
    [({"eval": 0}, "token_budget.eval"), ({"adapt": -1}, "token_budget.adapt"), ({"pretrain": 1.5}, "token_budget.pretrain")],
)
def test_budget_validation_names_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        TokenBudget(**kwargs)


def test_a_dev_split_is_held_out_after_pretrain_and_changes_nothing_else():
    doc_tokens = np.array([9, 19, 4, 29, 14, 9, 39, 4, 24, 9] * 6)
    without = plan_splits(doc_tokens, TokenBudget(pretrain=200, adapt=60, eval=40), 2, seed=3, domain="d")
    plan = plan_splits(doc_tokens, TokenBudget(pretrain=200, adapt=60, eval=40, dev=50), 2, seed=3, domain="d")
    for name in ("eval", "pretrain"):
        assert np.array_equal(getattr(plan, name), getattr(without, name))
    assert np.array_equal(plan.adapt[0], without.adapt[0])  # the first experience streams the same documents
    parts = plan.all_parts()
    rows = [set(r.tolist()) for r in parts.values()]
    assert sum(len(r) for r in rows) == len(set().union(*rows))  # disjoint
    perm = domain_permutation(len(doc_tokens), 3, "d").tolist()
    before = len(plan.eval) + len(plan.adapt[0]) + len(plan.pretrain)
    assert sorted(perm[before : before + len(plan.dev)]) == plan.dev.tolist()
    assert 50 <= int((doc_tokens + 1)[plan.dev].sum()) < 50 + 41


def test_a_dev_split_larger_than_the_adapt_split_is_refused():
    with pytest.raises(ValueError, match=r"token_budget.dev \(200\) must not exceed token_budget.adapt \(100\)"):
        TokenBudget(adapt=100, dev=200)


def test_eval_sized_in_documents_takes_many_capped_documents_and_leaves_the_rest_whole():
    doc_tokens = np.full(200, 999)  # long documents: cost 1,000 each
    plain = plan_splits(doc_tokens, TokenBudget(pretrain=20_000, adapt=5_000, eval=4_000), 1, seed=0, domain="d")
    assert len(plain.eval) == 4
    plan = plan_splits(doc_tokens, TokenBudget(pretrain=20_000, adapt=5_000, eval=4_000, eval_docs=20), 1, seed=0,
                       domain="d")
    assert len(plan.eval) == 20  # 20 documents of their first 200 tokens (+ separator)
    perm = domain_permutation(200, 0, "d").tolist()
    assert plan.eval.tolist() == sorted(perm[:20])
    assert plan.adapt[0].tolist() == sorted(perm[20:25]) and len(plan.pretrain) == 20  # whole documents after


def test_eval_docs_a_domain_cannot_meet_is_refused():
    with pytest.raises(StreamDataError, match="has 10 documents; token_budget.eval_docs 30"):
        plan_splits(np.full(10, 99), TokenBudget(pretrain=0, adapt=100, eval=3_000, eval_docs=30), 1, 0, "d")
    with pytest.raises(ValueError, match="leaves 10 tokens per evaluation document"):
        TokenBudget(eval=100, eval_docs=10)


def test_dev_mirrors_eval_documents_cut_to_the_same_length():
    doc_tokens = np.full(200, 999)  # long documents: cost 1,000 each, 201 when cut to 200 tokens
    budget = TokenBudget(pretrain=20_000, adapt=5_000, eval=4_000, eval_docs=20, dev=2_000)
    plan = plan_splits(doc_tokens, budget, 1, seed=0, domain="d")
    perm = domain_permutation(200, 0, "d").tolist()
    # eval 20, adapt 5, pretrain 20 whole documents, then dev: 2,000 tokens of 201-token cuts = 10 documents
    assert plan.dev.tolist() == sorted(perm[45:55])
    without = plan_splits(doc_tokens, dataclasses.replace(budget, dev=0), 1, seed=0, domain="d")
    for name in ("eval", "pretrain"):
        assert np.array_equal(getattr(plan, name), getattr(without, name))
    assert np.array_equal(plan.adapt[0], without.adapt[0])


def test_a_dev_split_a_domain_cannot_fill_is_refused():
    budget = TokenBudget(pretrain=0, adapt=1_000, eval=1_000, eval_docs=5, dev=1_000)
    with pytest.raises(StreamDataError, match="too few documents left for token_budget.dev 1,000"):
        plan_splits(np.full(12, 199), budget, 1, seed=0, domain="d")


def test_a_smaller_eval_cut_to_the_same_length_is_the_head_of_the_larger_one_and_never_pretrained():
    """What streams/reference_main_heldout.yaml relies on: books and wiki evaluated with a fifth of
    the reference stream's eval budget (each document cut to the same eval // eval_docs tokens, so
    each is read as the reference stream reads it) read documents of the reference eval split
    only, never ones the reference base pretrained on."""
    rng = np.random.default_rng(5)
    for lengths in (rng.integers(3000, 20000, 400), rng.integers(50, 3000, 4000)):  # books-like, wiki-like
        big = plan_splits(lengths, TokenBudget(pretrain=300_000, adapt=2048, eval=81920, eval_docs=40), 1, 0, "books")
        small = plan_splits(lengths, TokenBudget(pretrain=0, adapt=2048, eval=16384, eval_docs=8), 1, 0, "books")
        assert set(small.eval) < set(big.eval) and not set(small.eval) & set(big.pretrain)
        # The head of the same permutation: the first documents the larger split took.
        order = domain_permutation(len(lengths), 0, "books")
        assert set(small.eval) == set(order[:len(small.eval)])
