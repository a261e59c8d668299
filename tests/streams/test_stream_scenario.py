"""Real slices of every shipped domain through the whole pipeline, and the Avalanche / loader views."""
from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from avalanche.benchmarks.scenarios import CLScenario
from avalanche.benchmarks.utils import AvalancheDataset
from avalanche.training.storage_policy import ReservoirSamplingBuffer

from cl_platform.constants import IGNORE_INDEX
from streams.datamodule import PretrainDataModule, ResumableSampler
from streams.scenario import build_stream

def _split_texts(domain_data, split):
    texts = domain_data.documents["text"]
    return [texts[int(r)] for r in domain_data.splits[split].doc_rows]


def _stream_tokens(segments) -> list[int]:
    """Undo the overlapping windows: the packed token stream of a split, padding removed."""
    toks, docs = segments.tokens, segments.doc_index
    flat = torch.cat([toks[0, :1], toks[:, 1:].reshape(-1)])
    keep = torch.cat([docs[0, :1], docs[:, 1:].reshape(-1)]) >= 0
    return flat[keep].tolist()


def test_every_shipped_domain_loads_real_text(small_scenario, small):
    expected_starts = {
        "math": "Natalia sold clips to 48 of her friends in April",  # GSM8K train, row 0
        "web": "We offer valet parking as well as street and private lot.",  # C4 subset, row 0
    }
    tok = small_scenario.tokenizer
    for name in small.domains:
        d = small_scenario.domains[name]
        assert len(d.documents) == small.slices[name]
        texts = d.documents["text"]
        assert all(isinstance(t, str) and len(t) > 50 for t in texts)
        if name in expected_starts:
            assert texts[0].startswith(expected_starts[name])
        if name == "code":
            assert any("def " in t and "import " in t for t in texts)
        if name == "law":
            assert all("agreement" in t.lower() for t in texts)
        for split in ("eval", "adapt", "pretrain"):
            # The packed stream is <eot> doc <eot> doc ... in split order, cut at the budget.
            stream = tok.decode(_stream_tokens(d.splits[split].segments))
            full = "".join(f"<|endoftext|>{t}" for t in _split_texts(d, split))
            assert full.startswith(stream) and len(stream) > 0.8 * small.budget.eval, (name, split)


