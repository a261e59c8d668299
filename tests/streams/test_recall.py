"""The associative-recall generator: deterministic, answers checkable by hand, bad input named."""
import pytest
import torch

from cl_platform.constants import IGNORE_INDEX
from streams.recall import RESERVED, RecallConfig, answers, recall_batch

CFG = RecallConfig(num_keys=10, num_values=7, num_filler=5, num_pairs=3, seq_len=30)


def test_the_same_arguments_give_the_same_batch_and_another_seed_another():
    a, b = recall_batch(CFG, 4, [0, 5, 10, 19], seed=3), recall_batch(CFG, 4, [0, 5, 10, 19], seed=3)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["input_ids"], recall_batch(CFG, 4, [0, 5, 10, 19], seed=4)["input_ids"])


def test_every_query_asks_for_a_pair_and_its_target_is_that_pairs_value():
    distances = [0, 5, 10, CFG.max_distance]
    batch = recall_batch(CFG, 4, distances, seed=0)
    keys = range(RESERVED, RESERVED + CFG.num_keys)
    values = range(RESERVED + CFG.num_keys, RESERVED + CFG.num_keys + CFG.num_values)
    for ids, queries, d in zip(batch["input_ids"].tolist(), answers(batch), distances):
        P = CFG.num_pairs
        pairs = {ids[2 * j]: ids[2 * j + 1] for j in range(P)}
        assert len(pairs) == P and all(k in keys for k in pairs) and all(v in values for v in pairs.values())
        assert [t for t, _, _ in queries] == [2 * P + d + 2 * j for j in range(P)]  # `d` tokens after the pairs
        assert sorted(k for _, k, _ in queries) == sorted(pairs)  # every pair asked once
        for t, key, answer in queries:
            assert answer == pairs[key]
            if t + 1 < len(ids):
                assert ids[t + 1] == answer  # the answer follows its query in the text
        fill = [x for t, x in enumerate(ids) if t >= 2 * P and not any(q <= t <= q + 1 for q, _, _ in queries)]
        assert all(x >= RESERVED + CFG.num_keys + CFG.num_values for x in fill)  # the rest is filler
    targets = batch["targets"]
    assert int((targets != IGNORE_INDEX).sum()) == 4 * CFG.num_pairs
    assert CFG.vocab_size == RESERVED + 10 + 7 + 5 and int(batch["input_ids"].max()) < CFG.vocab_size


def test_bad_input_is_named_before_any_work():
    with pytest.raises(ValueError, match=r"recall distance 20 does not fit: .* 0..19"):
        recall_batch(CFG, 1, [20], seed=0)
    with pytest.raises(ValueError, match="recall.num_pairs \\(11\\) exceeds recall.num_keys"):
        RecallConfig(num_keys=10, num_pairs=11)
    with pytest.raises(ValueError, match="cannot hold 8 pairs"):
        RecallConfig(num_pairs=8, seq_len=20)
    with pytest.raises(ValueError, match="recall.seq_len must be a positive int"):
        RecallConfig(seq_len=0)
