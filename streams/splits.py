"""Document-level splits of one domain: `eval` (held out), `adapt` (streamed), `pretrain`, and an
optional `dev` (held out for choosing settings).

Rule (deterministic from the stream seed and the domain name, and nothing else):
1. Permute the domain's documents with `numpy.random.default_rng([seed, crc32(name)])`.
2. Walk the permutation and fill the parts in this order, each with whole documents until its
   token budget is reached: `eval`, `adapt` (first occurrence of the domain in the stream),
   `pretrain`, `dev` (when its budget is not 0), then one fresh `adapt` part per further
   occurrence (math -> law -> math reads new math documents the second time). Eval and pretrain therefore do not depend on the stream
   order, and a document is in exactly one part.
3. Inside each part the documents are put back in source order (file order), because the
   stream-perplexity protocol reads a domain's documents in the order the corpus gives them.

A document costs its token count + 1 (the `<|endoftext|>` that precedes it in the packed stream).
The packer cuts the last document of a part so that the part has exactly its budget of tokens
(every domain then contributes the same number of training steps); see `streams/packing.py`.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field, fields

import numpy as np

from streams.errors import StreamDataError


@dataclass(frozen=True)
class TokenBudget:
    """Tokens per split for one domain (document separators included)."""

    pretrain: int = 1_024_000  # for the base model; 0 = this domain is not in pretraining
    adapt: int = 153_600  # streamed during each experience of the domain
    eval: int = 40_960  # held out, read by every evaluation
    # Held out for choosing settings (`cl.eval_split: dev`), so that the eval split, which tables
    # quote, is never used to choose them; 0 = none. At most the adapt budget.
    dev: int = 0
    # At least this many evaluation documents, each cut to its first eval // eval_docs tokens, so
    # that a domain of long documents (contracts, modules) is evaluated on many of them and
    # intervals can resample documents; 0 = whole documents until the eval budget is reached.
    # The dev split's documents are cut the same way (dev fills its budget on the cut lengths).
    eval_docs: int = 0

    def __post_init__(self):
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"token_budget.{f.name} must be a non-negative int, got {v!r}")
        for name in ("adapt", "eval"):
            if getattr(self, name) == 0:
                raise ValueError(f"token_budget.{name} must be positive (every domain is streamed and evaluated)")
        if self.eval_docs and self.eval // self.eval_docs < 16:
            raise ValueError(f"token_budget.eval_docs ({self.eval_docs}) leaves {self.eval // self.eval_docs} tokens per "
                             f"evaluation document; at most token_budget.eval // 16 = {self.eval // 16}")
        if self.dev > self.adapt:
            raise ValueError(f"token_budget.dev ({self.dev:,}) must not exceed token_budget.adapt ({self.adapt:,}): "
                             f"a development split is a held-out slice the size of (part of) one experience")

    @property
    def eval_doc_tokens(self) -> int | None:
        """Tokens kept of each evaluation document (None: whole documents)."""
        return self.eval // self.eval_docs if self.eval_docs else None


@dataclass(frozen=True)
class SplitPlan:
    """Row indices (into the domain's documents) of each split, each ascending = source order."""

    eval: np.ndarray
    adapt: list[np.ndarray]  # one part per occurrence of the domain in the stream order
    pretrain: np.ndarray
    doc_costs: np.ndarray = field(repr=False)  # tokens + 1 per document, for reporting
    dev: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))

    def all_parts(self) -> dict[str, np.ndarray]:
        parts = {"eval": self.eval, "pretrain": self.pretrain, "dev": self.dev}
        parts.update({adapt_part_name(i): rows for i, rows in enumerate(self.adapt)})
        return parts


def adapt_part_name(occurrence: int) -> str:
    """`adapt` for the first occurrence, `adapt#2`, `adapt#3`, ... for recurrences."""
    return "adapt" if occurrence == 0 else f"adapt#{occurrence + 1}"


