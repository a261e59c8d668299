"""`clp tokenizer build --stream`: a tokenizer for a stream's pretraining domains, sampled from the
end of each domain's split permutation and refused when the sample reaches a held-out split."""
from __future__ import annotations

import json

import numpy as np
import pytest

from cl_platform.check import ConfigError
from streams import tokenizer_build
from streams.splits import domain_permutation, plan_splits
from streams.stream import load_stream_config
from streams.tokenizer import load_tokenizer

WORDS = "the of and to in a is that for it as was with be by on not he this are or his from at".split()


def write_stream(tmp_path, eval_budget: int = 300):
    rng = np.random.default_rng(0)
    with open(tmp_path / "prose.jsonl", "w", encoding="utf-8") as f:
        for i in range(60):  # 60 documents of 40-80 words, each with its own marker word
            words = rng.choice(WORDS, size=int(rng.integers(40, 80))).tolist()
            f.write(json.dumps({"id": i, "text": f"doc{i:03d}marker " + " ".join(words)}) + "\n")
    with open(tmp_path / "novel.jsonl", "w", encoding="utf-8") as f:
        for i in range(20):
            f.write(json.dumps({"id": i, "text": "x = [i ** 2 for i in range(10)] # novel " * 5}) + "\n")
    (tmp_path / "stream.yaml").write_text(
        "domains:\n"
        f"  - {{name: prose, source: prose.jsonl, token_budget: {{pretrain: 900, adapt: 64, eval: {eval_budget}, dev: 64}}}}\n"
        "  - {name: novel, source: novel.jsonl, token_budget: {pretrain: 0, adapt: 256, eval: 256}}\n"
        "order: [novel]\nseq_len: 32\n"
        f"cache_dir: {tmp_path / 'cache'}\n", encoding="utf-8")
    return tmp_path / "stream.yaml"


def test_the_sample_is_the_end_of_the_permutation_of_the_pretraining_domains_only(tmp_path, monkeypatch):
    stream = write_stream(tmp_path)
    monkeypatch.setattr(tokenizer_build, "STREAM_CHARS", 3000)
    sample = tokenizer_build.stream_sample(str(stream))
    assert list(sample) == ["prose"]  # the streamed domain has no pretraining tokens: not sampled
    rows, texts = sample["prose"]
    perm = domain_permutation(60, 0, "prose")
    assert rows == [int(r) for r in perm[::-1][:len(rows)]]
    assert sum(map(len, texts[:-1])) < 3000 <= sum(map(len, texts))  # stops once the characters are in
    assert all(t.startswith(f"doc{r:03d}marker") for r, t in zip(rows, texts))

    out = tmp_path / "tok.json"
    assert tokenizer_build.main(out=str(out), vocab_size=300, stream=str(stream)) == 0
    tok = load_tokenizer(out)
    assert tok.vocab_size == 300
    # The held-out documents, as the stream splits them with this tokenizer, are not in the sample.
    cfg = load_stream_config(stream)
    counts = np.array([len(tok.encode(json.loads(line)["text"])) for line in open(tmp_path / "prose.jsonl")])
    plan = plan_splits(counts, cfg.budget("prose"), 1, 0, "prose")
    held = set(plan.eval.tolist()) | set(plan.dev.tolist()) | {int(r) for p in plan.adapt for r in p}
    assert held and not held & set(rows)


def test_a_sample_reaching_a_held_out_split_is_refused_and_nothing_is_written(tmp_path, monkeypatch):
    stream = write_stream(tmp_path)
    monkeypatch.setattr(tokenizer_build, "STREAM_CHARS", 10**6)  # every document: the eval split's too
    out = tmp_path / "tok.json"
    with pytest.raises(ConfigError, match=r"sample of domain 'prose' holds \d+ document\(s\) of its held-out"):
        tokenizer_build.main(out=str(out), vocab_size=300, stream=str(stream))
    assert not out.exists()


def test_stream_without_out_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="--stream: give --out too"):
        tokenizer_build.main(stream=str(write_stream(tmp_path)))
