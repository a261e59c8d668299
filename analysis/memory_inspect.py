"""What a run's memory recorder saw (run_dir/inspect/, cl_platform/memory_recorder.py), as numbers.

    rec = load_inspect(Path("runs/default-…"))          # None when the run did not record
    gate_by_class(rec)      # {layer: {class: {"mean", "low", "high", "n"}}}: the gate by token class
    ownership(rec)          # {layer: {domain: [owned, survivors after each later experience]}}
    render_example(rec, ex) # "…before [token] after…" and the next token
    addresses(idx, w, ep)   # a needle episode: does the question read where the asked needle wrote

Token classes (a token may be in several; computed on word pieces of the byte-level BPE, each
token taking the class of the word its first letter or digit belongs to):
    frequent     its id is among the most frequent ids that make up half of the base model's
                 pretraining tokens (what the slow weights saw most)
    rare         at most RARE_PER_MILLION per million pretraining tokens (unseen ids included)
    capitalised  a word starting with a capital letter that does not start a sentence (the
                 usual proxy for proper names: previous non-space character not . ! ? or a newline)
    digits       a word holding a digit
    identifier   a word holding '_' or a lower-to-upper case change (snake_case, camelCase), or
                 directly followed by '(' (a call)
    symbol       no letter or digit (punctuation, whitespace, operators)
Reads files only (numpy, json).
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

RARE_PER_MILLION = 10.0
CLASSES = ("all", "frequent", "rare", "capitalised", "digits", "identifier", "symbol")
WORD = re.compile(r"[^\W]+")  # letters, digits and '_' (Unicode aware)
SENTENCE_END = ".!?\n"


@dataclass
class InspectRecord:
    folder: Path
    slots: dict[str, Any] | None  # slots.json
    counts: dict[str, np.ndarray]  # counts.npz
    gates: dict[str, np.ndarray]  # gates.npz
    tokens: dict[int, str]  # tokens.json

    def text(self, token_id: int | None) -> str:
        if token_id is None:
            return "∅"
        return self.tokens.get(int(token_id), f"<{token_id}>")

    @property
    def gate_domains(self) -> list[str]:
        return [key[: -len("_ids")] for key in self.gates if key.endswith("_ids")]

    def gate_layers(self, domain: str) -> list[str]:
        return [key[len(domain) + 1:] for key in self.gates
                if key.startswith(domain + "_") and key[len(domain) + 1:] not in ("ids", "doc")]


def load_inspect(run_dir: Path) -> InspectRecord | None:
    folder = Path(run_dir) / "inspect"
    if not folder.is_dir():
        return None
    slots = json.loads((folder / "slots.json").read_text(encoding="utf-8")) if (folder / "slots.json").is_file() else None
    tokens = {}
    if (folder / "tokens.json").is_file():
        tokens = {int(k): v for k, v in json.loads((folder / "tokens.json").read_text(encoding="utf-8")).items()}
    return InspectRecord(folder, slots, _npz(folder / "counts.npz"), _npz(folder / "gates.npz"), tokens)


def _npz(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        return {}
    with np.load(path) as data:
        return {key: data[key] for key in data.files}


# --- examples ---------------------------------------------------------------------------------------
def render_example(rec: InspectRecord, example: dict[str, Any]) -> str:
    """One writer or reader: `…context [token] context… → next` (whitespace shown as is, newlines as ⏎)."""
    def show(ids):
        return "".join(rec.text(i) for i in ids).replace("\n", "⏎")

    token = rec.text(example["token"]).replace("\n", "⏎")
    nxt = rec.text(example.get("next")).replace("\n", "⏎")
    return f"…{show(example['before'])}[{token}]{show(example['after'])}… → {nxt!r}"


# --- gates by token class ---------------------------------------------------------------------------
def frequency_classes(pretrain_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(frequent, rare) boolean masks over the vocabulary from pretraining token counts."""
    counts = pretrain_counts.astype(np.float64)
    total = counts.sum()
    order = np.argsort(-counts, kind="stable")
    covered = np.cumsum(counts[order]) / max(total, 1.0)
    frequent = np.zeros(counts.shape[0], dtype=bool)
    frequent[order[: int(np.searchsorted(covered, 0.5)) + 1]] = True  # the ids that reach half of the tokens
    rare = counts * 1e6 / max(total, 1.0) <= RARE_PER_MILLION
    return frequent, rare & ~frequent


