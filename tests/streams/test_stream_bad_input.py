"""Bad input: a clear error before any training, naming domain, file and line; nothing half-written."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from streams.errors import StreamDataError
from streams.sources import DomainConfig, FilterConfig
from streams.splits import TokenBudget
from streams.stream import StreamConfig, load_domains, load_stream_config

GOOD = DomainConfig(name="web", source="corpus:web", filters=FilterConfig(max_documents=60))
SMALL = TokenBudget(pretrain=1280, adapt=640, eval=320)


def _rows(n: int) -> list[str]:
    return [json.dumps({"id": i, "text": f"Document {i} has a few words in it."}) for i in range(n)]


def _write(path: Path, lines: list[str] | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = lines if isinstance(lines, bytes) else ("\n".join(lines) + "\n").encode("utf-8")
    path.write_bytes(data)
    return path


def _config(cache: Path, source: str, **domain_kwargs) -> StreamConfig:
    user = DomainConfig(name="mine", source=source, **domain_kwargs)
    # The bad domain comes last: its files must still be checked before any domain is tokenised.
    return StreamConfig(domains=[GOOD, user], seq_len=32, token_budget=SMALL, cache_dir=str(cache))


def _leftovers(cache: Path) -> dict[str, list[str]]:
    """Packed split cache files, and temporary / incomplete files anywhere in the cache."""
    from datasets import Dataset

    packed = [str(p) for p in cache.rglob("cache-*.arrow") if "doc_index" in Dataset.from_file(str(p)).column_names]
    partial = [str(p) for p in cache.rglob("*") if p.name.startswith("tmp") or p.name.endswith(".incomplete")]
    return {"packed": packed, "partial": partial}


def _expect(cfg: StreamConfig, count_work, match: str, file: Path | None = None, line: int | None = None):
    encode, _ = count_work
    with pytest.raises(StreamDataError, match=match) as info:
        load_domains(cfg)
    err = info.value
    assert err.domain == "mine" and "domain 'mine'" in str(err)
    if file is not None:
        assert err.file == str(file) and str(file) in str(err)
    assert err.line == line
    if line is not None:
        assert f"line {line}" in str(err)
    assert encode.calls == 0  # failed before any tokenisation, of any domain
    assert _leftovers(Path(cfg.cache_dir)) == {"packed": [], "partial": []}
    return err


def test_missing_file(tmp_path, count_work):
    _expect(_config(tmp_path / "c", str(tmp_path / "nope.jsonl")), count_work, "file does not exist", tmp_path / "nope.jsonl")


def test_empty_glob(tmp_path, count_work):
    (tmp_path / "data").mkdir()
    _expect(_config(tmp_path / "c", str(tmp_path / "data" / "*.jsonl")), count_work, r"glob .*\*\.jsonl' matches no file")


def test_empty_file(tmp_path, count_work):
    f = _write(tmp_path / "empty.jsonl", b"")
    _expect(_config(tmp_path / "c", str(f)), count_work, "file is empty", f)


def test_empty_gzip_file(tmp_path, count_work):
    f = _write(tmp_path / "empty.jsonl.gz", gzip.compress(b""))
    _expect(_config(tmp_path / "c", str(f)), count_work, "file is empty", f)


def test_malformed_json_line(tmp_path, count_work):
    rows = _rows(5)
    rows[2] = rows[2][:-5]  # truncated object on line 3
    f = _write(tmp_path / "bad.jsonl", rows)
    _expect(_config(tmp_path / "c", str(f)), count_work, "malformed JSON", f, line=3)


def test_malformed_json_in_second_gzip_file_of_a_glob(tmp_path, count_work):
    _write(tmp_path / "d" / "a.jsonl", _rows(30))
    rows = _rows(8)
    rows[6] = "{not json"
    bad = _write(tmp_path / "d" / "b.jsonl.gz", gzip.compress(("\n".join(rows) + "\n").encode()))
    _expect(_config(tmp_path / "c", str(tmp_path / "d" / "*.jsonl*")), count_work, "malformed JSON", bad, line=7)


def test_missing_text_field(tmp_path, count_work):
    rows = _rows(5)
    rows[1] = json.dumps({"id": 1, "body": "no text here"})
    f = _write(tmp_path / "missing.jsonl", rows)
    err = _expect(_config(tmp_path / "c", str(f)), count_work, "no field 'text'", f, line=2)
    assert "body" in str(err)  # shows what the line has instead


def test_text_field_absent_everywhere(tmp_path, count_work):
    f = _write(tmp_path / "other.jsonl", _rows(5))
    _expect(_config(tmp_path / "c", str(f), text_field="content"), count_work, "no field 'content'", f, line=1)


def test_non_string_text(tmp_path, count_work):
    rows = _rows(5)
    rows[3] = json.dumps({"id": 3, "text": 42})
    f = _write(tmp_path / "int.jsonl", rows)
    _expect(_config(tmp_path / "c", str(f)), count_work, "'text' is int, not a string", f, line=4)


def test_non_utf8_bytes(tmp_path, count_work):
    data = ("\n".join(_rows(3)) + "\n").encode() + b'{"id": 3, "text": "caf\xe9 latin-1"}\n'
    f = _write(tmp_path / "latin1.jsonl", data)
    _expect(_config(tmp_path / "c", str(f)), count_work, r"not valid UTF-8 \(byte 0xe9", f, line=4)


def test_non_utf8_text_file(tmp_path, count_work):
    _write(tmp_path / "t" / "a.txt", b"fine text\n")
    bad = _write(tmp_path / "t" / "b.txt", b"line one\nline \xff two\n")
    _expect(_config(tmp_path / "c", str(tmp_path / "t" / "*.txt")), count_work, "not valid UTF-8", bad, line=2)


def test_unknown_extension(tmp_path, count_work):
    f = _write(tmp_path / "data.csv", ["a,b"])
    _expect(_config(tmp_path / "c", str(f)), count_work, "cannot tell the format", f)


def test_domain_too_small_for_its_budget(tmp_path, count_work):
    f = _write(tmp_path / "tiny.jsonl", _rows(20))
    cfg = _config(tmp_path / "c", str(f))
    with pytest.raises(StreamDataError, match=r"domain 'mine'.*too small for its token budget: 20 documents hold") as info:
        load_domains(cfg)
    assert info.value.domain == "mine"
    # Tokenised (a complete, reusable cache entry) but nothing packed, not even the good domain.
    assert _leftovers(tmp_path / "c") == {"packed": [], "partial": []}


def test_filters_leave_nothing(tmp_path, count_work):
    f = _write(tmp_path / "short.jsonl", _rows(20))
    _expect(_config(tmp_path / "c", str(f), filters=FilterConfig(min_chars=10_000)), count_work, "no documents after filters")


def test_unknown_hub_id_offline(tmp_path, monkeypatch, count_work):
    import socket

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    attempts = []
    real_connect = socket.socket.connect
    monkeypatch.setattr(socket.socket, "connect", lambda self, addr: (attempts.append(addr), real_connect(self, addr))[1])
    err = _expect(
        _config(tmp_path / "c", "hub:no-such-user-3f9a/no-such-dataset"), count_work, "Hub dataset 'no-such-user-3f9a/no-such-dataset'"
    )
    assert "offline" in str(err) and "HF_HUB_OFFLINE" in str(err)
    assert attempts == []  # offline means no connection is even tried (no retries to wait for)


def test_duplicate_domain_names():
    with pytest.raises(ValueError, match=r"domains\[1\]: duplicate domain name 'web'"):
        StreamConfig(domains=[GOOD, DomainConfig(name="web", source="corpus:code")])


def test_yaml_config_errors_name_the_field(tmp_path):
    bad = {
        "dup.yaml": ("domains: [{name: a, source: x.jsonl}, {name: a, source: y.jsonl}]", "duplicate domain name 'a'"),
        "key.yaml": ("domains: [{name: a, source: x.jsonl, text_feild: body}]", r"domains\[0\]: unknown key\(s\) \['text_feild'\]"),
        "order.yaml": ("domains: [{name: a, source: x.jsonl}]\norder: [a, b]", r"order\[1\]: unknown domain 'b'"),
        "budget.yaml": ("domains: [{name: a, source: x.jsonl, token_budget: {eval: 0}}]", "token_budget.eval must be positive"),
        "seq.yaml": ("domains: [{name: a, source: x.jsonl}]\nseq_len: 1", "seq_len must be an int >= 2"),
        "fmt.yaml": ("domains: [{name: a, source: x.jsonl, format: csv}]", "format must be one of"),
        "top.yaml": ("domain: []", r"unknown key\(s\) \['domain'\]"),
    }
    for name, (text, match) in bad.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
        with pytest.raises(ValueError, match=match) as info:
            load_stream_config(tmp_path / name)
        assert name in str(info.value)


def test_changed_source_file_is_reloaded(tmp_path, count_work):
    encode, _ = count_work
    f = _write(tmp_path / "docs.jsonl", _rows(300))
    cfg = _config(tmp_path / "c", str(f))
    first = load_domains(cfg)["mine"]
    assert encode.calls > 0
    rows = _rows(300)
    rows[0] = json.dumps({"id": 0, "text": "A rewritten first document, longer than before."})
    _write(f, rows)
    calls = encode.calls
    second = load_domains(cfg)["mine"]
    assert second.documents["text"][0].startswith("A rewritten first document")
    assert first.documents["text"][0].startswith("Document 0")
    assert encode.calls > calls  # new content, new fingerprint, tokenised again
