"""Fast-weight Product Key Memory (FwPKM): a sparse memory rewritten by one gradient step per chunk.

    layer = FwPKM(d_model=256, config=FwPKMConfig(), rule=WriteRule(chunk=128))
    h = h + layer(h)                     # each chunk of `rule.chunk` tokens reads, then writes
    saved = layer.snapshot()             # FastWeightState(keys, values, read_counts, write_mask)
    layer.rule = WriteRule(lr_values=0.5)  # a later phase writes differently; the shape is fixed
    layer.restore(saved)                 # bit for bit

Specification: docs/fwpkm.md (Zhao & Jones 2026). `FwPKMConfig` is the architecture (fixed by the
base model); `WriteRule` is how the memory learns (a setting of the phase). Naive loop reference:
`fwpkm_naive.py`; the two are compared on outputs, states after every chunk and gradients in
`tests/cl_platform/memory/test_fwpkm.py`. The product-key lookup is shared with the static PKM
(`product_keys.py`).

Shape letters: B batch, T tokens in the call, L tokens in the current chunk (≤ C), H heads,
k top-k, S sub-keys per codebook, N = S² slots, D model width, Dk key width per head
(two halves of Dh = Dk/2), Dv value width, P = B·L·H·k picks in a chunk, U ≤ P unique slots
picked (held in P-long tensors padded with the sentinel id N, so that no shape depends on data).

Why it is fast: nothing per chunk is proportional to N. Sub-keys are scored in O(√N)
(`S` per codebook); top-k runs on squared distances (−log(ε + d²) is monotonic in d²) and the
exact scores are recomputed only for the k winners; reads are `embedding_bag`s over the picked
rows; the value write touches only the U rows picked in the chunk; the addressing-loss gradient
is written in closed form over each token's top-k sub-keys. In training, where the outer loss
must flow *through* the writes, the table is never copied: writes accumulate in a compact,
differentiable overlay over the rows touched so far (`_OverlayValues`) and are committed to the
table once, detached, when the call ends.

Why it never waits for the device: every shape is fixed by (B, T) and the config, and nothing in
a call reads a tensor's value on the host except one check at its end (`fwpkm_chunked`). The
unique slots of a chunk come from a sort padded to P (`padded_unique`), the write mask and the
finiteness checks are selects (through indices and `torch.where`, never a product with a mask:
NaN·0 = NaN), and a non-finite write is recorded on the device and reported once. So the core (`fwpkm_core`) can be captured as one graph (`torch.compile` with
`fullgraph=True`, CUDA graphs), and eager calls on a GPU queue kernels without stalls.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cl_platform.check import check, is_int, is_number
from cl_platform.memory.norm import RMSNorm
from cl_platform.memory.product_keys import IDW_EPS, Lookup, SubKeys, product_key_lookup

ENTROPY_EPS = 1e-8  # inside the log of the addressing entropy
ZSCORE_EPS = 1e-6

Persistence = Literal["persist", "reset_per_call"]


@dataclass
class FwPKMConfig:
    """FwPKM architecture: what the slow weights are shaped and trained around, fixed by the base
    model. Defaults are the spec's `small` column (paper values in comments)."""

    num_subkeys: int = 128  # S; slots N = S² (paper 512)
    d_key: int = 128  # d_k per head, split into two halves (paper 512)
    d_value: int = 128  # d_v (paper 512)
    heads: int = 1
    topk: int = 8
    gate: bool = True  # off: g ≡ 1, so o = v̂ and every token writes with full weight
    target_norm: bool = True  # z-score v over features

    def __post_init__(self) -> None:
        check(is_int(self.num_subkeys, 1), self, "num_subkeys", "must be a positive int")
        check(is_int(self.d_key, 2) and self.d_key % 2 == 0, self, "d_key", "must be a positive even int (split into two halves)")
        check(is_int(self.d_value, 2), self, "d_value", "must be an int ≥ 2")
        check(is_int(self.heads, 1), self, "heads", "must be an int ≥ 1")
        check(is_int(self.topk, 1) and self.topk <= self.num_subkeys, self, "topk", f"must be an int in 1..num_subkeys={self.num_subkeys}")
        for name in ("gate", "target_norm"):
            check(isinstance(getattr(self, name), bool), self, name, "must be true or false")

    @property
    def num_slots(self) -> int:
        return self.num_subkeys * self.num_subkeys


@dataclass(frozen=True)
class WriteRule:
    """How the fast weights learn: a setting of the phase (pretraining, continual learning), not
    of the architecture, so a continual phase can change it on a fixed base. Frozen, so that one
    rule can be shared by many layers; give a layer a new one with `layer.rule = WriteRule(...)`."""

    lr_values: float = 1.0  # η
    lr_keys: float = 1.0  # η_K
    addr_weight: float = 1.0  # λ
    chunk: int = 128  # C: tokens per write (paper 512)
    lookahead: bool = True  # value target y_t = v_{t+1} (off: y_t = v_t)
    # "persist": the state carries over between calls until reset/restore (the paper's protocol).
    # "reset_per_call": every forward starts from a fresh initialisation (episodic use, e.g. NIAH).
    persistence: Persistence = "persist"

    def __post_init__(self) -> None:
        for name in ("lr_values", "lr_keys", "addr_weight"):
            check(is_number(getattr(self, name), 0), self, name, "must be a finite number ≥ 0")
        check(is_int(self.chunk, 2), self, "chunk", "must be an int ≥ 2")
        check(isinstance(self.lookahead, bool), self, "lookahead", "must be true or false")
        check(self.persistence in ("persist", "reset_per_call"), self, "persistence", "must be one of 'persist', 'reset_per_call'")


