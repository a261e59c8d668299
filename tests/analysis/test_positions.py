"""Losses by position: bucketing by hand-computed values, and the paired document bootstrap."""
import numpy as np
import pytest

from analysis.positions import bucket_document_sums, bucket_means, bucket_of, paired_difference


def test_bucket_of_half_open_ranges():
    assert bucket_of(np.array([0, 3, 4, 9, 10, 11]), [0, 4, 10]).tolist() == [0, 0, 1, 1, -1, -1]


def test_sums_per_document_and_bucket_by_hand():
    losses = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    positions = np.array([0, 1, 2, 0, 1, 2])
    docs = np.array([0, 0, 0, 1, 1, -1])
    valid = np.array([True, True, True, True, False, False])  # padding and an ignored target
    sums, counts = bucket_document_sums(losses, positions, docs, valid, [0, 2, 8], n_docs=2)
    assert sums.tolist() == [[3.0, 3.0], [4.0, 0.0]]
    assert counts.tolist() == [[2, 1], [1, 0]]
    assert bucket_means(sums, counts).tolist() == [7 / 3, 3.0]
    # every valid token lands in exactly one bucket: the buckets merge to the plain mean
    assert sums.sum() / counts.sum() == pytest.approx(losses[valid].mean())


def test_positions_beyond_the_last_edge_are_an_error():
    with pytest.raises(ValueError, match="outside the buckets"):
        bucket_document_sums(np.ones(2), np.array([0, 9]), np.zeros(2, int), np.ones(2, bool), [0, 4, 8], 1)


def test_paired_difference_is_exact_for_a_constant_shift_and_zero_for_itself():
    rng = np.random.default_rng(0)
    counts = rng.integers(1, 20, size=(30, 3))
    sums = counts * rng.uniform(2, 4, size=(30, 3))
    same = paired_difference(sums, counts, sums, counts, samples=200)
    assert all(c["value"] == 0 and c["low"] == 0 and c["high"] == 0 for c in same)
    shifted = paired_difference(sums, counts, sums - 0.25 * counts, counts, samples=200)
    for c in shifted:  # every token 0.25 nats lower: every resample sees exactly that
        assert c["value"] == pytest.approx(-0.25) and c["low"] == pytest.approx(-0.25) and c["high"] == pytest.approx(-0.25)
    noisy = paired_difference(sums, counts, sums + rng.normal(0, 1, size=sums.shape), counts, samples=500)
    assert all(c["low"] < c["value"] < c["high"] for c in noisy)
    with pytest.raises(ValueError, match="same documents"):
        paired_difference(sums, counts, sums, counts + 1)
