"""The shipped byte-level BPE: ids of the specials, exact roundtrip on every domain, determinism."""
from __future__ import annotations

import gzip
import hashlib
import json

import pytest

from streams.sources import corpus_files, shipped_corpora
from streams.tokenizer import EOT, PAD, SHIPPED_PATH, load_tokenizer, train_tokenizer


def _first_texts(domain: str, n: int) -> list[str]:
    # Plain gzip/json on purpose: the tokenizer must not depend on the stream loader to be tested.
    texts = []
    for path in corpus_files(domain):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                texts.append(json.loads(line)["text"])
                if len(texts) == n:
                    return texts
    return texts


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_shipped_file_identity(tok):
    assert tok.vocab_size == 4096
    assert (tok.eot_id, tok.pad_id) == (0, 1)
    assert tok.token(0) == EOT and tok.token(1) == PAD
    assert tok.fingerprint == hashlib.sha256(SHIPPED_PATH.read_bytes()).hexdigest()
    assert load_tokenizer(SHIPPED_PATH).fingerprint == tok.fingerprint


@pytest.mark.parametrize("domain", ["math", "law", "code", "web"])
def test_roundtrip_real_text(tok, domain):
    assert domain in shipped_corpora()
    texts = _first_texts(domain, 5)
    for text, ids in zip(texts, tok.encode_batch(texts)):
        assert ids == tok.encode(text)
        assert tok.decode(ids) == text  # byte-level: exact, whitespace and unicode included
        assert min(ids) > tok.pad_id  # document text never produces a special id
        assert max(ids) < tok.vocab_size
        assert len(ids) < len(text.encode("utf-8"))  # merges compress real text


def test_compression_differs_by_domain(tok):
    ratios = {}
    for domain in ("math", "law", "code", "web"):
        texts = _first_texts(domain, 20)
        ratios[domain] = sum(len(t) for t in texts) / sum(len(x) for x in tok.encode_batch(texts))
    # Trained on all four domains: every domain gets well past 2 characters per token.
    assert all(2.2 < r < 6 for r in ratios.values()), ratios


def test_special_token_text_is_not_special(tok):
    text = f"a{EOT}b{PAD}"
    ids = tok.encode(text)
    assert tok.eot_id not in ids and tok.pad_id not in ids
    assert tok.decode(ids) == text
    assert tok.decode([tok.eot_id]) == EOT


def test_unicode_and_odd_bytes_roundtrip(tok):
    text = "naïve café — 数学 ∑_{i=1}^n i² 🙂\t\r\n  \x00 end"
    assert tok.decode(tok.encode(text)) == text


def test_training_is_deterministic_and_counts_specials(tmp_path):
    texts = _first_texts("web", 40) + _first_texts("code", 5)
    a = train_tokenizer(texts, vocab_size=600, out_path=tmp_path / "a.json")
    b = train_tokenizer(texts, vocab_size=600, out_path=tmp_path / "b.json")
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert a.fingerprint == b.fingerprint == load_tokenizer(tmp_path / "a.json").fingerprint
    assert a.vocab_size == 600 and (a.eot_id, a.pad_id) == (0, 1)
    assert a.decode(a.encode(texts[0])) == texts[0]


def test_training_from_files(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(_first_texts("math", 50)), encoding="utf-8")
    tok = train_tokenizer([path], vocab_size=400)
    assert tok.vocab_size == 400
    with pytest.raises(TypeError):
        train_tokenizer([path, "some text"], vocab_size=400)
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["x"], vocab_size=100)


def test_missing_file_is_a_clear_error(tmp_path, monkeypatch):
    # A misspelt path of the user's names the shipped tokenizers; rebuilding the default one
    # (`clp tokenizer build`) would give another tokenizer, so it is suggested only when the
    # shipped default itself is missing.
    with pytest.raises(FileNotFoundError, match=r"nope.json does not exist; the shipped tokenizers are .*tokenizer.json, "
                                                r".*tokenizer_general.json") as info:
        load_tokenizer(tmp_path / "nope.json")
    assert "clp tokenizer build" not in str(info.value)
    import streams.tokenizer as module

    monkeypatch.setattr(module, "SHIPPED_PATH", tmp_path / "assets" / "tokenizer.json")
    with pytest.raises(FileNotFoundError, match="clp tokenizer build"):
        load_tokenizer()


@pytest.mark.slow
def test_shipped_tokenizer_is_reproducible(tmp_path, capsys):
    # `clp tokenizer build` on the shipped corpora must give back the shipped file byte for byte
    # (fails if the corpora, the sample rule or the `tokenizers` trainer changed).
    from streams.tokenizer_build import main

    assert main(out=str(tmp_path / "tok.json"), vocab_size=4096) == 0
    assert (tmp_path / "tok.json").read_bytes() == SHIPPED_PATH.read_bytes()
    assert "vocab_size=4096" in capsys.readouterr().out