class FastWeightState(NamedTuple):
    """The whole fast state of one layer, as a value. `FwPKM.snapshot()` returns a copy,
    `FwPKM.restore()` puts one back, `fwpkm_chunked` changes keys, values and read counts in place."""

    keys: Tensor  # (H, 2, S, Dh) float32 codebooks
    values: Tensor  # (N, Dv) float32 value table
    read_counts: Tensor  # (N,) int64 reads per slot since the last `reset_read_counts()`
    write_mask: Tensor  # (N,) bool; False rows never change


def memory_to_state(snapshot: list[FastWeightState] | None) -> list[tuple] | None:
    """A `snapshot_memory()` list as plain tuples of copies, for a strategy's `state_dict`."""
    return None if snapshot is None else [tuple(t.clone() for t in s) for s in snapshot]


def memory_from_state(state: list[tuple] | None) -> list[FastWeightState] | None:
    """The inverse of `memory_to_state`."""
    return None if state is None else [FastWeightState(*(t.clone() for t in s)) for s in state]


class NonFiniteWriteError(FloatingPointError):
    """A write produced NaN/inf; raised before it touches the memory."""


def init_state(cfg: FwPKMConfig, generator: torch.Generator | None = None, device=None) -> FastWeightState:
    """Keys uniform in ±1/√d_k, values normal with std 1/√d_v (spec); no reads, every row writable."""
    bound = 1.0 / math.sqrt(cfg.d_key)
    keys = torch.empty(cfg.heads, 2, cfg.num_subkeys, cfg.d_key // 2, device=device)
    keys.uniform_(-bound, bound, generator=generator)
    values = torch.empty(cfg.num_slots, cfg.d_value, device=device)
    values.normal_(0.0, 1.0 / math.sqrt(cfg.d_value), generator=generator)
    read_counts = torch.zeros(cfg.num_slots, dtype=torch.long, device=device)
    write_mask = torch.ones(cfg.num_slots, dtype=torch.bool, device=device)
    return FastWeightState(keys, values, read_counts, write_mask)


def zscore(v: Tensor) -> Tensor:
    """(v − mean) / (std + 1e-6) over features, std unbiased (as `torch.std`, written out: 4× faster on CPU)."""
    c = v - v.mean(-1, keepdim=True)
    std = (c.pow(2).sum(-1, keepdim=True) / (v.shape[-1] - 1)).sqrt()
    return c / (std + ZSCORE_EPS)


class Slots(NamedTuple):
    """The distinct ids among P picks, in P-long tensors: U ids then padding."""

    ids: Tensor  # (P,) sorted distinct ids, then the sentinel n
    inv: Tensor  # (P,) each pick's position in `ids`
    counts: Tensor  # (P,) int64 picks per id; 0 on the padding


def padded_unique(flat: Tensor, n: int) -> Slots:
    """`torch.unique(flat, return_inverse=True, return_counts=True)` padded to P = len(flat) with
    the sentinel `n` (> every id), so that no shape and no host read depends on how many ids are
    distinct: sort, mark where a new value starts, the running count of marks is each sorted pick's
    position among the distinct ids, and scattering it back through the sort order is the inverse.
    The padding is never in `inv`, so whatever indexes with it adds exactly 0 (clamp it to n − 1
    first)."""
    s, order = flat.sort()  # (P,)
    seg = F.pad((s[1:] != s[:-1]).cumsum(0), (1, 0))  # (P,) position of each sorted pick's id
    inv = torch.empty_like(seg).scatter_(0, order, seg)
    ids = torch.full_like(s, n).scatter_(0, seg, s)  # picks of one id all write the same value
    counts = torch.zeros_like(seg).index_add_(0, seg, torch.ones_like(seg))
    return Slots(ids, inv, counts)


class RankSum:
    """Sums a write's statistics over data-parallel ranks, so that every rank applies the write
    the whole global batch implies and all ranks keep the same memory.

    The paper's code lets each rank write from its own shard, so memories drift apart. Here the
    slot ids of a chunk are united across ranks, and the per-slot read counts N_i, the value-write
    sums, the addressing marginals and the key gradient are all-reduced: the result equals one
    process writing from the concatenated batch. Forward values are global, and so are gradients:
    the backward of a sum all-reduces its gradient, so this rank's share receives what every
    rank's loss asks of the total (∂(Σ_r L_r)/∂total), and the slow-weight gradients summed over
    ranks — what DDP averages — equal one process's on the concatenated batch, cross-rank terms
    included. (Summing the forward only would leave each rank the gradient of its own loss through
    its own share: the cross terms, and for a term every rank computes from the global totals,
    all but 1/world of it, would be missing.)
    """

    def __init__(self, group=None):
        import torch.distributed as dist

        self.dist, self.group = dist, group

    def widest_batch(self, batch: int, device) -> int:
        """The largest batch size B over ranks: once per call (one host read), because ranks may
        hold batches of different sizes; the sequence length is the same on every rank (else
        their chunk loops, and so their collectives, would not pair up)."""
        size = torch.tensor([batch], device=device)
        sizes = [torch.zeros_like(size) for _ in range(self.dist.get_world_size(self.group))]
        self.dist.all_gather(sizes, size, group=self.group)
        return int(torch.cat(sizes).max())

    def union(self, ids: Tensor, n: int, width: int) -> Tensor:
        """ids (P,) this rank's sorted distinct ids padded with the sentinel `n` → (world·width,)
        the sorted union over ranks, padded with `n`; `width` ≥ every rank's P (from
        `widest_batch`), so no lengths are exchanged per chunk."""
        padded = F.pad(ids, (0, width - ids.numel()), value=n)
        parts = [torch.empty_like(padded) for _ in range(self.dist.get_world_size(self.group))]
        self.dist.all_gather(parts, padded, group=self.group)
        return padded_unique(torch.cat(parts), n).ids

    def sum(self, t: Tensor) -> Tensor:
        return _SumOverRanks.apply(t, self.group)  # without a graph: the forward alone


class _SumOverRanks(torch.autograd.Function):
    """all_reduce(SUM) whose backward all-reduces the gradient: the derivative of Σ_r t_r with
    respect to each rank's t_r is the identity, applied to the sum of every rank's gradient."""

    @staticmethod
    def forward(ctx, t: Tensor, group) -> Tensor:
        import torch.distributed as dist

        ctx.group = group
        total = t.detach().clone()
        dist.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad: Tensor):
        import torch.distributed as dist

        total = grad.clone()
        dist.all_reduce(total, group=ctx.group)
        return total, None