def word_classes(pieces: list[str]) -> dict[str, np.ndarray]:
    """Boolean masks (len(pieces),) for the word classes of a token sequence (see module docstring)."""
    text = "".join(pieces)
    starts = np.cumsum([0] + [len(p) for p in pieces[:-1]]) if pieces else np.zeros(0, dtype=int)
    owner = np.full(len(text), -1)  # char → index of its word
    words = list(WORD.finditer(text))
    for w_i, m in enumerate(words):
        owner[m.start():m.end()] = w_i
    out = {name: np.zeros(len(pieces), dtype=bool) for name in ("capitalised", "digits", "identifier", "symbol")}
    for i, (piece, start) in enumerate(zip(pieces, starts)):
        first = next((start + j for j, c in enumerate(piece) if owner[start + j] >= 0), None) if piece else None
        if first is None:
            out["symbol"][i] = True
            continue
        m = words[owner[first]]
        word = m.group()
        before = text[:m.start()].rstrip(" \t")
        after = text[m.end():m.end() + 1]
        out["capitalised"][i] = word[0].isupper() and bool(before) and before[-1] not in SENTENCE_END
        out["digits"][i] = any(c.isdigit() for c in word)
        out["identifier"][i] = ("_" in word or re.search(r"[a-z][A-Z]", word) is not None or after == "(")
    return out


def gate_by_class(rec: InspectRecord, samples: int = 1000, seed: int = 0) -> dict[str, dict[str, dict[str, float]]]:
    """{layer: {class: {"mean", "low", "high", "n"}}}: mean gate over the recorded eval tokens of
    every domain, with a 95 % bootstrap interval over documents (each domain's documents drawn
    with replacement, as in analysis/bootstrap.py)."""
    counts = rec.gates.get("pretrain_counts")
    freq = frequency_classes(counts) if counts is not None else None
    per_layer: dict[str, list[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]]] = {}
    for domain in rec.gate_domains:
        ids = rec.gates[f"{domain}_ids"]
        docs = rec.gates[f"{domain}_doc"]
        masks = {"all": np.ones(ids.shape[0], dtype=bool), **word_classes([rec.text(i) for i in ids])}
        if freq is not None:
            masks["frequent"], masks["rare"] = freq[0][ids], freq[1][ids]
        for layer in rec.gate_layers(domain):
            gates = rec.gates[f"{domain}_{layer}"].astype(np.float64)[: ids.shape[0]]
            per_layer.setdefault(layer, []).append((gates, docs[: gates.shape[0]], {k: m[: gates.shape[0]] for k, m in masks.items()}))
    rng = np.random.default_rng(seed)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for layer, parts in per_layer.items():
        out[layer] = {}
        for name in CLASSES:
            if not all(name in masks for _, _, masks in parts):
                continue
            # Per document: (Σ gate, count) of the class; documents are the resampling unit.
            sums, ns = [], []
            for gates, docs, masks in parts:
                m = masks[name]
                _, doc_pos = np.unique(docs, return_inverse=True)
                sums.append(np.bincount(doc_pos[m], weights=gates[m], minlength=doc_pos.max(initial=-1) + 1))
                ns.append(np.bincount(doc_pos[m], minlength=doc_pos.max(initial=-1) + 1))
            n = int(sum(x.sum() for x in ns))
            if n == 0:
                continue
            mean = float(sum(s.sum() for s in sums) / n)
            draws = []
            for _ in range(samples):
                tot_s = tot_n = 0.0
                for s, c in zip(sums, ns):
                    pick = rng.integers(0, len(s), len(s))
                    tot_s, tot_n = tot_s + s[pick].sum(), tot_n + c[pick].sum()
                if tot_n:
                    draws.append(tot_s / tot_n)
            low, high = (np.quantile(draws, [0.025, 0.975]) if draws else (np.nan, np.nan))
            out[layer][name] = {"mean": mean, "low": float(low), "high": float(high), "n": n}
    return out


# --- which slots a domain owns, and how many survive ------------------------------------------------
def ownership(rec: InspectRecord, share: float = 0.5) -> dict[str, list[dict[str, Any]]]:
    """{layer: [{experience, domain, owned, survive: [after t+1, after t+2, ...]}]}.

    A domain owns the fewest most-read slots that serve `share` of its reads at its own row (the
    evaluation right after it streamed); an owned slot survives a later experience if that
    experience and every one between wrote nothing into it."""
    if not rec.slots:
        return {}
    experiences = [(e["experience"], e["domain"]) for e in rec.slots["experiences"]]
    out: dict[str, list[dict[str, Any]]] = {}
    layers = sorted({key.split("_", 1)[1].rsplit("_", 1)[0] for key in rec.counts if key.startswith("reads_")})
    for layer in layers:
        rows = []
        for t, domain in experiences:
            reads = rec.counts.get(f"reads_{layer}_{t}")
            if reads is None or reads.sum() == 0:
                continue
            order = np.argsort(-reads, kind="stable")
            covered = np.cumsum(reads[order]) / reads.sum()
            owned = order[: int(np.searchsorted(covered, share)) + 1]
            alive = np.ones(owned.shape[0], dtype=bool)
            survive = []
            for u, _ in experiences:
                if u <= t:
                    continue
                writes = rec.counts.get(f"writes_{layer}_{u}")
                if writes is None:
                    break
                alive &= writes[owned] == 0
                survive.append(int(alive.sum()))
            rows.append({"experience": t, "domain": domain, "owned": int(owned.shape[0]), "survive": survive})
        out[layer] = rows
    return out


