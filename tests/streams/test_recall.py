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


def test_an_old_config_draws_the_batches_it_drew_before_composite_keys():
    # sha256 of (input_ids, targets) made by the generator before key_tokens / value_tokens existed.
    import hashlib

    def digest(batch):
        return hashlib.sha256(batch["input_ids"].numpy().tobytes() + batch["targets"].numpy().tobytes()).hexdigest()[:16]

    assert digest(recall_batch(RecallConfig(), 8, [96] * 8, seed=0)) == "40a3b92a9e464e6f"
    small = RecallConfig(num_keys=32, num_values=32, num_filler=30, num_pairs=2, seq_len=48)
    assert digest(recall_batch(small, 5, [24, 40, 0, 1, 40], seed=1003)) == "816a91af2d00ed87"


KEYS = RecallConfig(num_keys=10, num_values=7, num_filler=5, num_pairs=6, seq_len=100, key_tokens=4, value_tokens=3)


def test_composite_keys_are_distinct_combinations_of_shared_symbols_and_the_answers_sit_after_them():
    m, L, P, w = 4, 3, KEYS.num_pairs, 7
    distances = [0, 9, KEYS.max_distance]
    batch = recall_batch(KEYS, 3, distances, seed=5)
    key_ids = range(RESERVED, RESERVED + 10)
    value_ids = range(RESERVED + 10, RESERVED + 17)
    shared = 0
    for ids, tgt, d in zip(batch["input_ids"].tolist(), batch["targets"].tolist(), distances):
        pairs = [(tuple(ids[j * w:j * w + m]), tuple(ids[j * w + m:(j + 1) * w])) for j in range(P)]
        keys = [k for k, _ in pairs]
        assert len(set(keys)) == P  # distinct as combinations
        assert all(x in key_ids for k in keys for x in k) and all(x in value_ids for _, v in pairs for x in v)
        symbols = [x for k in keys for x in k]
        shared += len(symbols) - len(set(symbols))  # symbols repeat across keys (24 drawn from 10)
        start = P * w + d
        assert KEYS.queries_at(d) == start
        lookup = dict(pairs)
        asked = []
        for j in range(P):
            q = start + j * w
            key, value = tuple(ids[q:q + m]), lookup[tuple(ids[q:q + m])]
            asked.append(key)
            # the answer's L tokens follow the key and are the targets one position earlier
            assert tuple(ids[q + m:q + w]) == value[:len(ids) - (q + m)]  # at the longest distance the input stops before the last token
            assert tuple(tgt[q + m - 1:q + w - 1]) == value
            assert tgt[q:q + m - 1] == [IGNORE_INDEX] * (m - 1)
        assert sorted(asked) == sorted(keys)  # every pair asked once
        assert sum(t != IGNORE_INDEX for t in tgt) == P * L
    assert shared > 0
    again = recall_batch(KEYS, 3, distances, seed=5)
    assert all(torch.equal(batch[k], again[k]) for k in batch)
    assert not torch.equal(batch["input_ids"], recall_batch(KEYS, 3, distances, seed=6)["input_ids"])
    assert KEYS.max_distance == 101 - 2 * P * w == 17


def test_exact_match_needs_every_token_of_a_value():
    from streams.recall import exact_match

    I = IGNORE_INDEX
    targets = torch.tensor([[I, 5, 6, I, I, 7, 8, I], [I, I, 1, 2, I, 3, 4, I]])
    predicted = torch.tensor([[0, 5, 6, 0, 0, 7, 9, 0],  # first value right, second wrong in its last token
                              [9, 9, 1, 2, 9, 3, 4, 9]])  # both right; the other positions do not count
    assert exact_match(predicted, targets, 2) == (3, 4)
    assert exact_match(predicted, targets, 1) == (7, 8)  # one token a value: per-token accuracy, as before
    predicted[1, 3] = 0
    assert exact_match(predicted, targets, 2) == (2, 4)


def test_bad_composite_settings_are_named():
    with pytest.raises(ValueError, match=r"recall.num_pairs \(17\) exceeds recall.num_keys \(4\) \*\* recall.key_tokens \(2\) = 16"):
        RecallConfig(num_keys=4, key_tokens=2, num_pairs=17)
    with pytest.raises(ValueError, match="recall.key_tokens must be a positive int"):
        RecallConfig(key_tokens=0)
    with pytest.raises(ValueError, match="cannot hold 8 pairs"):
        RecallConfig(num_pairs=8, seq_len=100, key_tokens=4, value_tokens=3)  # 2 · 8 · 7 = 112 > 101