_ONE_PROCESS = False  # set by `one_process()`


@contextlib.contextmanager
def one_process():
    """Within it, FwPKM writes are this process's own, not summed over data-parallel ranks: for work
    that one rank does alone while the process group lives (rank 0 measuring a base's probe), where
    a sum would wait for ranks that are not computing, or add theirs."""
    global _ONE_PROCESS
    before, _ONE_PROCESS = _ONE_PROCESS, True
    try:
        yield
    finally:
        _ONE_PROCESS = before


def data_parallel_reducer() -> RankSum | None:
    """A `RankSum` when running under torch.distributed with more than one rank (outside
    `one_process`), else None."""
    import torch.distributed as dist

    if not _ONE_PROCESS and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return RankSum()
    return None


def addressing_step(sub: SubKeys, keys: Tensor, rule: WriteRule, ranks: RankSum | None = None) -> tuple[Tensor, Tensor]:
    """Addressing loss of one chunk and its gradient w.r.t. the keys, in closed form.

    L = λ Σ_{h,m} −H(p̄^{h,m}),  p̄ = mean over the chunk's M tokens of softmax over each token's
    top-k sub-scores, H(p) = −Σ p log(p + 1e-8). With G_s = ∂L/∂p̄_s = λ(log(p̄_s + 1e-8) + p̄_s/(p̄_s + 1e-8)):
      ∂L/∂s_tj = p_tj (G_{s_tj} − Σ_l p_tl G_{s_tl}) / M,   ∂s/∂K = 2 (q − K) / (ε + d²),
    so ∂L/∂K_s = Σ_t c_ts q_t − (Σ_t c_ts) K_s with c = 2 ∂L/∂s / (ε + d²): one (S × M)·(M × Dh)
    matmul per codebook, no per-pick copy of the keys. Shapes come from `keys` (H, 2, S, Dh); of
    the rule only λ = `rule.addr_weight` enters.
    Returns (loss (), grad (H, 2, S, Dh)); both stay differentiable in q and the keys.
    """
    H, _, S, Dh = keys.shape
    M = sub.idx.shape[0]
    p = torch.softmax(-torch.log(IDW_EPS + sub.d2), dim=-1)  # (M, H, 2, k)
    flat = sub.idx + (torch.arange(H * 2, device=p.device) * S).view(H, 2, 1)  # (M, H, 2, k) ids in H·2·S
    psum = torch.zeros(H * 2 * S, dtype=p.dtype, device=p.device).index_add(0, flat.reshape(-1), p.reshape(-1))
    M_all = M  # tokens behind the marginal: this call's, or every rank's
    if ranks is not None:
        M_all = ranks.sum(torch.tensor(M, device=p.device))  # a tensor: no host read
        psum = ranks.sum(psum)
    pbar = psum / M_all
    logp = torch.log(pbar + ENTROPY_EPS)
    loss = rule.addr_weight * (pbar * logp).sum()  # = λ Σ −H(p̄)
    G = rule.addr_weight * (logp + pbar / (pbar + ENTROPY_EPS))  # (H·2·S,)
    g_sel = G[flat]
    ds = p * (g_sel - (p * g_sel).sum(-1, keepdim=True)) / M_all  # (M, H, 2, k)
    coef = ds * (2.0 / (IDW_EPS + sub.d2))
    A = torch.zeros(M, H, 2, S, dtype=p.dtype, device=p.device).scatter_add(-1, sub.idx, coef)  # (M, H, 2, S)
    A = A.permute(1, 2, 3, 0).reshape(H * 2, S, M)
    q_hc = sub.q.permute(1, 2, 0, 3).reshape(H * 2, M, Dh)
    grad = torch.bmm(A, q_hc) - A.sum(-1, keepdim=True) * keys.reshape(H * 2, S, Dh)
    if ranks is not None:
        grad = ranks.sum(grad)
    return loss, grad.view(H, 2, S, Dh)