def test_splits_are_disjoint_exact_and_in_source_order(small_scenario, small):
    for name in small.domains:
        d = small_scenario.domains[name]
        rows = {split: d.document_ids(split) for split in ("eval", "adapt", "pretrain")}
        for a, b in itertools.combinations(rows, 2):
            assert set(rows[a]).isdisjoint(rows[b]), (name, a, b)
        for split, budget in [("eval", small.budget.eval), ("adapt", small.budget.adapt), ("pretrain", small.budget.pretrain)]:
            s = d.splits[split]
            assert rows[split] == sorted(rows[split])  # source order kept
            assert s.n_tokens == budget and s.n_segments == budget // small.seq_len
            assert s.segments.tokens.shape == (budget // small.seq_len, small.seq_len + 1)
            idx = s.segments.doc_index[:, 1:].reshape(-1)
            assert torch.all(idx[1:] >= idx[:-1])  # documents appear in order, each once


def test_determinism_across_two_runs(small_scenario, small, tmp_path):
    again = build_stream(small.config(tmp_path))  # cold cache, same config
    for name in small.domains:
        for split, s in small_scenario.domains[name].splits.items():
            t = again.domains[name].splits[split]
            assert np.array_equal(s.doc_rows, t.doc_rows)
            assert torch.equal(s.segments.tokens, t.segments.tokens)
            assert torch.equal(s.segments.doc_index, t.segments.doc_index)


def test_stream_order_changes_only_the_order(small_scenario, small, stream_cache):
    rev = build_stream(small.config(stream_cache, order=["web", "code", "law", "math"]))
    assert [e.domain for e in rev] == ["web", "code", "law", "math"]
    for name in small.domains:
        for split in ("eval", "adapt", "pretrain"):
            assert torch.equal(rev.domains[name].splits[split].segments.tokens, small_scenario.domains[name].splits[split].segments.tokens)


def test_recurring_domain_reads_fresh_documents(small_scenario, small, stream_cache):
    sc = build_stream(small.config(stream_cache, order=["math", "law", "math"]))
    assert [(e.domain, e.occurrence, e.split) for e in sc] == [("math", 0, "adapt"), ("law", 0, "adapt"), ("math", 1, "adapt#2")]
    first, second = sc[0].data, sc[2].data
    assert set(first.doc_rows.tolist()).isdisjoint(second.doc_rows.tolist())
    assert second.n_tokens == small.budget.adapt
    math = sc.domains["math"]
    assert set(second.doc_rows.tolist()).isdisjoint(math.document_ids("eval") + math.document_ids("pretrain"))
    # Eval, pretrain and the first adapt part are those of the plain stream.
    for split in ("eval", "pretrain", "adapt"):
        assert math.document_ids(split) == small_scenario.domains["math"].document_ids(split)


def test_avalanche_view(small_scenario, small):
    sc = small_scenario
    assert isinstance(sc, CLScenario) and set(sc.streams) == {"adapt", "eval", "pretrain"}
    assert len(sc) == len(sc.adapt_stream) == 4
    assert [e.current_experience for e in sc.adapt_stream] == [0, 1, 2, 3]
    assert [e.domain for e in sc.eval_stream] == sc.eval_domains == small.domains
    exp = sc.adapt_stream[1]
    assert exp.domain == "law" and isinstance(exp.dataset, AvalancheDataset)
    assert len(exp.dataset) == small.budget.adapt // small.seq_len
    assert list(exp.eval_datasets) == small.domains
    assert all(len(ds) == small.budget.eval // small.seq_len for ds in exp.eval_datasets.values())
    item = exp.dataset[3]
    assert torch.equal(item["input_ids"], sc.domains["law"].splits["adapt"].segments[3]["input_ids"])
    # An Avalanche storage policy works on an experience's dataset as is.
    buf = ReservoirSamplingBuffer(max_size=5)
    buf.update_from_dataset(exp.dataset)
    assert len(buf.buffer) == 5
    law_rows = {tuple(x.tolist()) for x in sc.domains["law"].splits["adapt"].segments.tokens[:, :-1]}
    assert all(tuple(buf.buffer[i]["input_ids"].tolist()) in law_rows for i in range(5))
    pre = sc.pretrain_dataset()
    assert len(pre) == 4 * small.budget.pretrain // small.seq_len and len(sc.pretrain_stream) == 4


def test_loaders(small_scenario, small):
    exp = small_scenario[0]
    segs = exp.data.segments
    batches = list(exp.adapt_loader(batch_size=8))
    assert [b["input_ids"].shape for b in batches] == [(8, small.seq_len), (8, small.seq_len), (4, small.seq_len)]
    assert torch.equal(torch.cat([b["input_ids"] for b in batches]), segs.tokens[:, :-1])  # stream order
    assert torch.equal(batches[0]["targets"], segs.tokens[:8, 1:])  # budgets are multiples of T: no padding
    assert not (torch.cat([b["targets"] for b in batches]) == IGNORE_INDEX).any()
    resumed = list(exp.adapt_loader(batch_size=8, start=16))
    assert torch.equal(resumed[0]["input_ids"], segs.tokens[16:20, :-1])
    evals = exp.eval_loaders(batch_size=4)
    assert list(evals) == small.domains
    b = next(iter(evals["code"]))
    assert b["doc_start"][0, 0] and b["input_ids"][0, 0] == small_scenario.tokenizer.eot_id


def test_pretrain_data_module(small_scenario, small):
    pre = PretrainDataModule(small_scenario, batch_size=16, seed=7)
    a = torch.cat([b["input_ids"] for b in pre.train_dataloader()])
    b = torch.cat([b["input_ids"] for b in PretrainDataModule(small_scenario, batch_size=16, seed=7).train_dataloader()])
    assert torch.equal(a, b) and a.shape == (160, small.seq_len)
    every = torch.cat([d.splits["pretrain"].segments.tokens[:, :-1] for d in small_scenario.domains.values()])
    assert not torch.equal(a, every)  # shuffled ...
    assert sorted(map(tuple, a.tolist())) == sorted(map(tuple, every.tolist()))  # ... and complete


def test_resumable_sampler():
    s = ResumableSampler(10, shuffle=True, seed=1)
    full = list(s)
    assert sorted(full) == list(range(10))
    s.set_start(4)
    assert len(s) == 6 and list(s) == full[4:]
    assert list(s) == full  # start applies to one pass only
    s.set_epoch(1)
    assert list(s) != full
    s2 = ResumableSampler(10, shuffle=True, seed=1)
    s2.load_state_dict({"epoch": 1, "start": 3})
    s.set_epoch(1)
    assert list(s2) == list(s)[3:]
    assert list(ResumableSampler(5)) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("n, world", [(13, 2), (12, 2), (10, 3), (7, 4)])
def test_sharded_sampler_is_torchs_distributed_sampler_and_resumes_the_same_shards(n, world):
    from torch.utils.data.distributed import DistributedSampler

    data = list(range(n))
    for rank in range(world):
        torch_shard = list(DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False))
        assert list(ResumableSampler(n, rank=rank, world=world)) == torch_shard
        for done in range(0, -(-n // world) * world + 1, world):  # samples consumed by all ranks so far
            resumed = ResumableSampler(n, rank=rank, world=world, start=done)
            assert len(resumed) == len(torch_shard) - done // world
            assert list(resumed) == torch_shard[done // world:]
    shuffled = [list(ResumableSampler(n, shuffle=True, seed=3, rank=r, world=world)) for r in range(world)]
    assert {i for shard in shuffled for i in shard} == set(range(n)) and all(len(s) == -(-n // world) for s in shuffled)
    with pytest.raises(ValueError, match="not a multiple of the 2 ranks"):
        ResumableSampler(13, rank=0, world=2, start=3)


def test_user_domain_from_jsonl(tmp_path, stream_cache):
    import json

    from streams.stream import load_stream_config

    data = tmp_path / "data"
    data.mkdir()
    docs = [{"id": i, "body": f"Log entry {i}: the pump at station {i % 7} reported pressure {100 + i} kPa."} for i in range(200)]
    (data / "logs.jsonl").write_text("\n".join(json.dumps(d) for d in docs) + "\n", encoding="utf-8")
    (tmp_path / "stream.yaml").write_text(
        f"""
domains:
  - name: logs
    source: data/logs.jsonl          # relative to this file
    text_field: body
    token_budget: {{pretrain: 0, adapt: 512, eval: 256}}
  - {{name: web, source: "corpus:web", filters: {{max_documents: 60}}}}
order: [logs, web, logs]
seq_len: 64
token_budget: {{pretrain: 2560, adapt: 1280, eval: 640}}
cache_dir: {stream_cache}
""",
        encoding="utf-8",
    )
    cfg = load_stream_config(tmp_path / "stream.yaml")
    assert cfg.domain("logs").sources == [str(tmp_path / "data" / "logs.jsonl")]
    sc = build_stream(cfg)
    logs = sc.domains["logs"]
    assert [e.domain for e in sc] == ["logs", "web", "logs"]
    assert logs.splits["eval"].n_tokens == 256 and logs.splits["adapt#2"].n_tokens == 512
    assert logs.splits["pretrain"].n_docs == 0 and len(sc.pretrain_stream) == 1  # only web pretrains
    eval_texts = _split_texts(logs, "eval")
    assert all(t.startswith("Log entry ") for t in eval_texts)
    decoded = sc.tokenizer.decode(_stream_tokens(logs.splits["eval"].segments))
    assert decoded.startswith("<|endoftext|>" + eval_texts[0] + "<|endoftext|>" + eval_texts[1])
    assert [int(t.split()[2].rstrip(":")) for t in eval_texts] == sorted(int(t.split()[2].rstrip(":")) for t in eval_texts)


@pytest.mark.parametrize("fmt", ["parquet", "text"])
def test_user_domain_other_formats(tmp_path, stream_cache, fmt):
    from streams.sources import DomainConfig, load_documents

    texts = [f"Report {i}. " + "Measurements were nominal. " * (5 + i % 4) for i in range(30)]
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"content": texts, "n": list(range(30))}), tmp_path / "r.parquet")
        domain = DomainConfig(name="reports", source=str(tmp_path / "*.parquet"), text_field="content")
    else:
        for i, t in enumerate(texts):  # one document per file
            (tmp_path / f"r{i:02d}.txt").write_text(t, encoding="utf-8")
        domain = DomainConfig(name="reports", source=str(tmp_path / "r*.txt"))
    docs = load_documents(domain, stream_cache)
    assert docs.column_names == ["text"] and list(docs["text"]) == texts


def test_filters(stream_cache):
    from streams.sources import DomainConfig, FilterConfig, corpus_files, load_documents

    algebra = load_documents(
        DomainConfig(
            name="algebra",
            source=str(next(p for p in corpus_files("math") if "hendrycks" in str(p))),
            filters=FilterConfig(where={"type": ["Algebra"]}, min_chars=400, max_documents=25),
        ),
        stream_cache,
    )
    assert len(algebra) == 25 and all(len(t) >= 400 for t in algebra["text"])
    assert all("$" in t or "\\" in t for t in algebra["text"])  # competition algebra: LaTeX everywhere


def test_config_from_yaml_default():
    from streams.stream import load_stream_config

    cfg = load_stream_config(Path(__file__).resolve().parents[2] / "experiments" / "configs" / "streams" / "default.yaml")
    assert [d.name for d in cfg.domains] == ["math", "law", "code", "web"] == cfg.experience_domains
    assert [d.source for d in cfg.domains] == ["corpus:math", "corpus:law", "corpus:code", "corpus:web"]
    assert (cfg.seq_len, cfg.seed) == (512, 0)
    assert dataclasses.asdict(cfg.token_budget) == {"pretrain": 1_024_000, "adapt": 153_600, "eval": 40_960,
                                                    "dev": 40_960, "eval_docs": 0}
    # The base is pretrained on web only; the novel domains' eval and dev splits hold >= 32 documents.
    novel = {"pretrain": 0, "adapt": 153_600, "eval": 40_960, "dev": 40_960, "eval_docs": 32}
    assert {d: dataclasses.asdict(cfg.budget(d)) for d in ("math", "law", "code")} == dict.fromkeys(("math", "law", "code"), novel)
    assert cfg.budget("web") == cfg.token_budget
    assert all(v % cfg.seq_len == 0 for d in cfg.experience_domains for k, v in dataclasses.asdict(cfg.budget(d)).items()
               if k != "eval_docs")
