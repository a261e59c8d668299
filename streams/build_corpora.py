"""Rebuild the shipped domain corpora (`streams/corpora/`) from the full source corpora.

    python -m streams.build_corpora /path/to/shared/data [--out streams/corpora]

The project ships a deterministic subset of each source corpus so that the default stream works
offline and the wheel stays small. This script is the exact, documented rule that produced the
shipped files (see `streams/corpora/README.md`); running it again on the same inputs rewrites
byte-identical files (documents in a fixed order, JSON with sorted keys, gzip with a zero
timestamp and no file name in the header).

Subset rule per domain:
- math: every GSM8K problem (train, then test); every third MATH problem (train, then test,
  file order; rows 0, 3, 6, ...), which keeps all seven subjects and five levels.
- law:  CUAD contracts of 5,000 to 60,000 characters (drops one-page exhibits and the longest
  agreements, so that one contract cannot fill an eval split), ordered by sha256(id); the longest
  prefix of that order whose text totals at most 5,000,000 characters; written in id order.
- code: CPython standard-library modules of 1,000 to 50,000 characters, same hash-ordered prefix
  rule with 6,000,000 characters; written in id (path) order.
- web:  all 2,000 C4 documents, file order.

The source rows are read as raw JSON lines, not through `datasets`: its JSON reader turns C4's
`timestamp` strings into datetimes, and the shipped rows must be the source rows unchanged.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

CORPORA_DIR = Path(__file__).resolve().parent / "corpora"


@dataclass(frozen=True)
class SubsetRule:
    """How one shipped file is cut from one or more source files."""

    sources: tuple[str, ...]  # relative to the shared data dir, concatenated in this order
    out: str  # relative to the corpora dir
    licenses: tuple[str, ...]  # copied beside `out`
    every: int = 1  # keep rows 0, every, 2*every, ... of the concatenation
    min_chars: int = 0
    max_chars: int | None = None
    hash_prefix_chars: int | None = None  # sha256(id) order, longest prefix within this many chars


# One rule a shipped file: (sources, out, licenses) then what is kept of them.
RULES: tuple[SubsetRule, ...] = (
    SubsetRule(("math/gsm8k/train.jsonl.gz", "math/gsm8k/test.jsonl.gz"), "math/gsm8k/gsm8k.jsonl.gz",
               ("math/gsm8k/LICENSE",)),
    SubsetRule(("math/hendrycks_math/train.jsonl.gz", "math/hendrycks_math/test.jsonl.gz"),
               "math/hendrycks_math/math.jsonl.gz", ("math/hendrycks_math/LICENSE",), every=3),
    SubsetRule(("law/cuad/contracts.jsonl.gz",), "law/cuad/contracts.jsonl.gz", ("law/cuad/CUAD_v1_README.txt",),
               min_chars=5_000, max_chars=60_000, hash_prefix_chars=5_000_000),
    SubsetRule(("code/cpython_stdlib/stdlib.jsonl.gz",), "code/cpython_stdlib/stdlib.jsonl.gz",
               ("code/cpython_stdlib/LICENSE.txt",), min_chars=1_000, max_chars=50_000, hash_prefix_chars=6_000_000),
    # The source ships no licence; LICENSE.md in corpora/web/c4 is written by hand.
    SubsetRule(("web/c4/c4_validation_2k.jsonl.gz",), "web/c4/c4_validation_2k.jsonl.gz", ()),
)


def _read_rows(paths: list[Path]) -> list[dict]:
    rows: list[dict] = []
    for path in paths:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            rows.extend(json.loads(line) for line in f if line.strip())
    return rows


def select(rows: list[dict], rule: SubsetRule) -> list[dict]:
    """Apply one subset rule to the concatenated source rows (pure; the rule's documentation)."""
    kept = rows[:: rule.every]
    kept = [
        r
        for r in kept
        if len(r["text"]) >= rule.min_chars and (rule.max_chars is None or len(r["text"]) <= rule.max_chars)
    ]
    if rule.hash_prefix_chars is not None:
        by_hash = sorted(kept, key=lambda r: hashlib.sha256(r["id"].encode("utf-8")).hexdigest())
        chosen, total = [], 0
        for r in by_hash:
            if total + len(r["text"]) > rule.hash_prefix_chars:
                break
            chosen.append(r)
            total += len(r["text"])
        kept = sorted(chosen, key=lambda r: r["id"])
    return kept


def write_jsonl_gz(rows: list[dict], path: Path) -> None:
    """Byte-reproducible gzip: no timestamp, no embedded file name; written to a temp file first."""
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        for r in rows:
            gz.write((json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8"))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(path)


def build(shared_data: Path, out_dir: Path = CORPORA_DIR) -> list[tuple[str, int, int]]:
    """Write every shipped file; returns (file, documents, characters) per file."""
    missing = [s for rule in RULES for s in rule.sources + rule.licenses if not (shared_data / s).is_file()]
    if missing:
        raise FileNotFoundError(f"{shared_data} is not the shared data dir: missing {', '.join(missing)}")
    summary = []
    for rule in RULES:
        rows = select(_read_rows([shared_data / s for s in rule.sources]), rule)
        target = out_dir / rule.out
        write_jsonl_gz(rows, target)
        for lic in rule.licenses:
            shutil.copyfile(shared_data / lic, target.parent / Path(lic).name)
        summary.append((rule.out, len(rows), sum(len(r["text"]) for r in rows)))
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streams.build_corpora", description=__doc__.split("\n\n")[0])
    parser.add_argument("shared_data", type=Path, help="the full corpora (the directory with math/, law/, code/, web/)")
    parser.add_argument("--out", type=Path, default=CORPORA_DIR, help="output directory (default: the shipped one)")
    args = parser.parse_args(argv)
    for out, docs, chars in build(args.shared_data, args.out):
        size = (args.out / out).stat().st_size
        print(f"{out:45s} {docs:6d} docs {chars / 1e6:6.2f} M chars {size / 1e6:5.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
