"""The needle inserter: haystack length, needle placement, the source text kept in order, the
answer encoded as the needle holds it; bad input named."""
import re

import numpy as np
import pytest

from streams.needles import NeedleConfig, make_episode, needle_tokens
from streams.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


SOURCE = np.arange(5, 3005)  # distinct token ids: where each came from is visible


def test_needles_at_their_depths_and_the_text_kept_in_order(tok):
    cfg = NeedleConfig(haystack_tokens=600, needles=3, depths=(0.1, 0.5, 0.9))
    ep = make_episode(cfg, tok, SOURCE, np.random.default_rng(0), asked=1)
    assert len(ep.haystack) == 600
    needles = [needle_tokens(tok, i, n) for i, n in zip(ep.ids, ep.numbers)]
    text_len = 600 - sum(map(len, needles))
    before = 0
    for (a, b), needle, depth in zip(ep.needle_spans, needles, cfg.depths):
        assert ep.haystack[a:b] == needle
        assert a - before == round(depth * text_len)  # text tokens before it = depth of the text
        before += len(needle)
    text = [t for i, t in enumerate(ep.haystack) if not any(a <= i < b for a, b in ep.needle_spans)]
    assert len(text) == text_len and text == list(range(text[0], text[0] + text_len))  # one window, in order
    assert len(set(ep.ids)) == 3 and all(len(i) == 4 for i in ep.ids) and all(len(n) == 6 for n in ep.numbers)
    # the answer: the asked needle's number, the same tokens as in the needle, right after "is"
    assert tok.decode(ep.answer) == " " + ep.numbers[1]
    a, b = ep.needle_spans[1]
    assert ep.haystack[b - len(ep.answer) - 1:b - 1] == ep.answer
    assert tok.decode(ep.question).endswith(f"for ID-{ep.ids[1]} is") and ep.ids[1] in tok.decode(ep.question)
    assert ep.distance() == 600 - b + len(ep.question)
    # every needle's number starts at its answer_start, right after the needle's "is"
    for start, number, (a, b) in zip(ep.answer_starts, ep.candidates, ep.needle_spans):
        assert a < start and start + len(number) == b - 1 and ep.haystack[start:start + len(number)] == number
        assert tok.decode(ep.haystack[a:start]).endswith(" is")


def test_fact_needles_are_the_retrieval_knobs_sentences_restated_up_to_the_number(tok):
    cfg = NeedleConfig(haystack_tokens=600, needles=4, depths=(0.1, 0.3, 0.5, 0.7), style="fact")
    ep = make_episode(cfg, tok, SOURCE, np.random.default_rng(3), asked=2)
    assert len(ep.haystack) == 600 and len(set(ep.ids)) == 4 and len(set(ep.numbers)) == 4
    for (a, b), subject, number in zip(ep.needle_spans, ep.ids, ep.numbers):
        text = tok.decode(ep.haystack[a:b])
        assert re.fullmatch(r" [A-Z][a-z]+ [A-Z][a-z]+'s (locker number|pass code|room number) is \d{4}\.", text), text
        assert text == f" {subject} is {number}."
        assert "secret" not in text
    # the question is the asked needle's words up to its number, token for token, then the number
    a, b = ep.needle_spans[2]
    assert ep.haystack[a:a + len(ep.question)] == ep.question
    assert ep.haystack[a + len(ep.question):b - 1] == ep.answer and tok.decode(ep.answer) == " " + ep.numbers[2]
    assert ep.candidates[2] == ep.answer and ep.answer_starts[2] == a + len(ep.question)
    # the default style stays the secret-number needle
    secret = make_episode(NeedleConfig(haystack_tokens=600, needles=4, depths=(0.1, 0.3, 0.5, 0.7)), tok, SOURCE,
                          np.random.default_rng(3), asked=2)
    assert all(len(i) == 4 and i.isdigit() for i in secret.ids) and "secret number" in tok.decode(secret.haystack)


