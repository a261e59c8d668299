"""Retrieval episodes in the pretraining splits (streams/retrieval.py): which rows change, what is
inserted where, that each recall lies beyond the distance, and that nothing else changes."""
from __future__ import annotations

import json

import numpy as np
import pytest

from cl_platform.check import ConfigError
from streams.retrieval import ATTRIBUTES, RetrievalConfig, episode_facts, fact_sentence, insert_episodes
from streams.stream import load_domains, load_stream_config
from streams.tokenizer import load_tokenizer


def occurrences(row: list[int], fact: list[int]) -> list[int]:
    n = len(fact)
    return [i for i in range(len(row) - n + 1) if row[i:i + n] == fact]


def test_each_fact_is_said_twice_the_recall_beyond_the_distance_and_the_rest_is_the_text():
    tok = load_tokenizer()
    rng = np.random.default_rng(5)
    S, width = 8, 1025
    tokens = rng.integers(2000, 4096, size=(S, width))  # ids no fact uses: occurrences are the inserts
    doc_index = np.repeat(np.arange(S)[:, None] * 3, width, axis=1) + (np.arange(width) >= 600)
    cfg = RetrievalConfig(fraction=0.25, facts=4, min_distance=256)
    new_tokens, new_docs, rows = insert_episodes(tokens, doc_index, cfg, tok, seed=0, domain="books")
    assert len(rows) == 2 and new_tokens.shape == tokens.shape
    untouched = [r for r in range(S) if r not in rows]
    assert np.array_equal(new_tokens[untouched], tokens[untouched]) and np.array_equal(new_docs[untouched], doc_index[untouched])

    # Replay the generator to know the facts the episode drew (the rule in the module docstring).
    import zlib
    g = np.random.default_rng([0, zlib.crc32(b"books"), 1])
    assert np.array_equal(np.sort(g.choice(S, size=2, replace=False)), rows)
    for row in rows:
        facts = [tok.encode(fact_sentence(g)[0]) for _ in range(cfg.facts)]
        span = sum(map(len, facts))
        firsts = np.sort(g.integers(1, width // 2 - span, size=cfg.facts))  # the draws of the rule, in order
        g.permutation(cfg.facts)
        g.integers(int(firsts[-1]) + cfg.min_distance, width - 2 * span + 1, size=cfg.facts)
        line = new_tokens[row].tolist()
        inserted = set()
        for fact in facts:
            at = occurrences(line, fact)
            assert len(at) == 2, (fact, at)
            assert at[0] < width // 2 and at[1] - (at[0] + len(fact)) >= cfg.min_distance
            for start in at:  # an inserted fact belongs to the document it was inserted into
                assert new_docs[row, start] == new_docs[row, start - 1]
                inserted |= set(range(start, start + len(fact)))
        # Without the inserted facts the row is the original row's beginning, in order.
        kept = [t for i, t in enumerate(line) if i not in inserted]
        assert len(kept) == width - 2 * sum(map(len, facts)) and kept == tokens[row, :len(kept)].tolist()


def test_episodes_are_deterministic_and_differ_by_domain():
    tok = load_tokenizer()
    tokens = np.random.default_rng(0).integers(2000, 4096, size=(20, 2049))
    docs = np.zeros_like(tokens)
    cfg = RetrievalConfig(fraction=0.1)
    a, b = insert_episodes(tokens, docs, cfg, tok, 0, "books"), insert_episodes(tokens, docs, cfg, tok, 0, "books")
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    c = insert_episodes(tokens, docs, cfg, tok, 0, "wiki")
    assert not np.array_equal(a[0], c[0])
    none = insert_episodes(tokens, docs, RetrievalConfig(), tok, 0, "books")
    assert none[0] is tokens and len(none[2]) == 0


def test_shared_attributes_leave_only_the_name_to_tell_facts_apart():
    import re

    pattern = re.compile(r" ([A-Z][a-z]+ [A-Z][a-z]+)'s ([a-z ]+) is (\w+)\.")
    for k in (1, 2):
        cfg = RetrievalConfig(fraction=0.5, facts=8, attributes=k)
        rng = np.random.default_rng(k)
        for _ in range(50):
            facts = [pattern.fullmatch(f).groups() for f in episode_facts(rng, cfg)]
            assert len({a for _, a, _ in facts}) <= k and {a for _, a, _ in facts} <= {a for a, _ in ATTRIBUTES}
            assert len({v for _, _, v in facts}) == 8  # no value twice: the name is the key
    # over episodes every attribute comes up, and with the default the facts of one episode mix them
    drawn = {pattern.fullmatch(f).group(2) for f in episode_facts(np.random.default_rng(0), RetrievalConfig(facts=8))}
    assert len(drawn) > 1
    # the default draws what it drew before the field existed: one fact_sentence per fact
    g, h = np.random.default_rng(9), np.random.default_rng(9)
    assert episode_facts(g, RetrievalConfig(facts=5)) == [fact_sentence(h)[0] for _ in range(5)]
    assert g.integers(1 << 30) == h.integers(1 << 30)


def test_name_last_moves_the_words_and_keeps_every_draw():
    import re

    tok = load_tokenizer()
    tokens = np.random.default_rng(2).integers(2000, 4096, size=(12, 1025))
    docs = np.zeros_like(tokens)
    first = RetrievalConfig(fraction=0.5, facts=4, min_distance=256, attributes=1)
    last = RetrievalConfig(fraction=0.5, facts=4, min_distance=256, attributes=1, form="name_last")
    a = episode_facts(np.random.default_rng(4), first)
    b = episode_facts(np.random.default_rng(4), last)
    said_first = [re.fullmatch(r" ([A-Z][a-z]+ [A-Z][a-z]+)'s ([a-z ]+) is (\w+)\.", f).groups() for f in a]
    said_last = [re.fullmatch(r" The ([a-z ]+) of ([A-Z][a-z]+ [A-Z][a-z]+) is (\w+)\.", f).groups() for f in b]
    # the same names, attributes and values, the name now right before " is"
    assert [(n, at, v) for n, at, v in said_first] == [(n, at, v) for at, n, v in said_last]
    # in a stream: the same rows, each fact twice, at most a few tokens away from where the first form put it
    x, y = (insert_episodes(tokens, docs, c, tok, 0, "books") for c in (first, last))
    assert np.array_equal(x[2], y[2]) and not np.array_equal(x[0], y[0])
    untouched = [r for r in range(12) if r not in y[2]]
    assert np.array_equal(x[0][untouched], y[0][untouched])
    import zlib
    g = np.random.default_rng([0, zlib.crc32(b"books"), 1])
    g.choice(12, size=6, replace=False)
    facts = [tok.encode(s) for s in episode_facts(g, last)]
    assert all(len(occurrences(y[0][y[2][0]].tolist(), f)) == 2 for f in facts)
    assert episode_facts(np.random.default_rng(0), RetrievalConfig(form="name_last"))[0].startswith(" The ")


def test_secret_form_says_the_papers_needle_with_distinct_ids_token_for_token():
    import re

    from streams.needles import needle_tokens

    tok = load_tokenizer()
    rng = np.random.default_rng(3)
    cfg = RetrievalConfig(fraction=0.5, facts=8, form="secret")
    for _ in range(30):
        facts = episode_facts(rng, cfg)
        said = [re.fullmatch(r" The secret number for ID-(\d{4}) is (\d{6})\.", f).groups() for f in facts]
        assert len({i for i, _ in said}) == 8  # only the ID tells them apart: never one twice
        # the knob's tokens are the NIAH secret needle's, so NIAH asks the trained sentence
        assert all(tok.encode(f) == needle_tokens(tok, i, n) for f, (i, n) in zip(facts, said))
    tokens = np.random.default_rng(2).integers(2000, 4096, size=(6, 1025))
    new, _, rows = insert_episodes(tokens, np.zeros_like(tokens), RetrievalConfig(fraction=0.5, form="secret"), tok, 0, "books")
    assert len(rows) == 3 and all(tok.decode(new[r].tolist()).count("The secret number for ID-") == 8 for r in rows)


def test_keyed_form_says_facts_told_apart_only_by_their_key_and_recalls_them_as_a_question():
    """Form "keyed" (issue 53's retrieval mix): one noun, prefix, alphabet and key length per
    episode, distinct keys; the second mention is the question and its answer; never the NIAH
    needle's noun or "ID-" prefix."""
    import re

    from streams.retrieval import KEYED_NOUNS, episode_mentions

    tok = load_tokenizer()
    rng = np.random.default_rng(4)
    cfg = RetrievalConfig(fraction=0.5, facts=5, form="keyed")
    seen_hex = seen_digits = False
    for _ in range(40):
        mentions = episode_mentions(rng, cfg)
        first = [re.fullmatch(r" The ([a-z ]+) for (#|key |user |item |unit |)([0-9a-f]{3,5}) is ([1-9][0-9]{2,6})\.", a)
                 for a, _ in mentions]
        assert all(first), mentions
        nouns, prefixes, keys, numbers = zip(*(m.groups() for m in first))
        assert len(set(nouns)) == 1 and nouns[0] in KEYED_NOUNS and "secret" not in nouns[0]
        assert len(set(prefixes)) == 1 and len(set(keys)) == 5 and len({len(k) for k in keys}) == 1
        seen_hex |= any(re.search("[a-f]", k) for k in keys)
        seen_digits |= all(k.isdigit() for k in keys)
        for (a, b), noun, prefix, key in zip(mentions, nouns, prefixes, keys):
            assert b == f" What is the {noun} for {prefix}{key}?{a}"  # the question, then the fact again
    assert seen_hex and seen_digits
    tokens = np.random.default_rng(2).integers(2000, 4096, size=(6, 1025))
    new, _, rows = insert_episodes(tokens, np.zeros_like(tokens), RetrievalConfig(fraction=0.5, facts=3,
                                                                                   min_distance=200, form="keyed"),
                                   tok, 0, "books")
    for r in rows:
        text = tok.decode(new[r].tolist())
        asked = re.findall(r"What is the ([a-z ]+) for ([^?]+)\? The \1 for \2 is (\d+)\.", text)
        assert len(asked) == 3 and "ID-" not in text
        for noun, key, number in asked:  # said before it is asked, with the same number
            assert text.index(f" The {noun} for {key} is {number}.") < text.index(f"What is the {noun} for {key}?")


@pytest.mark.parametrize("fields, message", [
    ({"form": "name_middle"}, "retrieval.form must be one of \\['name_first', 'name_last', 'secret', 'keyed'\\]"),
    ({"form": "keyed", "attributes": 1}, "retrieval.attributes does not apply to form 'keyed'"),
    ({"form": "secret", "attributes": 1}, "retrieval.attributes does not apply to form 'secret'"),
    ({"attributes": 7}, "retrieval.attributes must be an int in \\[0, 6\\]"),
    ({"attributes": -1}, "retrieval.attributes must be an int"),
    ({"attributes": 1, "facts": 9}, "retrieval.facts \\(9\\) with attributes"),
])
def test_bad_attributes_are_named(fields, message):
    with pytest.raises(ValueError, match=message):
        RetrievalConfig(**fields)


def test_too_many_facts_for_the_segment_are_refused():
    tok = load_tokenizer()
    tokens = np.zeros((4, 257), dtype=np.int64)
    with pytest.raises(ValueError, match="do not fit in a 256-token segment"):
        insert_episodes(tokens, tokens.copy(), RetrievalConfig(fraction=0.5, facts=4, min_distance=200), tok, 0, "d")


def write_stream(tmp_path, retrieval: str = "") -> str:
    rng = np.random.default_rng(1)
    words = "the a of in and to was he she it that with for on as his her at by".split()
    with open(tmp_path / "prose.jsonl", "w", encoding="utf-8") as f:
        for i in range(40):
            f.write(json.dumps({"text": " ".join(rng.choice(words, size=300))}) + "\n")
    path = tmp_path / f"stream{len(retrieval)}.yaml"
    path.write_text("domains:\n  - {name: prose, source: prose.jsonl, "
                    "token_budget: {pretrain: 5120, adapt: 512, eval: 512}}\n"
                    f"seq_len: 512\ncache_dir: {tmp_path / 'cache'}\n{retrieval}", encoding="utf-8")
    return str(path)


def test_only_the_pretraining_split_gets_episodes(tmp_path):
    plain = load_domains(load_stream_config(write_stream(tmp_path)))["prose"].splits
    knob = "retrieval: {fraction: 0.5, facts: 2, min_distance: 128}\n"
    taught = load_domains(load_stream_config(write_stream(tmp_path, knob)))["prose"].splits
    for part in ("eval", "adapt"):
        assert np.array_equal(plain[part].segments.tokens, taught[part].segments.tokens)
    a, b = plain["pretrain"].segments.tokens.numpy(), taught["pretrain"].segments.tokens.numpy()
    changed = [i for i in range(len(a)) if not np.array_equal(a[i], b[i])]
    assert a.shape == b.shape and len(changed) == round(0.5 * len(a))


def test_a_bad_retrieval_setting_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"retrieval.fraction must be a number in \[0, 1\], got 1.5"):
        load_stream_config(write_stream(tmp_path, "retrieval: {fraction: 1.5}\n"))
    with pytest.raises(ConfigError, match=r"retrieval: unknown key\(s\) \['fracton'\]; did you mean 'fraction'"):
        load_stream_config(write_stream(tmp_path, "retrieval: {fracton: 0.1}\n"))