def shared_weight(idx, weights, a: int, b: int) -> float:
    """How much two positions' lookups agree: per head, the read weight they put on the same slots
    (Σ over slots of min(w_a, w_b); each head's top-k weights sum to 1), averaged over the heads.
    1 when both pick the same slots with the same weights, 0 when they share none."""
    total = 0.0
    for h in range(idx.shape[1]):
        wb = dict(zip(idx[b, h].tolist(), weights[b, h].tolist()))
        total += sum(min(x, wb[s]) for s, x in zip(idx[a, h].tolist(), weights[a, h].tolist()) if s in wb)
    return total / idx.shape[1]


def addresses(idx, weights, episode) -> dict[str, Any]:
    """Where the question reads against where each needle wrote, in one in-pass read of a needle
    episode (`clp niah`; idx, weights: (T, H, k) of one FwPKM layer, tensors or arrays; `episode`
    a `streams.needles.Episode`, read by its fields). With look-ahead the token before a needle's number ("is") writes
    the number's value under its own lookup, and the question's last token ("is") reads under its
    own: `asked` and `others` are the shared weight (`shared_weight`) of the question's lookup with
    the asked needle's write and, averaged, with the other needles'; `match` is 1 when the asked
    needle's is the largest (shared among ties, so chance is 1 / needles); `between` is the mean
    shared weight of two needles' writes with each other — what the template alone makes them share.
    A memory keyed by the ID has match near 1 and `between` low; one keyed by the template has
    asked ≈ others ≈ between."""
    query = len(episode.haystack) + len(episode.question) - 1
    writes = [start - 1 for start in episode.answer_starts]
    shared = [shared_weight(idx, weights, query, p) for p in writes]
    asked = shared[episode.asked]
    others = [x for j, x in enumerate(shared) if j != episode.asked]
    top = max(shared)
    pairs = [shared_weight(idx, weights, a, b) for i, a in enumerate(writes) for b in writes[i + 1:]]
    return {"asked": asked, "others": statistics.fmean(others) if others else None,
            "match": (asked == top) / sum(x == top for x in shared),
            "between": statistics.fmean(pairs) if pairs else None}


def address_summary(runs: list[dict[str, Any]], flags: list[bool] | None = None) -> dict[str, Any]:
    """Over one model's runs of the same episodes (each run's "address": {layer: {key: per-episode
    `addresses` values}} and "hits"["in-pass"]: per-episode exact match): per layer, "address" the
    mean of each key; "exact_by_address" in-pass exact match on the episodes whose address matched
    (the asked needle's shared weight the largest, alone) and on those where another's was larger
    (ties left out): does reading the asked needle's slots go with retrieving it; and with `flags`
    (per episode: the asked needle's attribute is shared with another needle), "address_match_by_attribute",
    the match rate where the attribute is unique and where only the name or ID tells the needles apart."""
    from analysis.intervals import mean_of

    layers = list(runs[0]["address"])
    out: dict[str, Any] = {
        "address": {layer: {key: mean_of([x for r in runs for x in r["address"][layer][key]])
                            for key in runs[0]["address"][layer]} for layer in layers},
        "exact_by_address": {layer: {kind: mean_of([h if m == value else None for r in runs
                                                    for h, m in zip(r["hits"]["in-pass"], r["address"][layer]["match"])])
                                     for kind, value in (("matched", 1.0), ("missed", 0.0))} for layer in layers}}
    if flags is not None:
        out["address_match_by_attribute"] = {
            layer: {kind: mean_of([m for r in runs for m, f in zip(r["address"][layer]["match"], flags) if f == shared])
                    for kind, shared in (("unique", False), ("shared", True))} for layer in layers}
    return out


def address_text(summary: dict[str, Any]) -> str:
    """One model's `address_summary` as a line: per layer "L asked/others/between match m (unique a
    / shared b), in-pass exact x where matched / y where not" (n/a: no such episode, — no value)."""
    where = summary.get("address")
    if where is None:
        return "n/a"
    split, by_address = summary.get("address_match_by_attribute", {}), summary.get("exact_by_address", {})

    def two(values: dict[str, Any], keys: tuple[str, str], sep: str) -> str:
        return sep.join("n/a" if values[k] is None else f"{values[k]:.2f}" for k in keys)

    return "   ".join(
        f"{layer} " + "/".join("—" if where[layer][k] is None else f"{where[layer][k]:.2f}"
                               for k in ("asked", "others", "between"))
        + f" match {where[layer]['match']:.2f}"
        + ("" if layer not in split else f" (unique {two(split[layer], ('unique', 'shared'), ' / shared ')})")
        + ("" if layer not in by_address else
           f", in-pass exact {two(by_address[layer], ('matched', 'missed'), ' where matched / ')} where not")
        for layer in where)