def domain_permutation(n_docs: int, seed: int, domain: str) -> np.ndarray:
    # Mixing in the name decorrelates domains that happen to have the same number of documents.
    rng = np.random.default_rng([seed, zlib.crc32(domain.encode("utf-8"))])
    return rng.permutation(n_docs)


def plan_splits(doc_tokens: np.ndarray, budget: TokenBudget, occurrences: int, seed: int, domain: str) -> SplitPlan:
    """Assign documents to splits; `doc_tokens[i]` is the token count of document i (no separator)."""
    if occurrences < 1:
        raise ValueError(f"domain '{domain}': occurrences must be >= 1, got {occurrences}")
    costs = np.asarray(doc_tokens, dtype=np.int64) + 1
    order = domain_permutation(len(costs), seed, domain)
    cum = np.cumsum(costs[order])
    cap = budget.eval_doc_tokens
    # With eval_docs, an evaluation document costs at most its kept tokens: the eval part fills on
    # those costs (so it holds about eval_docs documents), and every later part on whole documents.
    n_eval = 0
    if cap is not None:
        eval_cum = np.cumsum(np.minimum(costs[order], cap + 1))
        n_eval = int(np.searchsorted(eval_cum, budget.eval, side="left")) + 1
        if n_eval > len(costs) or n_eval < budget.eval_docs:
            n_eval = max(n_eval, budget.eval_docs)
            if n_eval > len(costs):
                raise StreamDataError(domain, f"has {len(costs):,} documents; token_budget.eval_docs "
                                              f"{budget.eval_docs} needs at least that many for evaluation alone")
        cum = np.concatenate([eval_cum[:n_eval], eval_cum[n_eval - 1] + np.cumsum(costs[order][n_eval:])])
    # dev comes after pretrain, so a budget without one leaves every other split as it was.
    wanted = [("eval", budget.eval), ("adapt", budget.adapt), ("pretrain", budget.pretrain), ("dev", budget.dev)]
    wanted += [("adapt", budget.adapt)] * (occurrences - 1)
    total = int(cum[-1]) if len(cum) else 0
    chosen: list[np.ndarray] = []
    start, filled = 0, 0
    for name, b in wanted:
        if name == "eval" and n_eval:  # sized in documents above
            chosen.append(np.sort(order[:n_eval]))
            start, filled = n_eval, int(cum[n_eval - 1])
            continue
        if b == 0:
            chosen.append(np.empty(0, dtype=np.int64))
            continue
        if name == "dev" and cap is not None:
            # The dev split mirrors eval: documents cut to the same first tokens, so that a
            # setting chosen on dev is measured the way the eval split will measure it.
            rest = np.minimum(costs[order][start:], cap + 1)
            n_dev = int(np.searchsorted(np.cumsum(rest), b, side="left")) + 1
            if n_dev > len(rest):
                raise StreamDataError(domain, f"has too few documents left for token_budget.dev {b:,} "
                                              f"({len(rest):,} documents after the other splits)")
            chosen.append(np.sort(order[start:start + n_dev]))
            filled += int(costs[order][start:start + n_dev].sum())
            start += n_dev
            continue
        if filled + b > total:  # whole documents overshoot, so check part by part, not the sum
            need = sum(b for _, b in wanted)
            parts = " + ".join(f"{name} {b:,}" for name, b in wanted if b)
            raise StreamDataError(
                domain,
                f"too small for its token budget: {len(costs):,} documents hold {total:,} tokens "
                f"(separators included) but the splits need {parts} = {need:,} "
                f"(plus up to one document of overshoot per split); lower token_budget or add documents",
            )
        # First position where the running total reaches the budget of this part.
        end = int(np.searchsorted(cum, filled + b, side="left")) + 1
        chosen.append(np.sort(order[start:end]))
        filled = int(cum[end - 1])
        start = end
    eval_rows, first_adapt, pretrain_rows, dev_rows, *more_adapt = chosen
    return SplitPlan(eval=eval_rows, adapt=[first_adapt, *more_adapt], pretrain=pretrain_rows, doc_costs=costs,
                     dev=dev_rows)
