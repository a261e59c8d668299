"""Loop-based FwPKM reference: obviously correct, slow, for tests only.

Every token is addressed on its own with full sub-key scores over all S sub-keys; the writes are
taken from autograd on the literal losses of docs/fwpkm.md (memorisation loss for V, addressing
loss for K) with `create_graph=True`, so gradients flow through the writes exactly as the spec
says. It shares nothing with `fwpkm.py` except the config dataclasses and the state tuple.

    ref = naive_fwpkm(q, v, g, init_state(config), config, WriteRule(chunk=16))
    ref["vhat"], ref["states"][-1]          # read-outs; (keys, values) after the last write
"""
from __future__ import annotations

import torch
from torch import Tensor

from cl_platform.memory.fwpkm import ENTROPY_EPS, FastWeightState, FwPKMConfig, WriteRule
from cl_platform.memory.product_keys import IDW_EPS


def naive_fwpkm(
    q: Tensor,
    v: Tensor,
    g: Tensor,
    state: FastWeightState,
    cfg: FwPKMConfig,
    rule: WriteRule,
    *,
    write: bool = True,
) -> dict:
    """Same contract as `fwpkm.fwpkm_chunked` but returns everything in a dict:
    vhat (B, T, Dv), idx / weights (B, T, H, k), states [(keys, values) after each chunk],
    addr_loss [per chunk]. `state` is not modified (its read counts are not used)."""
    B, T, _ = q.shape
    H, k, S, C = cfg.heads, cfg.topk, cfg.num_subkeys, rule.chunk
    Dk, Dh = cfg.d_key, cfg.d_key // 2
    keys = state.keys.detach().clone().requires_grad_(True)
    values = state.values.detach().clone().requires_grad_(True)
    write_mask = state.write_mask
    vhat = [[None] * T for _ in range(B)]
    idx_all = torch.zeros(B, T, H, k, dtype=torch.long)
    w_all = [[[None] * H for _ in range(T)] for _ in range(B)]
    states, addr_losses = [], []
    for c0 in range(0, T, C if write else T):
        c1 = min(c0 + (C if write else T), T)
        topsub = {}  # (b, t, h, m) -> top-k sub-key ids
        reads = []
        for b in range(B):
            for t in range(c0, c1):
                # Row (b, t) of the chunk's dense read matrix: weight w/H at every picked slot.
                read = torch.zeros(S * S, dtype=values.dtype)
                for h in range(H):
                    qq = q[b, t, h * Dk : (h + 1) * Dk]
                    s = [-torch.log(IDW_EPS + ((qq[m * Dh : (m + 1) * Dh] - keys[h, m]) ** 2).sum(-1)) for m in (0, 1)]
                    tops = [torch.topk(s[m], k).indices.tolist() for m in (0, 1)]
                    topsub[b, t, h, 0], topsub[b, t, h, 1] = tops
                    cands = [(s[0][a] + s[1][c], a * S + c) for a in tops[0] for c in tops[1]]
                    cands.sort(key=lambda sc: -sc[0].item())
                    best = cands[:k]
                    w = torch.softmax(torch.stack([sc for sc, _ in best]), 0)
                    slots = torch.tensor([slot for _, slot in best])
                    idx_all[b, t, h] = slots
                    read = read.index_add(0, slots, w / H)
                    w_all[b][t][h] = w
                reads.append(read)
        # One matmul per chunk (not per token) keeps the double-backward graph small.
        chunk_vhat = torch.stack(reads) @ values  # (B·L, Dv)
        for i, (b, t) in enumerate((b, t) for b in range(B) for t in range(c0, c1)):
            vhat[b][t] = chunk_vhat[i]
        if not write:
            continue
        counts = torch.zeros(S * S, dtype=values.dtype)
        for b in range(B):
            for t in range(c0, c1):
                for slot in idx_all[b, t].reshape(-1).tolist():
                    counts[slot] += 1
        mem_loss = 0.0
        for b in range(B):
            for t in range(c0, c1):
                if rule.lookahead:
                    if t + 1 >= c1:
                        continue
                    y = v[b, t + 1]
                else:
                    y = v[b, t]
                mem_loss = mem_loss + 0.5 * g[b, t] * ((vhat[b][t] - y) ** 2).sum()
        if torch.is_tensor(mem_loss):
            (grad_v,) = torch.autograd.grad(mem_loss, values, create_graph=True)
        else:
            grad_v = torch.zeros_like(values)
        delta_v = -rule.lr_values * (k * H / counts.clamp(min=1))[:, None] * grad_v
        delta_v = torch.where(write_mask[:, None], delta_v, torch.zeros_like(delta_v))
        addr = 0.0
        n_tok = B * (c1 - c0)
        for h in range(H):
            for m in (0, 1):
                pbar = 0.0
                for b in range(B):
                    for t in range(c0, c1):
                        qq = q[b, t, h * Dk + m * Dh : h * Dk + (m + 1) * Dh]
                        s = -torch.log(IDW_EPS + ((qq - keys[h, m]) ** 2).sum(-1))
                        mask = torch.full((S,), float("-inf"), dtype=s.dtype)
                        mask[topsub[b, t, h, m]] = 0.0
                        pbar = pbar + torch.softmax(s + mask, 0) / n_tok
                entropy = -(pbar * torch.log(pbar + ENTROPY_EPS)).sum()
                addr = addr - rule.addr_weight * entropy
        (grad_k,) = torch.autograd.grad(addr, keys, create_graph=True)
        keys = keys - rule.lr_keys * grad_k
        values = values + delta_v
        states.append((keys, values))
        addr_losses.append(addr)
    weights = torch.stack([torch.stack([torch.stack(w_all[b][t]) for t in range(T)]) for b in range(B)])
    return {
        "vhat": torch.stack([torch.stack(row) for row in vhat]),
        "idx": idx_all,
        "weights": weights,
        "states": states,
        "addr_loss": addr_losses,
    }
