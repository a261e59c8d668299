"""The tokenise / pack cache: a second load does no work; what a change invalidates, and only that."""
from __future__ import annotations

import dataclasses

import torch

from streams.splits import TokenBudget
from streams.stream import load_domains
from streams.tokenizer import train_tokenizer


def test_second_load_does_no_tokenisation_or_packing(small_scenario, small, stream_cache, count_work):
    encode, pack = count_work
    domains = load_domains(small.config(stream_cache))
    assert (encode.calls, pack.calls) == (0, 0)
    for name, d in domains.items():
        assert torch.equal(d.splits["adapt"].segments.tokens, small_scenario.domains[name].splits["adapt"].segments.tokens)


def test_seq_len_change_repacks_without_tokenising(small_scenario, small, stream_cache, count_work):
    encode, pack = count_work
    cfg = small.config(stream_cache, seq_len=32)
    domains = load_domains(cfg)
    assert encode.calls == 0
    assert pack.calls == 4 * 3  # every split of every domain
    assert domains["math"].splits["eval"].segments.tokens.shape == (small.budget.eval // 32, 33)
    # Same documents, same tokens, other window length.
    assert domains["math"].document_ids("eval") == small_scenario.domains["math"].document_ids("eval")
    pack.calls = 0
    load_domains(cfg)
    assert (encode.calls, pack.calls) == (0, 0)


def test_budget_change_repacks_only_changed_splits(small_scenario, small, stream_cache, count_work):
    encode, pack = count_work
    budget = dataclasses.replace(small.budget, pretrain=small.budget.pretrain - 2 * small.seq_len)
    load_domains(small.config(stream_cache, token_budget=budget))
    assert encode.calls == 0 and pack.calls == 4  # eval and adapt come first along the permutation: unchanged


def test_tokenizer_change_retokenises(small, stream_cache, tmp_path, count_work):
    encode, pack = count_work
    texts = [f"sample {i} of a throwaway tokenizer, with numbers {i * 37}" for i in range(200)]
    path = tmp_path / "tok.json"
    train_tokenizer(texts, vocab_size=300, out_path=path)
    cfg = small.config(stream_cache, tokenizer=str(path), token_budget=TokenBudget(pretrain=0, adapt=640, eval=320))
    domains = load_domains(cfg)
    assert encode.calls > 0 and pack.calls == 4 * 2
    assert int(domains["web"].splits["eval"].segments.tokens.max()) < 300
    encode.calls = pack.calls = 0
    load_domains(cfg)
    assert (encode.calls, pack.calls) == (0, 0)
