"""Product-key lookup (Lample et al. 2019), the one shared by the FwPKM layer and the static PKM.

    look, sub = product_key_lookup(q, keys, topk)          # q (B, T, H, Dk), keys (H, 2, S, Dh)
    read = embedding_bag(look.idx, table, per_sample_weights=look.weights)

Each head's query is split into two halves, each scored against its own codebook of S sub-keys;
the k best sub-keys of each codebook give k·k candidate slots a·S + b scored s¹_a + s²_b, and
the k best candidates are read with softmax weights. Scores are inverse-distance ("idw",
s = −log(ε + ‖q − K‖²), keys act as cluster centres: docs/fwpkm.md, "Read") or dot products
("dot", s = q·K, static PKM only).

Shape letters: H heads, k top-k, S sub-keys per codebook, N = S² slots, Dk query/key width per
head (two halves of Dh = Dk/2), M query rows (all leading dimensions flattened).
"""
from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor

Score = Literal["dot", "idw"]

IDW_EPS = 1e-3  # ε in s = −log(ε + ‖q − K‖²)


class Lookup(NamedTuple):
    idx: Tensor  # (..., H, k) slot ids a·S + b, best first
    weights: Tensor  # (..., H, k) softmax over the final top-k scores


class SubKeys(NamedTuple):
    """Per-codebook top-k of the queries, kept for FwPKM's key write."""

    q: Tensor  # (M, H, 2, Dh) query halves
    idx: Tensor  # (M, H, 2, k) top-k sub-key ids per codebook
    d2: Tensor | None  # (M, H, 2, k) squared distances to them ("idw"; None for "dot")


def product_key_lookup(q: Tensor, keys: Tensor, topk: int, score: Score = "idw") -> tuple[Lookup, SubKeys]:
    """q (..., H, Dk), keys (H, 2, S, Dh) → (Lookup (..., H, k), SubKeys (M, ...)).

    One batched matmul per call scores every sub-key. For "idw" it gives
    ‖q − K‖² − ‖q‖² = ‖K‖² − 2 q·K; top-k runs on it directly (−log(ε + d²) is decreasing in d²
    and ‖q‖² is constant per row), and the distance and the log are completed only for the k
    winners. Gradients reach q and the keys through the winners' scores; the top-k selection
    itself is constant.
    """
    H, _, S, Dh = keys.shape
    lead = q.shape[:-2]
    qh = q.reshape(-1, H, 2, Dh)  # (M, H, 2, Dh)
    M = qh.shape[0]
    q_hc = qh.permute(1, 2, 0, 3).reshape(H * 2, M, Dh)  # (H·2, M, Dh)
    k_hc = keys.reshape(H * 2, S, Dh)
    if score == "idw":
        rank = torch.baddbmm(k_hc.pow(2).sum(-1).unsqueeze(1), q_hc, k_hc.transpose(1, 2), alpha=-2.0)  # (H·2, M, S)
        with torch.no_grad():
            sub_idx = rank.topk(topk, dim=-1, largest=False, sorted=False).indices  # (H·2, M, k)
        d2 = (rank.gather(-1, sub_idx) + q_hc.pow(2).sum(-1, keepdim=True)).clamp_min(0.0)
        d2 = d2.view(H, 2, M, topk).permute(2, 0, 1, 3)  # (M, H, 2, k)
        s = -torch.log(IDW_EPS + d2)
    elif score == "dot":
        rank = torch.bmm(q_hc, k_hc.transpose(1, 2))  # (H·2, M, S)
        with torch.no_grad():
            sub_idx = rank.topk(topk, dim=-1, sorted=False).indices
        s = rank.gather(-1, sub_idx).view(H, 2, M, topk).permute(2, 0, 1, 3)
        d2 = None
    else:
        raise ValueError(f"product_key_lookup: score must be 'idw' or 'dot', got {score!r}")
    sub_idx = sub_idx.view(H, 2, M, topk).permute(2, 0, 1, 3)  # (M, H, 2, k)
    cand = (s[:, :, 0, :, None] + s[:, :, 1, None, :]).flatten(-2)  # (M, H, k·k)
    top = cand.topk(topk, dim=-1)
    a = sub_idx[:, :, 0].gather(-1, top.indices // topk)
    b = sub_idx[:, :, 1].gather(-1, top.indices % topk)
    idx = a * S + b  # (M, H, k)
    w = torch.softmax(top.values, dim=-1)
    return Lookup(idx.view(*lead, H, topk), w.view(*lead, H, topk)), SubKeys(qh, sub_idx, d2)
