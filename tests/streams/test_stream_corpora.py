"""The shipped corpora: contents pinned by hash, a license beside every data file, the subset rule."""
from __future__ import annotations

import gzip
import hashlib
import os
import re
from pathlib import Path

import pytest

from streams.build_corpora import CORPORA_DIR, RULES, SubsetRule, build, select

README = CORPORA_DIR / "README.md"


def _pinned() -> dict[str, str]:
    return {m.group(2): m.group(1) for m in re.finditer(r"^([0-9a-f]{64})  (\S+\.jsonl\.gz)$", README.read_text(), re.M)}


def _content_hash(path: Path) -> str:
    return hashlib.sha256(gzip.decompress(path.read_bytes())).hexdigest()


def test_shipped_files_match_the_readme():
    pinned = _pinned()
    assert sorted(pinned) == sorted(r.out for r in RULES)
    for rel, digest in pinned.items():
        assert _content_hash(CORPORA_DIR / rel) == digest, rel
    total = sum((CORPORA_DIR / rel).stat().st_size for rel in pinned)
    assert total < 12e6  # the package stays small


def test_every_data_folder_has_its_license():
    for rel in _pinned():
        folder = (CORPORA_DIR / rel).parent
        licenses = [p.name for p in folder.iterdir() if p.name.startswith("LICENSE") or p.name == "CUAD_v1_README.txt"]
        assert licenses, folder
        text = "".join((folder / n).read_text(encoding="utf-8") for n in licenses)
        assert any(k in text for k in ("MIT License", "PSF", "CC BY 4.0", "ODC-By")), folder


def test_subset_rule():
    rows = [{"id": f"doc{i}", "text": "x" * (100 * i)} for i in range(1, 21)]
    every = select(rows, SubsetRule(sources=(), out="", licenses=(), every=3))
    assert [r["id"] for r in every] == [f"doc{i}" for i in range(1, 21, 3)]
    rule = SubsetRule(sources=(), out="", licenses=(), min_chars=300, max_chars=1500, hash_prefix_chars=4000)
    chosen = select(rows, rule)
    assert all(300 <= len(r["text"]) <= 1500 for r in chosen)
    assert [r["id"] for r in chosen] == sorted(r["id"] for r in chosen)  # written in id order
    assert sum(len(r["text"]) for r in chosen) <= 4000
    by_hash = sorted((r for r in rows if 300 <= len(r["text"]) <= 1500), key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest())
    assert {r["id"] for r in chosen} == {r["id"] for r in by_hash[: len(chosen)]}  # a prefix of the hash order
    assert sum(len(r["text"]) for r in by_hash[: len(chosen) + 1]) > 4000  # ... the longest one that fits


@pytest.mark.skipif(not os.environ.get("CLP_SHARED_DATA"), reason="set CLP_SHARED_DATA to the full corpora to check a rebuild")
def test_rebuild_reproduces_the_shipped_files(tmp_path):
    build(Path(os.environ["CLP_SHARED_DATA"]), tmp_path)
    for rel, digest in _pinned().items():
        assert _content_hash(tmp_path / rel) == digest, rel
        assert (tmp_path / rel).read_bytes() == (CORPORA_DIR / rel).read_bytes()
