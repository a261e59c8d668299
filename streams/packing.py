"""Tokenisation and packing into fixed-length segments, both through `datasets.map`.

Both steps are cached by `datasets` under explicit fingerprints: the tokenised documents by
(documents' fingerprint, tokenizer fingerprint); each packed split by (tokenised fingerprint,
split rows, token budget, seq_len). A second load finds the cache files and calls no tokenizer;
changing the tokenizer file, the source files, the filters, the seed, a budget or `seq_len`
changes a fingerprint and recomputes only what depends on it. `datasets` writes each cache file
to a temporary name and renames it when complete, so a failure leaves no half-written file.

Segment layout (T = seq_len). A split's documents d_0..d_{n-1} (in split order) become the stream
    <eot> d_0 <eot> d_1 ... <eot> d_{n-1} <eot>
cut to exactly budget + 1 tokens (so the split has `budget` next-token targets) and then into
windows of T + 1 tokens with stride T: window k = stream[kT : kT + T + 1], so every target is
predicted exactly once. The last window is padded with <pad>. Per token, `doc_index` is the
position of its document in the split (the <eot> before a document belongs to it; -1 = pad).
"""
from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

from cl_platform.constants import IGNORE_INDEX  # the padding target the model's loss skips

PIPELINE_VERSION = "1"  # bump when the output of tokenise/pack changes for identical inputs


def fingerprint(*parts: object) -> str:
    text = "\x00".join(str(p) for p in (PIPELINE_VERSION, *parts))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def _tokenize_batch(batch: dict, tokenizer) -> dict:
    ids = tokenizer.encode_batch(batch["text"])
    return {"input_ids": ids, "n_tokens": [len(x) for x in ids]}


def tokenize_documents(docs, tokenizer, domain: str):
    """Add `input_ids` (list<int32>) and `n_tokens` to every document; drops `text`."""
    import datasets

    features = datasets.Features({"input_ids": datasets.List(datasets.Value("int32")), "n_tokens": datasets.Value("int32")})
    return docs.map(
        _tokenize_batch,
        fn_kwargs={"tokenizer": tokenizer},
        batched=True,
        batch_size=256,
        remove_columns=docs.column_names,
        features=features,
        new_fingerprint=fingerprint("tokenize", docs._fingerprint, tokenizer.fingerprint),
        desc=f"tokenise {domain}",
    )


