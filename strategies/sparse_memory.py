"""Sparse memory finetuning (Lin et al. 2025, "Continual learning via sparse memory finetuning"):
the published memory-layer baseline in `finetune` mode. Only a static PKM's value rows learn, and
of those only the few each batch uses more than the model's background does; every other slow
weight stays as pretrained.

    strategy: {name: sparse_memory, kwargs: {slots: 500, score: tfidf, background: 64, length: 256}}

Per training batch and static PKM layer (`model.pkm_layers`):
- c(i): the batch's reads of slot i, over every token, head and top-k pick (the PKM's
  `record_reads` knob);
- a score per slot read in the batch (`score`):
  - `tfidf` (the paper's): c(i) / Σ_j c(j) · ln((D + 1) / (df(i) + 1)), D the background's texts
    and df(i) how many of them read slot i;
  - `kl` (the KL-based rule of the later sparse-memory-finetuning work, SMF-ICML):
    p(i) · ln(p(i) / q(i)), p = c / Σ c and q the background's reads add-one smoothed over the N
    slots, (r(i) + 1) / (Σ r + N);
  - `tf`: c(i) alone (the paper's ablation: it learns as much and forgets more);
- the `slots` best-scoring read slots keep their value rows' gradient (ties towards the lower
  slot id); every other gradient in the model is dropped, so the run's optimiser (lazy Adam on
  the sparse rows, `cl_platform.optim.MixedAdamW`) moves those rows and nothing else. Keys,
  queries, the other rows, the FwPKM layers' slow weights and every dense weight stay frozen.
  Under data parallelism c is the global batch's (summed over the ranks), so every rank keeps
  the same rows of the gradient DDP has already averaged.

`SlotChoice` is the choice alone (background, scores, top-t, the gradient mask); `distill`'s
consolidation into a static PKM (`params: pkm, slots: t`) uses it too.

The background. The paper counts df over 1,000 batches of pretraining data (DCLM), so that slots
every text uses (function words, formatting) are not the ones a new domain overwrites. This
platform's bases are pretrained on a corpus that is built, not shipped, and the strategy stores
no data; so the background is the base speaking: before the first experience, `background` texts
of `length` tokens sampled from the model (`cl_platform.sample`, temperature 1, seeded by
`seed`), each one background batch, read once with the memory untouched (`reading_only`). It is
computed once and kept (df per layer: N ints), so a resumed run scores with the same background.

Deviations, and why: background texts sampled from the base instead of stored pretraining
batches (above); the run's optimiser instead of the paper's SGD (reported, unverified: "adaptive
step sizes interact badly with sparsity"): lazy Adam only moments rows that get a gradient, and
the step size is the run's `cl` learning rate, chosen on dev like every other.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from cl_platform.sample import reading_only, sample
from cl_platform.strategy import Strategy, StrategyContext

SCORES = ("tfidf", "kl", "tf")


def batch_reads(reads: Tensor, num_slots: int) -> Tensor:
    """c (N,) int64: how often each slot appears among a forward's read ids (any shape)."""
    return torch.bincount(reads.reshape(-1), minlength=num_slots)


def smf_scores(counts: Tensor, df: Tensor, texts: int, reads: Tensor, score: str) -> Tensor:
    """Score (N,) float64 of every slot from one batch's reads `counts` (N,) and the background:
    `df` (N,) texts that read each slot out of `texts`, `reads` (N,) its total reads. Slots the
    batch did not read score -inf: they have no gradient to keep."""
    c = counts.double()
    if score == "tf":
        s = c.clone()
    elif score == "tfidf":
        s = c / c.sum().clamp(min=1) * torch.log((texts + 1) / (df.double() + 1))
    else:
        p = c / c.sum().clamp(min=1)
        q = (reads.double() + 1) / (reads.double().sum() + len(reads))
        s = torch.where(c > 0, p * torch.log(p.clamp(min=1e-300) / q), torch.zeros_like(p))
    return s.masked_fill(counts == 0, float("-inf"))


