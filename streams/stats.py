"""Per-domain, per-split statistics of a stream config, and how different the domains' tokens are.

    clp data stats experiments/configs/streams/default.yaml

Prints documents / tokens / segments for every domain and split, then two domain x domain tables
computed on each domain's packed tokens (all splits, padding and separators excluded):
- `mass overlap` = sum_v min(p_a(v), p_b(v)) over the unigram distributions p of the two
  domains: the share of token occurrences the domains have in common (1 = same distribution);
- `jaccard (types >= 1e-4)` = |A & B| / |A | B| where A is the set of token types making up at
  least 0.01% of domain a's tokens: overlap of the vocabularies each domain actually leans on
  (the plain set of types seen is near-identical across domains at this vocabulary size).
"""
from __future__ import annotations

import sys
import time
from typing import Sequence

import numpy as np

FREQUENT = 1e-4


def token_counts(domain_data, vocab_size: int, eot_id: int) -> np.ndarray:
    """Unigram counts of a domain's packed tokens (all splits, without padding or separators)."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for split in domain_data.splits.values():
        seg = split.segments
        if len(seg) == 0:
            continue
        tokens = seg.tokens[:, 1:].numpy()  # targets: every token counted once across windows
        keep = (seg.doc_index[:, 1:].numpy() >= 0) & (tokens != eot_id)
        counts += np.bincount(tokens[keep], minlength=vocab_size)
    return counts


def overlap_tables(counts: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    names = list(counts)
    probs = {n: c / max(1, c.sum()) for n, c in counts.items()}
    frequent = {n: set(np.flatnonzero(p >= FREQUENT)) for n, p in probs.items()}
    k = len(names)
    mass, jac = np.ones((k, k)), np.ones((k, k))
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            mass[i, j] = np.minimum(probs[a], probs[b]).sum()
            union = frequent[a] | frequent[b]
            jac[i, j] = len(frequent[a] & frequent[b]) / len(union) if union else 1.0
    return mass, jac


def format_report(config, domains, tokenizer, seconds: float) -> str:
    lines = [
        f"order: {' -> '.join(config.experience_domains)}   seq_len {config.seq_len}   seed {config.seed}   "
        f"tokenizer {tokenizer.fingerprint[:12]} (vocab {tokenizer.vocab_size})   loaded in {seconds:.1f} s",
        "",
        f"{'domain':<12} {'split':<10} {'docs':>8} {'tokens':>12} {'segments':>9}",
    ]
    for name, d in domains.items():
        lines.append(f"{name:<12} {'(all)':<10} {len(d.documents):>8,} {int(d.plan.doc_costs.sum()):>12,} {'':>9}")
        for split_name in ["pretrain", *[p.split for p in d.adapt_parts], "eval", *(["dev"] if d.splits["dev"].n_docs else [])]:
            s = d.splits[split_name]
            lines.append(f"{'':<12} {split_name:<10} {s.n_docs:>8,} {s.n_tokens:>12,} {s.n_segments:>9,}")
    counts = {name: token_counts(d, tokenizer.vocab_size, tokenizer.eot_id) for name, d in domains.items()}
    mass, jac = overlap_tables(counts)
    names = list(domains)
    for title, table in [("mass overlap", mass), (f"jaccard (types >= {FREQUENT:g})", jac)]:
        lines += ["", f"{title:<28}" + "".join(f"{n:>8}" for n in names)]
        for i, n in enumerate(names):
            lines.append(f"{n:<28}" + "".join(f"{v:>8.3f}" for v in table[i]))
    lines += ["", "(all) tokens: every document of the domain, one separator each; split tokens: exact budgets."]
    return "\n".join(lines)


def main(config: str, overrides: Sequence[str] = ()) -> int:
    from streams.stream import load_domains, load_stream_config
    from streams.tokenizer import load_tokenizer

    cfg = load_stream_config(config, overrides).resolved()
    tokenizer = load_tokenizer(cfg.tokenizer)
    t0 = time.perf_counter()
    domains = load_domains(cfg, tokenizer)
    print(format_report(cfg, domains, tokenizer, time.perf_counter() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