def test_word_needles_ask_a_value_of_a_closed_set(tok):
    from streams.retrieval import VALUES

    kinds = {"favourite colour": "colour", "home town": "town", "lucky stone": "stone"}
    cfg = NeedleConfig(haystack_tokens=600, needles=5, style="word")
    for seed in range(5):
        ep = make_episode(cfg, tok, SOURCE, np.random.default_rng(seed), asked=seed % 5)
        assert len(ep.haystack) == 600 and len(set(ep.ids)) == 5 and len(set(ep.numbers)) == 5
        for (a, b), subject, value in zip(ep.needle_spans, ep.ids, ep.numbers):
            text = tok.decode(ep.haystack[a:b])
            m = re.fullmatch(r" [A-Z][a-z]+ [A-Z][a-z]+'s (favourite colour|home town|lucky stone) is (\w+)\.", text)
            assert m and text == f" {subject} is {value}." and m.group(2) in VALUES[kinds[m.group(1)]], text
        a, b = ep.needle_spans[seed % 5]
        assert ep.haystack[a:a + len(ep.question)] == ep.question
        assert ep.haystack[a + len(ep.question):b - 1] == ep.answer == ep.candidates[seed % 5]
        assert tok.decode(ep.answer) == " " + ep.numbers[seed % 5]
    # the asked needle's attribute is shared when another needle has it; secret needles all share one
    shared = []
    for seed in range(40):
        ep = make_episode(cfg, tok, SOURCE, np.random.default_rng(seed), asked=seed % 5)
        attributes = [i.split("'s ")[1] for i in ep.ids]
        assert ep.attribute_count() == attributes.count(attributes[ep.asked]) >= 1
        assert ep.attribute_shared() == (attributes.count(attributes[ep.asked]) > 1)
        shared.append(ep.attribute_shared())
    assert 0 < sum(shared) < 40  # both kinds occur (5 needles, 3 attributes)
    secret = make_episode(NeedleConfig(haystack_tokens=600, needles=2, depths=(0.2, 0.6)), tok, SOURCE,
                          np.random.default_rng(0))
    assert secret.attribute_shared() and secret.attribute_count() == 2
    # 24 words in all: more needles than that cannot be told apart
    NeedleConfig(haystack_tokens=600, needles=24, depths=tuple(i / 24 for i in range(24)), style="word")
    with pytest.raises(ValueError, match="more than the 24 distinct word values"):
        NeedleConfig(haystack_tokens=600, needles=25, depths=tuple(i / 25 for i in range(25)), style="word")


def test_name_last_needles_say_the_same_facts_with_the_name_before_the_value(tok):
    for style in ("fact", "word"):
        cfg = NeedleConfig(haystack_tokens=600, needles=5, style=style)
        last = NeedleConfig(haystack_tokens=600, needles=5, style=style, form="name_last")
        for seed in range(3):
            a = make_episode(cfg, tok, SOURCE, np.random.default_rng(seed), asked=seed)
            b = make_episode(last, tok, SOURCE, np.random.default_rng(seed), asked=seed)
            assert (a.ids, a.numbers, a.answer, a.candidates) == (b.ids, b.numbers, b.answer, b.candidates)
            assert len(b.haystack) == 600 and b.attribute_shared() == a.attribute_shared()
            for (s, e), subject, value in zip(b.needle_spans, b.ids, b.numbers):
                name, attribute = subject.split("'s ")
                assert tok.decode(b.haystack[s:e]) == f" The {attribute} of {name} is {value}."
            s, e = b.needle_spans[seed]
            assert b.haystack[s:s + len(b.question)] == b.question and b.haystack[s + len(b.question):e - 1] == b.answer
            asked_name = b.ids[seed].split("'s ")[0]
            assert tok.decode(b.question).endswith(f" of {asked_name} is")


def test_same_generator_same_episode(tok):
    cfg = NeedleConfig(haystack_tokens=300, needles=2, depths=(0.2, 0.4))
    a = make_episode(cfg, tok, SOURCE, np.random.default_rng(7))
    b = make_episode(cfg, tok, SOURCE, np.random.default_rng(7))
    c = make_episode(cfg, tok, SOURCE, np.random.default_rng(8))
    assert a == b and a.haystack != c.haystack