def top_slots(scores: Tensor, t: int) -> Tensor:
    """The ids of the `t` best finite scores (fewer if fewer are finite), ties towards the lower
    id, in ascending id order."""
    finite = torch.isfinite(scores)
    ids = torch.nonzero(finite).squeeze(1)
    if len(ids) > t:
        # a stable sort on -score keeps equal scores in id order
        order = torch.sort(-scores[ids], stable=True).indices[:t]
        ids = ids[order]
    return torch.sort(ids).values


def keep_rows(grad: Tensor, rows: Tensor) -> Tensor:
    """A row-sparse gradient (an EmbeddingBag's) with every row not in `rows` removed."""
    g = grad.coalesce()
    keep = torch.isin(g.indices()[0], rows.to(g.device))
    return torch.sparse_coo_tensor(g.indices()[:, keep], g.values()[keep], g.shape, check_invariants=False).coalesce()


class SlotChoice:
    """The rows of every static PKM that one forward reads most specifically: the `slots` best by
    `score` (module docstring), against a background of `background` texts of `length` tokens the
    model writes itself (`count_background`, once). Sparse memory finetuning chooses with it every
    training batch; `distill` (`params: pkm, slots: t`) every consolidation step."""

    def __init__(self, who: str, slots: int, score: str = "tfidf", background: int = 64, length: int = 256,
                 seed: int = 0):
        for name, value in (("slots", slots), ("background", background), ("length", length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{who}: {name} must be a positive int, got {value!r}")
        if score not in SCORES:
            raise ValueError(f"{who}: score must be one of {SCORES}, got {score!r}")
        self.who, self.slots, self.score, self.background, self.length, self.seed = who, slots, score, background, length, int(seed)
        self.df: dict[str, Tensor] = {}  # per PKM layer: (N,) background texts that read each slot
        self.reads: dict[str, Tensor] = {}  # per PKM layer: (N,) background reads of each slot

    @staticmethod
    def pkms(model) -> dict[str, Any]:
        from cl_platform.memory.pkm import PKM

        return {name: m for name, m in model.named_modules() if isinstance(m, PKM)}

    def check(self, model_config, stream=None) -> None:
        if not model_config.pkm_layers:
            raise ValueError(f"{self.who}: the model has no static PKM (model.pkm_layers is empty), so there are "
                             f"no memory slots to choose")
        n = model_config.pkm.num_slots
        if self.slots > n:
            raise ValueError(f"{self.who}: slots {self.slots} is more than the static PKM has ({n})")
        if stream is not None:
            seq_len = list(stream)[0].data.segments.seq_len
            if self.length > seq_len:
                raise ValueError(f"{self.who}: background length {self.length} is longer than the stream's "
                                 f"segments ({seq_len} tokens), the longest context the runs train the model on")

    def count_background(self, model, eot: int) -> None:
        """df and total reads per PKM layer over `background` texts sampled from the model, each
        read once as a background batch, the run left as it was."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + 11)
        texts = sample(model, self.background, self.length, generator=g, start=eot)  # (D, length + 1)
        layers = self.pkms(model)
        device = next(model.parameters()).device
        df = {name: torch.zeros(m.config.num_slots, dtype=torch.long) for name, m in layers.items()}
        reads = {name: torch.zeros(m.config.num_slots, dtype=torch.long) for name, m in layers.items()}
        with reading_only(model), torch.no_grad():
            self.record(model, True)
            try:
                for row in texts:
                    model(row[None, :-1].to(device))  # one text, one background batch
                    for name, m in layers.items():
                        c = batch_reads(m.last_reads, m.config.num_slots).cpu()
                        df[name] += (c > 0).long()
                        reads[name] += c
            finally:
                self.record(model, False)
        self.df, self.reads = df, reads

    def record(self, model, on: bool) -> None:
        """Switch every static PKM's `record_reads` (off also drops the last forward's ids)."""
        for m in self.pkms(model).values():
            m.record_reads = on
            if not on:
                m.last_reads = None

    def choose(self, model) -> dict[str, Tensor]:
        """Per static PKM, the chosen rows for the reads of its last forward (ids on the host).
        Under data parallelism the counts are summed over the ranks first: DDP has already
        averaged the gradients, so a rank that chose other rows would step the same table
        differently from its peers."""
        from cl_platform.memory.fwpkm import data_parallel_reducer

        ranks = data_parallel_reducer()
        out = {}
        for name, m in self.pkms(model).items():
            if not m.record_reads or m.last_reads is None:
                raise RuntimeError(f"{self.who}: the static PKM {name} recorded no reads in this forward "
                                   f"(switch `record_reads` on before it)")
            counts = batch_reads(m.last_reads, m.config.num_slots)
            if ranks is not None:  # the global batch's reads: every rank chooses the same rows
                counts = ranks.sum(counts)
            counts = counts.cpu()
            out[name] = top_slots(smf_scores(counts, self.df[name], self.background, self.reads[name], self.score),
                                  self.slots)
        return out

    def mask(self, model, chosen: dict[str, Tensor]) -> None:
        """Every static PKM's value gradient cut to its chosen rows."""
        for name, m in self.pkms(model).items():
            if m.values.weight.grad is not None:
                m.values.weight.grad = keep_rows(m.values.weight.grad, chosen[name])

    def state_dict(self) -> dict[str, Any]:
        return {"df": {k: v.clone() for k, v in self.df.items()}, "reads": {k: v.clone() for k, v in self.reads.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.df = {k: v.clone() for k, v in state["df"].items()}
        self.reads = {k: v.clone() for k, v in state["reads"].items()}


class SparseMemory(Strategy):
    def __init__(self, slots: int = 500, score: str = "tfidf", background: int = 64, length: int = 256,
                 seed: int = 0):
        self.choice = SlotChoice("sparse_memory", slots, score, background, length, seed)
        self.chosen: dict[str, Tensor] = {}  # per PKM layer: this batch's trainable rows
        self.trained: dict[str, Tensor] = {}  # per PKM layer: (N,) bool, rows chosen at least once
        self.steps = 0

    def check(self, model_config, mode, stream=None) -> None:
        self.choice.check(model_config, stream)
        if mode != "finetune":
            raise ValueError("sparse_memory trains a static PKM's value rows; in 'fast' mode slow weights are "
                             "frozen (use cl.mode: finetune)")

    # --- hooks ------------------------------------------------------------------------------
    def on_experience_start(self, ctx: StrategyContext) -> None:
        self.check(ctx.model.config, ctx.mode)
        if not self.choice.df:
            self.choice.count_background(ctx.model, ctx.require("current", "sparse_memory").data.segments.eot_id)
        for name, m in self.choice.pkms(ctx.model).items():
            self.trained.setdefault(name, torch.zeros(m.config.num_slots, dtype=torch.bool))

    def transform_batch(self, batch, ctx: StrategyContext):
        # Switched on before every training forward, not once at the experience start: a run
        # resumed in the middle of an experience does not start it again.
        self.choice.record(ctx.model, True)
        return batch

    def on_experience_end(self, ctx: StrategyContext) -> None:
        self.choice.record(ctx.model, False)

    def after_write(self, ctx: StrategyContext) -> None:
        # Right after the training forward: its reads are the batch's term frequencies.
        self.chosen = self.choice.choose(ctx.model)

    def after_backward(self, ctx: StrategyContext) -> None:
        values = {id(m.values.weight) for m in self.choice.pkms(ctx.model).values()}
        for p in ctx.model.parameters():
            if id(p) not in values:
                p.grad = None
        self.choice.mask(ctx.model, self.chosen)
        for name, rows in self.chosen.items():
            self.trained[name][rows] = True
        self.steps += 1

    # --- bookkeeping ------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        c = self.choice
        return {"slots_per_step": c.slots, "score": c.score, "steps": self.steps, "background_texts": c.background,
                "slots_trained": {n: int(t.sum()) for n, t in sorted(self.trained.items())},
                "background_slots_read": {n: int((d > 0).sum()) for n, d in sorted(c.df.items())}}

    def state_dict(self) -> dict[str, Any]:
        return {**self.choice.state_dict(), "trained": {k: v.clone() for k, v in self.trained.items()},
                "steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"df", "reads", "trained", "steps"}:
            raise ValueError(f"sparse_memory: state has keys {sorted(state)}, expected ['df', 'reads', 'steps', 'trained']")
        self.choice.load_state_dict(state)
        self.trained = {k: v.clone() for k, v in state["trained"].items()}
        self.steps = int(state["steps"])