class _InPlaceValues:
    """Adaptation / evaluation: reads see the table, writes scatter into it in place (no graph)."""

    def __init__(self, table: Tensor):
        self.table = table
        self.last = table.shape[0] - 1

    def read(self, idx: Tensor, ids: Tensor, inv: Tensor, w: Tensor) -> Tensor:
        """idx, w (M, k); ids (P,) their distinct ids padded with N, inv (M, k) positions in ids
        → Σ_j w_j V[idx_j] (M, Dv)."""
        return F.embedding_bag(idx, self.table, per_sample_weights=w, mode="sum")

    def write(self, ids: Tensor, delta: Tensor) -> None:
        """ids (P,) padded with N, delta (P, Dv) zero on the padding."""
        self.table.index_add_(0, ids.clamp(max=self.last), delta)

    def commit(self, ok: Tensor) -> None:
        pass  # every write has landed; a failed chunk's was a zero

    def current(self) -> Tensor:
        """The table as the next chunk reads it (a copy: tests and inspection only)."""
        return self.table.detach().clone()


class _Run(NamedTuple):
    ids: Tensor  # (n,) sorted slot ids, padded with N
    delta: Tensor  # (n, Dv) differentiable accumulated writes to them (zero on the padding)
    chunks: int  # how many chunk writes it holds


class _OverlayValues:
    """Training: the table is read-only during the call; chunk writes accumulate in a
    differentiable overlay of the rows touched so far, so later chunks' reads carry gradients back
    into earlier writes without any N-sized copy.

    The overlay is a list of sorted runs merged like a binary counter (two runs holding the same
    number of chunks merge into one): a row takes part in O(log chunks) merges and a read looks up
    O(log chunks) runs, so a call costs O(chunks · P · log chunks) instead of the O(chunks² · P)
    of one run re-merged after every chunk (3× slower at 32 chunks of 128 tokens). A run of j
    chunks is j·P long whatever it holds, so its shape depends only on the chunk index. Runs merge
    when a read needs them, so the last chunk's write merges nothing: the commit adds each run.
    """

    def __init__(self, table: Tensor):
        self.table = table
        self.last = table.shape[0] - 1
        self.runs: list[_Run] = []

    def read(self, idx: Tensor, ids: Tensor, inv: Tensor, w: Tensor) -> Tensor:
        # Gather the chunk's rows first: autograd then saves this (P, Dv) copy, not the table,
        # which `commit` later changes in place.
        rows = self.table[ids.clamp(max=self.last)]
        self._merge()
        for run in self.runs:
            pos = torch.searchsorted(run.ids, ids).clamp_(max=run.ids.numel() - 1)
            hit = (run.ids[pos] == ids).unsqueeze(-1)
            rows = rows + run.delta[pos] * hit  # a product is safe: a run holds only finite writes
        return F.embedding_bag(inv, rows, per_sample_weights=w, mode="sum")

    def write(self, ids: Tensor, delta: Tensor) -> None:
        self.runs.append(_Run(ids, delta, 1))

    def _merge(self) -> None:
        while len(self.runs) > 1 and self.runs[-1].chunks == self.runs[-2].chunks:
            b, a = self.runs.pop(), self.runs.pop()
            # The sentinel N is an id like any other here: its rows are zero in both runs.
            both = padded_unique(torch.cat([a.ids, b.ids]), self.last + 1)
            n = a.ids.numel()
            merged = a.delta.new_zeros(both.ids.numel(), a.delta.shape[1])
            merged.index_add_(0, both.inv[:n], a.delta).index_add_(0, both.inv[n:], b.delta)
            self.runs.append(_Run(both.ids, merged, a.chunks + b.chunks))

    def commit(self, ok: Tensor) -> None:
        """Add the call's writes to the table, or nothing where `ok` () is False (a failed call
        leaves the table as it was, decided on the device)."""
        with torch.no_grad():
            for run in self.runs:
                # Finite (a failed chunk wrote zeros), so a product with `ok` is an exact select.
                self.table.index_add_(0, run.ids.clamp(max=self.last), run.delta.detach() * ok)

    def current(self) -> Tensor:
        """The table as the next chunk reads it, differentiable through the writes (an N-sized
        copy: tests and inspection only)."""
        out = self.table.detach().clone()
        for run in self.runs:
            out = out.index_add(0, run.ids.clamp(max=self.last), run.delta)
        return out


