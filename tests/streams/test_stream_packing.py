"""Packing into (S, T+1) windows: exact layout, budget cut, padding, targets and boundaries."""
from __future__ import annotations

import numpy as np
import torch

from cl_platform.constants import IGNORE_INDEX
from streams.packing import PackedSegments, pack_tokens

EOT, PAD = 0, 1


def test_exact_layout_with_padding():
    # Documents [10 11 12], [20], [30 31]: stream = 0 10 11 12 0 20 0 30 31 0 (10 tokens, 9 targets).
    tokens, doc = pack_tokens(np.array([10, 11, 12, 20, 30, 31]), np.array([3, 1, 2]), seq_len=4, budget=None, eot_id=EOT, pad_id=PAD)
    assert tokens.tolist() == [
        [0, 10, 11, 12, 0],
        [0, 20, 0, 30, 31],  # windows overlap by one token: the last input of k is the first of k+1
        [31, 0, 1, 1, 1],
    ]
    assert doc.tolist() == [[0, 0, 0, 0, 1], [1, 1, 2, 2, 2], [2, 2, -1, -1, -1]]


def test_budget_cuts_the_last_document_exactly():
    tokens, doc = pack_tokens(np.arange(100, 120), np.array([5, 15]), seq_len=4, budget=8, eot_id=EOT, pad_id=PAD)
    assert tokens.shape == (2, 5)
    assert tokens.tolist() == [[0, 100, 101, 102, 103], [103, 104, 0, 105, 106]]
    assert (doc >= 0).all()  # 8 targets fill both windows; document 1 is cut after 2 tokens


def test_empty_document_is_just_a_separator():
    tokens, doc = pack_tokens(np.array([7, 8]), np.array([1, 0, 1]), seq_len=8, budget=None, eot_id=EOT, pad_id=PAD)
    assert tokens[0].tolist() == [0, 7, 0, 0, 8, 0, 1, 1, 1]
    assert doc[0].tolist() == [0, 0, 1, 2, 2, 2, -1, -1, -1]


def test_segment_items_targets_and_doc_start():
    tokens, doc = pack_tokens(np.array([10, 11, 12, 20, 30, 31]), np.array([3, 1, 2]), 4, None, EOT, PAD)
    seg = PackedSegments(tokens, doc, EOT, "d", "eval")
    assert len(seg) == 3 and seg.seq_len == 4 and seg.n_tokens == 9
    first, last = seg[0], seg[2]
    assert first["input_ids"].tolist() == [0, 10, 11, 12]
    assert first["targets"].tolist() == [10, 11, 12, 0]
    assert first["doc_start"].tolist() == [True, False, False, False]
    assert seg[1]["doc_start"].tolist() == [True, False, True, False]
    assert last["targets"].tolist() == [0, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]
    # The closing separator (input 1 of the last window) ends document 2; it starts nothing.
    assert last["doc_start"].tolist() == [False, False, False, False]
    assert last["doc_index"].tolist() == [2, 2, -1, -1]
    assert all(v.dtype in (torch.int64, torch.bool) and v.shape == (4,) for v in first.values())


def test_every_target_predicted_once():
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 30, size=17)
    values = rng.integers(2, 500, size=lengths.sum())
    tokens, doc = pack_tokens(values, lengths, seq_len=7, budget=None, eot_id=EOT, pad_id=PAD)
    seg = PackedSegments(tokens, doc, EOT, "d", "x")
    targets = torch.cat([seg[i]["targets"] for i in range(len(seg))])
    targets = targets[targets != IGNORE_INDEX]
    stream = [EOT]
    for k, n in enumerate(lengths):
        stream += values[lengths[:k].sum() : lengths[:k].sum() + n].tolist() + [EOT]
    assert targets.tolist() == stream[1:]


def test_documents_cut_to_their_first_tokens():
    # Documents [10 11 12], [20], [30 31] cut to 2 tokens each: 0 10 11 0 20 0 30 31 0
    tokens, doc = pack_tokens(np.array([10, 11, 12, 20, 30, 31]), np.array([3, 1, 2]), seq_len=4, budget=None,
                              eot_id=EOT, pad_id=PAD, max_doc_tokens=2)
    assert tokens.tolist() == [[0, 10, 11, 0, 20], [20, 0, 30, 31, 0]]
    assert doc.tolist() == [[0, 0, 0, 1, 1], [1, 2, 2, 2, 2]]