@pytest.mark.parametrize("fields, message", [
    ({"depths": (0.1, 1.5), "needles": 2}, "depth 1.5 is outside"),
    ({"depths": (-0.1,), "needles": 1}, "depth -0.1 is outside"),
    ({"depths": (0.1, 0.2), "needles": 3}, "has 2 entries for needles=3"),
    ({"haystack_tokens": 60, "needles": 5}, "shorter than its 5 needles"),
    ({"haystack_tokens": 0}, "haystack_tokens must be a positive int"),
    ({"style": "riddle"}, "needles.style must be one of"),
    ({"style": "fact", "form": "last"}, "needles.form must be one of"),
    ({"form": "name_last"}, "needles.form applies to styles 'fact' and 'word'"),
    ({"template": "The code of {id} is {number}. And {number}."}, "must hold {id} once and {number} once"),
    ({"template": "The code of {id}: {number}."}, "the number last, after ' is '"),
    ({"template": "{number} is the code of {id}."}, "the number last"),
    ({"id_alphabet": "octal"}, "needles.id_alphabet must be one of"),
    ({"id_length": 0}, "needles.id_length must be a positive int"),
    ({"id_length": 1, "needles": 10, "depths": [0.05 * i for i in range(10)]}, "more than the 9 distinct IDs"),
    ({"style": "fact", "id_alphabet": "hex"}, "apply to style 'secret'"),
])
def test_bad_configs_are_named(fields, message):
    with pytest.raises(ValueError, match=message):
        NeedleConfig(**fields)


def test_source_shorter_than_the_haystack_is_named(tok):
    with pytest.raises(ValueError, match="haystack source has 100 tokens"):
        make_episode(NeedleConfig(haystack_tokens=200, needles=1, depths=(0.5,)), tok, SOURCE[:100],
                     np.random.default_rng(0))
    with pytest.raises(ValueError, match="depth 2 is outside"):
        make_episode(NeedleConfig(haystack_tokens=200, needles=1, depths=(0.5,)), tok, SOURCE,
                     np.random.default_rng(0), depths=[2])


def test_any_template_hex_ids_and_number_length(tok):
    """Another sentence, 4 hex characters, 4-digit numbers: the needle is the template filled in,
    the question the paper's form for it, the answer the number as the needle holds it."""
    cfg = NeedleConfig(haystack_tokens=600, needles=5, template="The access key for locker {id} is {number}!",
                       id_alphabet="hex", number_digits=4)
    eps = [make_episode(cfg, tok, SOURCE, np.random.default_rng(seed)) for seed in range(20)]
    ids = [i for ep in eps for i in ep.ids]
    assert all(re.fullmatch(r"[0-9a-f]{4}", i) for i in ids)
    assert any(re.search(r"[a-f]", i) for i in ids) and any(i.startswith("0") for i in ids)  # hex, leading 0 allowed
    assert all(len(set(ep.ids)) == 5 for ep in eps)
    assert all(re.fullmatch(r"[1-9][0-9]{3}", n) for ep in eps for n in ep.numbers)
    ep = eps[0]
    for (a, b), id_, number in zip(ep.needle_spans, ep.ids, ep.numbers):
        assert tok.decode(ep.haystack[a:b]) == f" The access key for locker {id_} is {number}!"
    asked = ep.ids[ep.asked]
    assert tok.decode(ep.question) == f" What is the access key for locker {asked}? The access key for locker {asked} is"
    assert tok.decode(ep.answer) == " " + ep.numbers[ep.asked]
    start = ep.answer_starts[ep.asked]
    assert ep.haystack[start:start + len(ep.answer)] == ep.answer  # "!" after it, as "." is after the paper's


def test_the_default_template_is_the_papers_needle_and_question(tok):
    ep = make_episode(NeedleConfig(haystack_tokens=600, needles=3, depths=(0.1, 0.5, 0.9)), tok, SOURCE,
                      np.random.default_rng(3))
    asked = ep.ids[ep.asked]
    assert tok.decode(ep.question) == f" What is the secret number for ID-{asked}? The secret number for ID-{asked} is"
    assert all(1000 <= int(i) <= 9999 for i in ep.ids) and all(100000 <= int(n) <= 999999 for n in ep.numbers)