class ChunkedOutput(NamedTuple):
    vhat: Tensor  # (B, T, Dv) read-outs, each from the state before its chunk's write
    lookup: Lookup  # (B, T, H, ...) addressing of every token
    addr_loss: Tensor  # (chunks,) addressing loss of each chunk, pre-write (empty without writes)
    value_update_norm: Tensor  # () √(Σ over chunks of ‖ΔV‖²_F), detached (0 without writes)
    key_update_norm: Tensor  # () ‖K_after − K_before‖_F over the call, detached (0 without writes)
    # () int64: 2·chunk + (0 values, 1 keys) of the first non-finite write, −1 if none; that
    # chunk's write and every later one were dropped (`fwpkm_chunked` raises on it)
    fault: Tensor


class ChunkRecord(NamedTuple):
    """What `on_chunk` sees after chunk `index` has been read and (if writing) written: the state
    the next chunk reads, as copies. In training both carry the graph back to q, v, g of earlier
    chunks (tests differentiate through them); detach them to keep them."""

    index: int
    keys: Tensor  # (H, 2, S, Dh)
    values: Tensor  # (N, Dv)
    addr_loss: Tensor | None


def fwpkm_chunked(
    q: Tensor,
    v: Tensor,
    g: Tensor,
    state: FastWeightState,
    config: FwPKMConfig,
    rule: WriteRule,
    *,
    write: bool = True,
    on_chunk: Callable[[ChunkRecord], None] | None = None,
    name: str = "fwpkm",
    ranks: RankSum | None = None,
    extra: Tensor | None = None,
    correct_extra: bool = True,
) -> ChunkedOutput:
    """Core FwPKM math over one call: chunked reads, each followed by that chunk's write.

    q (B, T, H·Dk), v (B, T, Dv) (already z-scored if the config says so), g (B, T) gates.
    `state` is changed in place, all of it the same way: `keys` and `values` get the writes,
    detached, and `read_counts` += this call's reads; rows where `write_mask` is False never
    change. Without a graph each chunk's write lands at once; with one (grad enabled and q, v or
    g requiring grad) the reads of chunk c+1 are differentiable functions of q, v, g of chunks
    ≤ c (training through the writes) and the writes land together when the call ends.
    `ranks`: sum the writes (and read counts) over data-parallel ranks (see `RankSum`).
    `extra` (B, T, Dv): a read-out of another memory that adds to this one's (`FwPKM.extra_read`);
    with `correct_extra` the writes correct the sum, so this memory learns what the other does not
    hold; without it they correct this memory's own read-out, as if the other were absent.
    Returns the read-outs, the addressing and the write statistics; raises `NonFiniteWriteError`
    if a write was not finite, with the memory as it was before that chunk (with a graph: as it
    was before the call). This is `fwpkm_core` and its one host read.
    """
    out = fwpkm_core(q, v, g, state, config, rule, write=write, on_chunk=on_chunk, ranks=ranks, extra=extra,
                     correct_extra=correct_extra)
    if write:
        _raise_on_fault(out.fault, name)
    return out