def pack_tokens(
    values: np.ndarray, lengths: np.ndarray, seq_len: int, budget: int | None, eot_id: int, pad_id: int,
    max_doc_tokens: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Pack concatenated document tokens into (S, T + 1) windows; returns (tokens, doc_index).
    `max_doc_tokens`: keep only each document's first tokens (evaluation splits sized in documents)."""
    values = np.asarray(values, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if max_doc_tokens is not None:
        doc_starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        position = np.arange(len(values)) - np.repeat(doc_starts, lengths)  # position inside its document
        values = values[position < max_doc_tokens]
        lengths = np.minimum(lengths, max_doc_tokens)
    n_docs = len(lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    stream = np.append(np.insert(np.asarray(values, dtype=np.int64), starts, eot_id), eot_id)
    doc_index = np.append(np.repeat(np.arange(n_docs), lengths + 1), n_docs - 1)
    if budget is not None:
        stream, doc_index = stream[: budget + 1], doc_index[: budget + 1]
    n_targets = len(stream) - 1
    n_seg = max(1, math.ceil(n_targets / seq_len))
    pad = n_seg * seq_len + 1 - len(stream)
    stream = np.concatenate([stream, np.full(pad, pad_id)])
    doc_index = np.concatenate([doc_index, np.full(pad, -1)])
    windows = np.arange(n_seg)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]  # (S, T+1)
    return stream[windows].astype(np.int32), doc_index[windows].astype(np.int32)


def _pack_batch(batch, seq_len: int, budget: int | None, eot_id: int, pad_id: int,
                max_doc_tokens: int | None = None) -> dict:
    import pyarrow.compute as pc

    col = batch.column("input_ids")
    tokens, doc_index = pack_tokens(
        pc.list_flatten(col).to_numpy(),
        pc.list_value_length(col).to_numpy(),
        seq_len,
        budget,
        eot_id,
        pad_id,
        max_doc_tokens,
    )
    return {"input_ids": list(tokens), "doc_index": list(doc_index)}


def pack_split(tokenized, rows: np.ndarray, budget: int | None, seq_len: int, tokenizer, domain: str, split: str,
               max_doc_tokens: int | None = None):
    """Packed segments of the documents `rows` (in that order) as a `datasets.Dataset`; with
    `max_doc_tokens`, of each document's first `max_doc_tokens` tokens."""
    import datasets

    rows = np.asarray(rows, dtype=np.int64)
    features = datasets.Features(
        {"input_ids": datasets.List(datasets.Value("int32")), "doc_index": datasets.List(datasets.Value("int32"))}
    )
    cut = () if max_doc_tokens is None else (f"max_doc_tokens={max_doc_tokens}",)  # whole documents: as before
    fp = fingerprint(
        "pack", tokenized._fingerprint, hashlib.sha256(rows.tobytes()).hexdigest(), budget, seq_len, tokenizer.eot_id,
        tokenizer.pad_id, *cut,
    )
    return (
        tokenized.select(rows)
        .with_format("arrow")
        .map(
            _pack_batch,
            fn_kwargs={"seq_len": seq_len, "budget": budget, "eot_id": tokenizer.eot_id, "pad_id": tokenizer.pad_id,
                       "max_doc_tokens": max_doc_tokens},
            batched=True,
            batch_size=None,  # one batch: documents are packed across the whole split
            remove_columns=tokenized.column_names,
            features=features,
            new_fingerprint=fp,
            desc=f"pack {domain}/{split}",
        )
        .with_format(None)
    )


class PackedSegments(torch.utils.data.Dataset):
    """One split's segments held as tensors (a 1M-token split is ~8 MB).

    Item i is a dict of (T,) tensors: `input_ids`, `targets` (next tokens, IGNORE_INDEX on
    padding), `doc_index` (-1 on padding) and `doc_start` (True where a document begins: its
    <eot> separator). `domain` and `split` say where the segments come from.
    """

    def __init__(self, tokens: np.ndarray, doc_index: np.ndarray, eot_id: int, domain: str, split: str):
        self.tokens = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64))  # (S, T+1)
        self.doc_index = torch.from_numpy(np.ascontiguousarray(doc_index, dtype=np.int64))  # (S, T+1)
        self.eot_id = eot_id
        self.domain = domain
        self.split = split

    @classmethod
    def from_hf(cls, packed, eot_id: int, domain: str, split: str) -> "PackedSegments":
        import pyarrow.compute as pc

        table = packed.with_format("arrow")[:]
        width = len(table.column("input_ids")[0])
        tokens = pc.list_flatten(table.column("input_ids")).to_numpy().reshape(-1, width)
        doc_index = pc.list_flatten(table.column("doc_index")).to_numpy().reshape(-1, width)
        return cls(tokens, doc_index, eot_id, domain, split)

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1] - 1

    @property
    def n_tokens(self) -> int:
        """Next-token targets, i.e. non-padding positions after the first."""
        return int((self.doc_index[:, 1:] >= 0).sum())

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        seg, doc = self.tokens[i], self.doc_index[i]
        targets = seg[1:].clone()
        targets[doc[1:] < 0] = IGNORE_INDEX
        inputs = seg[:-1]
        return {
            "input_ids": inputs,
            "targets": targets,
            "doc_index": doc[:-1],
            # The trailing <eot> of a split has a padding target: it ends a document, starts none.
            "doc_start": (inputs == self.eot_id) & (targets != IGNORE_INDEX),
        }