def fwpkm_core(
    q: Tensor,
    v: Tensor,
    g: Tensor,
    state: FastWeightState,
    config: FwPKMConfig,
    rule: WriteRule,
    *,
    write: bool = True,
    on_chunk: Callable[[ChunkRecord], None] | None = None,
    ranks: RankSum | None = None,
    extra: Tensor | None = None,
    correct_extra: bool = True,
) -> ChunkedOutput:
    """`fwpkm_chunked` without the host: a non-finite write is not raised but dropped (that
    chunk's and every later one's) and reported in `ChunkedOutput.fault`. Nothing here reads a
    tensor on the host and every shape follows from (B, T) and the config, so it compiles as one
    graph (`torch.compile(fwpkm_core, fullgraph=True)`). With `ranks`, the ranks' batch sizes are
    read once per call (`RankSum.widest_batch`), and nothing per chunk."""
    B, T, _ = q.shape
    H, k, Dh, N = config.heads, config.topk, config.d_key // 2, config.num_slots
    qh = q.view(B, T, H, 2 * Dh)
    graph = torch.is_grad_enabled() and (q.requires_grad or v.requires_grad or g.requires_grad)
    store = _OverlayValues(state.values) if graph and write else _InPlaceValues(state.values)
    # With a graph the keys of the call are a copy that the graph saves (O(√N)), so `state.keys`
    # can be updated in place at the end; without one they are `state.keys`, written per chunk.
    keys = state.keys.clone() if graph else state.keys
    keys_before = keys if graph or not write else keys.clone()
    # Without writes every token reads the same state: one pass over the whole call.
    step = min(rule.chunk, T) if write else T
    vhats, looks, addr_losses = [], [], []
    widest = ranks.widest_batch(B, q.device) if ranks is not None else B
    update_sq = q.new_zeros(())
    ok = torch.ones((), dtype=torch.bool, device=q.device)  # () every write so far was finite
    oks, values_oks = [], []  # per chunk: ok after it, and whether its value write was finite
    for ci, c0 in enumerate(range(0, T, step)):
        c1 = min(c0 + step, T)
        L = c1 - c0
        look, sub = product_key_lookup(qh[:, c0:c1], keys, k)  # (B, L, H, k)
        slots = padded_unique(look.idx.reshape(-1), N)  # (P,) each
        vhat = store.read(look.idx.view(-1, k), slots.ids, slots.inv.view(-1, k), look.weights.reshape(-1, k))  # (B·L·H, Dv)
        vhat = vhat.view(B, L, H, -1).mean(2)  # heads share the table; their read-outs average
        read = vhat if extra is None else vhat + extra[:, c0:c1]
        if correct_extra:
            vhat = read  # the writes' error is the read-out's
        vhats.append(read)
        looks.append(look)
        # Slots of the write: this call's own picks, or their union over ranks; `pick_row` maps
        # every pick to its row among them and `counts` becomes the global N_i.
        ids, pick_row, counts = slots
        if ranks is not None:
            ids = ranks.union(slots.ids, N, widest * L * H * k)
            pick_row = torch.searchsorted(ids, slots.ids)[slots.inv]
            counts = ranks.sum(torch.zeros_like(ids).index_add_(0, pick_row, torch.ones_like(pick_row)))
        rows = ids.clamp(max=N - 1)  # the padding indexes a real row, with a zero count and delta
        state.read_counts.index_add_(0, rows, counts * ok)  # a failed chunk's reads still count
        addr = None
        if write:
            # Value target and validity: with look-ahead, y_t = v_{t+1} inside the chunk only.
            if rule.lookahead:
                y = v[:, c0 + 1 : c1]
                err = vhat[:, :-1] - y  # (B, L−1, Dv)
                coef = g[:, c0 : c1 - 1, None, None] * look.weights[:, :-1]  # (B, L−1, H, k)
                pick_idx = pick_row.view(B, L, H, k)[:, :-1]
            else:
                err = vhat - v[:, c0:c1]
                coef = g[:, c0:c1, None, None] * look.weights
                pick_idx = pick_row.view(B, L, H, k)
            # ΔV_i = −η·kH/N_i · ∂/∂V_i ½ Σ g‖v̂ − y‖², with v̂ = mean_h Σ_j w V[idx] so that
            # ∂/∂V_i = Σ over i's picks of g·w/H·(v̂ − y). The per-row factor is folded into the
            # (small) per-pick coefficients before the scatter.
            row_scale = (-rule.lr_values * k * H) / counts.clamp(min=1).to(coef.dtype)  # (P,)
            coef = coef * (row_scale[pick_idx] / H)
            contrib = coef.unsqueeze(-1) * err[:, :, None, None, :]  # (B, L', H, k, Dv)
            # Two rows past the n slot rows: picks of frozen rows add into row n, so frozen rows
            # get exactly 0 and a non-finite contribution to them is dropped, never multiplied by
            # 0 (NaN·0 = NaN); row n + 1 stays 0 for a failed chunk to write. Both are selects
            # through indices: no extra pass over a (P, Dv) tensor, which `torch.where` would be.
            n = ids.numel()
            sink = torch.where(state.write_mask[rows][pick_idx], pick_idx, n)
            delta = err.new_zeros(n + 2, err.shape[-1]).index_add_(
                0, sink.reshape(-1), contrib.reshape(-1, err.shape[-1])
            )  # (n + 2, Dv)
            if ranks is not None:
                delta = ranks.sum(delta)
            addr, gk = addressing_step(sub, keys, rule, ranks)
            new_keys = keys - rule.lr_keys * gk
            # ‖ΔV‖² as one dot product (no squared copy); finite iff every entry is, since NaN and
            # ±inf propagate and squares never cancel.
            flat = delta[:n].detach().reshape(-1)
            sq = torch.dot(flat, flat)
            values_ok = torch.isfinite(sq)
            ok = ok & values_ok & torch.isfinite(new_keys).all()  # () this chunk and all before it
            oks.append(ok)
            values_oks.append(values_ok)
            store.write(ids, delta.index_select(0, torch.where(ok, torch.arange(n, device=ids.device), n + 1)))
            if graph:
                keys = torch.where(ok, new_keys, keys)
            else:
                keys.copy_(torch.where(ok, new_keys, keys))
            update_sq += sq  # a failed call reports its fault, not its statistics
            addr_losses.append(addr.detach())
        if on_chunk is not None:
            on_chunk(ChunkRecord(ci, keys if graph else keys.clone(), store.current(), addr))
    store.commit(ok)
    with torch.no_grad():
        if graph and write:
            state.keys.copy_(torch.where(ok, keys, state.keys))
        key_norm = (keys.detach() - keys_before).norm() if write else q.new_zeros(())
    vhat = torch.cat(vhats, dim=1)
    look = Lookup(*(torch.cat(parts, dim=1) for parts in zip(*looks)))
    addr_t = torch.stack(addr_losses) if addr_losses else q.new_zeros(0)
    return ChunkedOutput(vhat, look, addr_t, update_sq.sqrt(), key_norm, _first_fault(oks, values_oks, q.device))


def _first_fault(oks: list[Tensor], values_oks: list[Tensor], device) -> Tensor:
    """() int64 `ChunkedOutput.fault` from each chunk's ok (True up to the first failed chunk,
    then False) and value-write finiteness: one pass per call, not per chunk."""
    if not oks:
        return torch.full((), -1, dtype=torch.long, device=device)
    ok = torch.stack(oks)  # (chunks,)
    first = ok.sum()  # chunks before the first failure
    at = first.clamp(max=len(oks) - 1)
    # `take`, not `[at]`: indexing with a 0-dim tensor reads it on the host
    code = 2 * first + torch.stack(values_oks).take(at).long()  # keys failed iff values were finite
    return torch.where(ok[-1], -1, code)


def _raise_on_fault(fault: Tensor, name: str) -> None:
    """The call's one host read: raise for the first non-finite write `fwpkm_core` recorded."""
    code = int(fault)
    if code >= 0:
        chunk, part = divmod(code, 2)
        raise NonFiniteWriteError(
            f"{name}: non-finite {('value', 'key')[part]} write in chunk {chunk}; memory left unchanged from this chunk on"
        )


class FwPKM(nn.Module):
    """FwPKM residual sub-block: `h = h + FwPKM(h)`, placed before the token mixer.

    Slow weights (trained by the outer optimiser): RMSNorms and projections for q, v, g, o.
    Fast state (buffers, never in the optimiser): `keys`, `values`, `read_counts`, `write_mask`,
    together a `FastWeightState` (`snapshot()` / `restore()` / `reset()`). Public slot knobs for
    strategies: `write_mask` (N,) bool, `read_counts` (N,) int64 since `reset_read_counts()`,
    `usage_stats()`, `reset_slots(ids)`, `clear_slots(ids)`, `extra_read`, `observer` and
    `writes_enabled`.
    `config` (the architecture) is
    fixed; `rule` (a `WriteRule`) may be replaced between calls and says how later calls write.
    `calls` and `writes` count forward calls (reads of a context) and chunk writes since
    construction or `reset_counters()`: plain ints, not state (protocols such as n-iter reading
    assert them).
    `extra_read`: None, or a callable (queries (B, T, H·Dk) → read-out (B, T, Dv)) of a read-only
    memory read beside the fast one (strategies/slot_transfer.py); its read-out adds to the fast
    read-out, and the fast writes correct the sum (`extra_corrected` True, the default) or the
    fast read-out alone (False: the fast memory learns as if the other were absent, and the other's
    content stays in every read). Not part of the state_dict: its owner saves both.
    `observer`: None, or a callable (layer, gates (B, T), slot ids (B, T, H, k), read weights
    (B, T, H, k)) told after every call which slots each token addressed (with the keys of its own
    chunk) and how far its gate opened; detached tensors, to read, never to change
    (cl_platform/memory_recorder.py).
    """

    def __init__(self, d_model: int, config: FwPKMConfig, rule: WriteRule | None = None, name: str = "fwpkm"):
        super().__init__()
        if rule is not None and not isinstance(rule, WriteRule):
            raise TypeError(f"FwPKM {name}: rule must be a WriteRule, got {type(rule).__name__}")
        cfg = self.config = config
        self.rule = rule if rule is not None else WriteRule()
        self.name = name
        self.writes_enabled = True
        self.calls, self.writes = 0, 0
        self.extra_read = None
        self.extra_corrected = True
        self.observer = None
        # (B, T, Dq) -> (B, T, Dq), applied to the queries before the memory reads them: an
        # intervention (clp niah's address patching reads a question with a needle's queries).
        self.query_patch = None
        Dq = cfg.d_key * cfg.heads
        self.norm_q, self.norm_v, self.norm_g = RMSNorm(d_model), RMSNorm(d_model), RMSNorm(d_model)
        self.proj_q = nn.Linear(d_model, Dq)
        self.proj_v = nn.Linear(d_model, cfg.d_value)
        self.proj_g = nn.Linear(d_model, 1)
        self.norm_o = RMSNorm(cfg.d_value)
        self.proj_o = nn.Linear(cfg.d_value, d_model)
        state = init_state(cfg)
        self.register_buffer("keys", state.keys)
        self.register_buffer("values", state.values)
        self.register_buffer("write_mask", state.write_mask)
        self.register_buffer("read_counts", state.read_counts)
        self._stats: dict[str, Tensor] = {}

    # --- fast-weight state: explicit operations ---------------------------------------------
    def _state(self) -> FastWeightState:
        """The live buffers (not copies)."""
        return FastWeightState(self.keys, self.values, self.read_counts, self.write_mask)

    def snapshot(self) -> FastWeightState:
        """A detached copy of the whole fast state."""
        return FastWeightState(*(t.detach().clone() for t in self._state()))

    def restore(self, state: FastWeightState) -> None:
        """Put a snapshot back, all four parts, bit for bit."""
        if not isinstance(state, FastWeightState):
            raise TypeError(f"{self.name}.restore: expected a FastWeightState, got {type(state).__name__}")
        for field, live, saved in zip(FastWeightState._fields, self._state(), state):
            if live.shape != saved.shape:
                raise ValueError(f"{self.name}.restore: {field} has shape {tuple(saved.shape)}, the layer {tuple(live.shape)}")
        with torch.no_grad():
            for live, saved in zip(self._state(), state):
                live.copy_(saved)

    def reset(self, generator: torch.Generator | None = None) -> None:
        """Re-draw keys and values from the initialisation (`init_state`). Read counts and the
        write mask are kept as they are: they are a strategy's bookkeeping and policy, not memory
        content (`reset_read_counts()` clears the counts)."""
        fresh = init_state(self.config, generator, device=self.keys.device)
        with torch.no_grad():
            self.keys.copy_(fresh.keys)
            self.values.copy_(fresh.values)

    def reset_slots(self, slot_ids: Tensor, generator: torch.Generator | None = None) -> None:
        """Re-initialise the given value rows (keys are shared by many slots and stay)."""
        fresh = torch.empty(slot_ids.numel(), self.config.d_value, device=self.values.device, dtype=self.values.dtype)
        fresh.normal_(0.0, 1.0 / math.sqrt(self.config.d_value), generator=generator)
        with torch.no_grad():
            self.values[slot_ids] = fresh

    def clear_slots(self, slot_ids: Tensor) -> None:
        """Set the given value rows to zero (free them: a zero row adds nothing to a read-out)."""
        with torch.no_grad():
            self.values[slot_ids] = 0.0

    def reset_read_counts(self) -> None:
        self.read_counts.zero_()

    def reset_counters(self) -> None:
        self.calls, self.writes = 0, 0

    def usage_stats(self) -> dict[str, float]:
        """Addressing health over reads since `reset_read_counts()` (O(N); call for logging only).

        coverage = #{N_i > 0}/N; collision = Σ_{N_i>1} N_i / Σ N_i; kl_uniform = KL(usage ‖ uniform).
        """
        n = self.read_counts.double()
        total = n.sum()
        if total == 0:
            return {"coverage": 0.0, "collision_rate": 0.0, "kl_uniform": float("nan")}
        p = n[n > 0] / total
        return {
            "coverage": float((n > 0).double().mean()),
            "collision_rate": float(n[n > 1].sum() / total),
            "kl_uniform": float((p * torch.log(p * n.numel())).sum()),
        }

    @property
    def last_stats(self) -> dict[str, float]:
        """Last call: mean gate, ‖ΔV‖ and ‖ΔK‖ over its writes, mean addressing loss."""
        return {k: float(v) for k, v in self._stats.items()}

    # --- forward -----------------------------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        """x (B, T, D) → residual update (B, T, D)."""
        cfg, rule = self.config, self.rule
        if rule.persistence == "reset_per_call":
            self.reset()
        dt = self.values.dtype  # memory math runs in the fast weights' dtype (float32 under autocast)
        q = self.proj_q(self.norm_q(x)).to(dt)
        if self.query_patch is not None:  # an intervention on where tokens read (and write): clp niah's patching
            q = self.query_patch(q)
        v = self.proj_v(self.norm_v(x)).to(dt)
        if cfg.target_norm:
            v = zscore(v)
        if cfg.gate:
            g = torch.sigmoid(self.proj_g(self.norm_g(x)).to(dt).squeeze(-1))  # (B, T)
        else:
            g = torch.ones(x.shape[:2], dtype=dt, device=x.device)
        # Lookup, read-out and writes stay float32 under autocast: bfloat16 scores would change
        # the top-k picks, and an 8-bit mantissa cannot hold a small write on top of a value.
        with torch.autocast(device_type=x.device.type, enabled=False):
            extra = self.extra_read(q) if self.extra_read is not None else None
            out = fwpkm_chunked(
                q, v, g, self._state(), cfg, rule,
                write=self.writes_enabled, name=self.name, ranks=data_parallel_reducer(), extra=extra,
                correct_extra=self.extra_corrected,
            )
        self.calls += 1
        self.writes += out.addr_loss.numel()  # one addressing loss per chunk written
        # Kept as tensors (no device sync in the hot path); `last_stats` converts on demand.
        self._stats = {"gate_mean": g.detach().mean(), "value_update_norm": out.value_update_norm}
        if self.writes_enabled:
            self._stats["key_update_norm"] = out.key_update_norm
            self._stats["addr_loss"] = out.addr_loss.mean()
        if self.observer is not None:
            self.observer(self, g.detach(), out.lookup.idx.detach(), out.lookup.weights.detach())
        vhat = out.vhat
        o = g.unsqueeze(-1) * vhat + (1 - g).unsqueeze(-1) * v if cfg.gate else vhat
        return self.proj_o(self.norm_o(o.to(x.dtype)))

    def extra_repr(self) -> str:
        c = self.config
        return f"name={self.name}, slots={c.num_slots}, heads={c.heads}, topk={c.topk}, rule={self.rule}"
