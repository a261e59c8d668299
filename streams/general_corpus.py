"""Build the "general" pretraining corpus: openly licensed English prose, in long documents.

    clp data build-general --gutenberg DIR --wikipedia DIR [--out DIR]

    git clone https://github.com/rcdm-uga/Gutenberg_Text      # DIR for --gutenberg
    git clone https://github.com/ZhouYii/PatchedDistro        # DIR for --wikipedia

Why: the shipped corpora (`streams/corpora/{math,law,code,web}`) are a few million characters
each, enough to stream but not to pretrain a base on general text; this corpus is ~240 M
characters of books and encyclopedia articles, long documents for a memory that works across
thousands of tokens. It is too big to ship (and Wikipedia text is share-alike), so the package
ships the exact recipe instead: this builder and `streams/corpora/general/SOURCES.json`, which
pins both source repositories to a commit and every file the corpus is made from to its git
blob id. The build writes `streams/corpora/general/data/` (git-ignored), which the stream source
`corpus:general` then reads like a shipped corpus.

Sources and licences (attribution in `streams/corpora/general/README.md`):
- Project Gutenberg books, `github.com/rcdm-uga/Gutenberg_Text` (`<Author>/<Title>.txt`): public
  domain in the US; the Project Gutenberg licence and trademark text in each file's header and
  footer are stripped (PG's terms ask exactly that of a redistribution without its trademark).
  Some works are public domain in the US only: check your own jurisdiction.
- English Wikipedia as WikiExtractor output, `github.com/ZhouYii/PatchedDistro` (`data/*/wiki_NN`,
  a contiguous page-id slice of a dump of about 2013-14): CC BY-SA 3.0. Attribution: every
  article keeps its title and URL; anything made from it and redistributed must be shared alike.

Cleaning, Gutenberg (`clean_book`):
- header and footer: the body lies between the `*** START OF TH(E|IS) PROJECT GUTENBERG ...`
  and `*** END OF ...` marker lines. Files of the old "Project Gutenberg Etext" format have no
  markers: their body starts after the `*END*THE SMALL PRINT! ...*END*` line that closes the
  licence header and ends at the last `End of (the) Project Gutenberg ...` line, if any. A file
  with neither is dropped (`no_markers`: the World Library Shakespeare files, whose header claims
  a copyright, are all of them). Producer credits among the first three paragraphs ("Produced
  by ...") and every paragraph that names Project Gutenberg (editors' notes, "End of the Project
  Gutenberg EBook ...": PG's licence asks a copy without it to carry no reference to PG) are
  removed. A file with 50 or more HTML structure tags (`<p>`, `<br>`, ...) is an HTML page: dropped.
- text: CRLF to LF; hard-wrapped lines unwrapped: paragraphs are separated by blank lines, the
  lines of a paragraph joined by one space (runs of spaces collapsed), paragraphs joined by a
  blank line ("\\n\\n"). A block most of whose lines are shorter than 50 characters is verse or
  a list: its line breaks are kept.
- language: dropped if the header's `Language:` does not name English, or if fewer than 25 % of
  the words in three 20,000-character windows (at 1/4, 1/2, 3/4 of the body) are among 40 common
  English function words (at the pinned commit: median book 41 %, lowest kept 27 %; the dropped
  ones, bilingual editions, a Middle English glossary, Pennsylvania Dutch, 2-23 %).
- length: bodies under 20,000 characters are dropped.
- duplicates, in sorted path order (the first one is kept): a body whose key (sha256 of the
  first 4,000 and the middle 4,000 letters and digits, lower-cased) was seen (`duplicate`); a
  body of which half or more of the paragraphs of 200+ letters already appeared in a kept book
  (`near_duplicate`: a "Volume 2" after its "Complete", a translation issued twice).

Selection, Gutenberg: the remaining books in sha256(path) order (a fixed shuffle, so that every
author folder is sampled, not the first letters of the alphabet); a book is taken if its author
folder stays within 5 % of the character target (illustrator folders such as "Doré, Gustave"
hold other writers' books: the folder, not the writer, is capped); the longest such prefix
within the target (default 200,000,000 characters). Wikipedia: articles of at least 2,000
characters (doc tags and the repeated title line removed, one paragraph per line joined by
blank lines, tags WikiExtractor left behind removed, `<br>` as a space), files in sorted path
order, articles in file order, the longest prefix within the target (default 40,000,000).
Nothing else is random.

Reproducibility: `make_manifest` applies the rule to the whole of both sources and writes the
manifest: the selected files and their blob ids (sha1 of `b"blob %d\\0" % size + content`, so a
plain download is checked as well as a clone). `build` reads only the manifest's files (from the
git repository at the pinned commit when the folder is one, a clone or a bare mirror, else from
the plain folder), checks every one against its blob id before anything is written, applies the
same rule to them (which keeps them all) and writes the shards to a temporary folder, which
replaces `data/` only once complete and, where the manifest records the shards of the reference
build, equal to them. A failed build leaves the previous one untouched.

Output: `data/gutenberg-NNNNN.jsonl.gz` then `data/wikipedia-NNNNN.jsonl.gz` (that order is the
corpus's document order), ~50 M characters (~19 MB) per shard, one JSON object per line with
sorted keys {author, id, source, text, title, url} (gzip without timestamp or name, so a rebuild
is byte-identical), and `data/BUILD.json`: source commits, documents and characters per source,
what was dropped and why, per-shard sha256, the builder version.

Maintainers, after changing the rule (rewrites SOURCES.json, then builds and records the shards):

    python -m streams.general_corpus --make-manifest --gutenberg DIR --wikipedia DIR
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from cl_platform.atomic import atomic_write, atomic_write_text
from streams.errors import StreamDataError

BUILDER_VERSION = 1
NAME = "general"
GENERAL_DIR = Path(__file__).resolve().parent / "corpora" / NAME
MANIFEST = GENERAL_DIR / "SOURCES.json"
DATA = "data"  # the built corpus: <out>/data/*.jsonl.gz + BUILD.json (what `corpus:general` reads)
BUILD_COMMAND = "clp data build-general --gutenberg DIR --wikipedia DIR"

GUTENBERG_URL = "https://github.com/rcdm-uga/Gutenberg_Text"
GUTENBERG_COMMIT = "a0b16d35a9851168ce9ac649851c17b7ab08d48e"
WIKIPEDIA_URL = "https://github.com/ZhouYii/PatchedDistro"

GUTENBERG_CHARS = 200_000_000
WIKIPEDIA_CHARS = 40_000_000
AUTHOR_SHARE = 0.05  # of the Gutenberg target, per author folder
MIN_BOOK_CHARS = 20_000
MIN_ARTICLE_CHARS = 2_000
SHARD_CHARS = 50_000_000  # of text per shard (~19 MB gzip-compressed)

VERSE_LINE_CHARS = 50
LANGUAGE_WINDOW = 20_000
MIN_STOPWORD_RATIO = 0.25
DEDUP_CHARS = 4_000
NEAR_DUP_PARAGRAPH = 200  # letters and digits
NEAR_DUP_MIN_PARAGRAPHS = 10
NEAR_DUP_SHARE = 0.5

STOPWORDS = frozenset(
    "the of and to a in that is was he it for with as his i on be at by had not her you but this "
    "have which from she they or all were my so him are we an".split()
)

Log = Callable[[str], None]


class BuildError(StreamDataError):
    """A source or manifest cannot be used; one line naming the file where known (the CLI prints it)."""

    def __init__(self, message: str, file: str | None = None):
        super().__init__(NAME, message, file=file)
        where = f" ({file})" if file is not None else ""
        self.args = (f"corpus '{NAME}'{where}: {message}",)


def blob_id(data: bytes) -> str:
    """Git's id of a file's content: sha1 of `blob <size>\\0<content>`."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _git_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | {"GIT_TERMINAL_PROMPT": "0"}


class SourceTree:
    """The files of one source folder. A git repository there (a clone, or a bare mirror) is read
    at the pinned commit with `git cat-file --batch`, whatever its working tree holds; any other
    folder is read from disk. Every read is checked against the blob id the caller expects."""

    def __init__(self, label: str, root: Path, commit: str):
        self.label, self.root, self.commit = label, Path(root), commit
        if not self.root.is_dir():
            raise BuildError(f"{label} source folder {self.root} does not exist (clone {_url(label)} there)")
        self.git = self._is_git()
        self._proc: subprocess.Popen | None = None
        if self.git:
            ok = self._run("cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode == 0
            if not ok:
                raise BuildError(
                    f"{label} repository {self.root} lacks the pinned commit {commit} "
                    f"(git -C {self.root} fetch origin {commit}, or clone the full history)"
                )

    def _is_git(self) -> bool:
        looks_git = (self.root / ".git").exists() or ((self.root / "HEAD").is_file() and (self.root / "objects").is_dir())
        if not looks_git:
            return False
        if shutil.which("git") is None:
            if (self.root / ".git").exists():
                return False  # a working tree without git installed: read (and check) the files on disk
            raise BuildError(f"{self.label} source {self.root} is a bare git repository and git is not installed")
        r = self._run("rev-parse", "--git-dir", check=False)
        if r.returncode != 0:
            first = (r.stderr.decode(errors="replace").strip().splitlines() or ["unknown error"])[0]
            raise BuildError(f"{self.label} source {self.root} looks like a git repository git cannot read: {first}")
        return True

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run(["git", "-C", str(self.root), *args], capture_output=True, env=_git_env())
        if check and r.returncode != 0:
            first = (r.stderr.decode(errors="replace").strip().splitlines() or ["unknown error"])[0]
            raise BuildError(f"git {args[0]} failed in {self.root}: {first}")
        return r

    def listing(self) -> dict[str, str] | None:
        """path -> blob id of every file at the commit (git only; None for a plain folder)."""
        if not self.git:
            return None
        out: dict[str, str] = {}
        for rec in self._run("ls-tree", "-r", "-z", "--full-tree", self.commit).stdout.split(b"\0"):
            if not rec:
                continue
            meta, path = rec.split(b"\t", 1)
            _, kind, sha = meta.split()
            if kind == b"blob":
                out[path.decode("utf-8", "surrogateescape")] = sha.decode()
        return out

    def read(self, path: str, expected: str) -> bytes | None:
        """The file's bytes, checked against its expected blob id; None if absent."""
        if self.git:
            data = self._cat(expected)
        else:
            p = self.root / path
            data = p.read_bytes() if p.is_file() else None
        if data is not None and blob_id(data) != expected:
            raise BuildError(
                f"source file differs from the pinned version (blob {blob_id(data)}, expected {expected}): "
                f"the {self.label} source changed; use commit {self.commit}",
                file=path,
            )
        return data

    def _cat(self, sha: str) -> bytes | None:
        if self._proc is None:
            self._proc = subprocess.Popen(
                ["git", "-C", str(self.root), "cat-file", "--batch"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_git_env(),
            )
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(sha.encode() + b"\n")
        self._proc.stdin.flush()
        header = self._proc.stdout.readline().split()
        if len(header) < 2 or header[1] == b"missing":
            return None
        data = self._proc.stdout.read(int(header[2]))
        self._proc.stdout.read(1)  # the newline after the content
        return data

    def close(self) -> None:
        if self._proc is not None:
            self._proc.stdin.close()  # type: ignore[union-attr]
            self._proc.wait()
            self._proc = None

    def __enter__(self) -> "SourceTree":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _url(label: str) -> str:
    return GUTENBERG_URL if label == "gutenberg" else WIKIPEDIA_URL


_START = re.compile(r"^[ \t]*\*{3}[ \t]*START OF (?:THE|THIS) PROJECT GUTENBERG[^\n]*$", re.M | re.I)
_END = re.compile(r"^[ \t]*\*{3}[ \t]*END OF (?:THE|THIS) PROJECT GUTENBERG[^\n]*$", re.M | re.I)
_SMALL_PRINT_END = re.compile(r"^[ \t]*\**END\*?[ \t]*THE SMALL PRINT[^\n]*$", re.M | re.I)
_END_LINE = re.compile(r"^[ \t]*(?:The )?End of (?:the |this )?Project Gutenberg[^\n]*$", re.M | re.I)
_CREDIT = re.compile(
    r"^(?:Produced by|E-?text prepared by|This e-?(?:text|book) was (?:prepared|produced|created) by|"
    r"Prepared by|Scanned by|Transcribed by|Digitized by)\b", re.I
)
_NAMES_PG = re.compile(r"Project Gutenberg|gutenberg\.(?:org|net)|Michael S\. Hart", re.I)
_HTML = re.compile(r"</?(?:p|br|div|h[1-6]|pre|table|tr|td)\b[^>\n]*>", re.I)
HTML_TAGS = 50  # a "text" file with this many structural HTML tags is an HTML file: dropped
_FIELD = re.compile(r"^(Title|Author|Language):[ \t]*(.*(?:\n[ \t]+\S.*)*)", re.M)
_EBOOK_NO = re.compile(r"\[(?:EBook|E-?text) #(\d+)\]", re.I)
_BLANKS = re.compile(r"\n[ \t]*(?:\n[ \t]*)+")
_SPACES = re.compile(r"[ \t]+")
_WORD = re.compile(r"[^\W\d_]+")
_NOT_ALNUM = re.compile(r"[\W_]+")


@dataclass
class Book:
    """One cleaned Gutenberg book; `text` is dropped (None) once only its length matters."""

    path: str
    folder: str  # the author folder: the unit of the 5 % cap
    title: str
    author: str
    url: str | None
    text: str | None
    chars: int
    format: str = "marker"  # "marker" or "etext": how its header and footer were found


def split_gutenberg(text: str) -> tuple[str, str, str] | None:
    """(header, body, format) of a Gutenberg file with LF newlines; None when no header is found."""
    start = _START.search(text)
    if start is not None:
        begin = start.end()
        if not start.group(0).rstrip().endswith("***"):  # the marker's title wrapped onto the next line
            nxt = re.match(r"\n[^\n]*\*\*\*[ \t]*(?=\n)", text[begin:])
            begin += nxt.end() if nxt else 0
        end = _END.search(text, begin)
        body = text[begin: end.start() if end else len(text)]
        if end is None:  # no END marker: cut at the closing line or the licence, whichever is first
            cut = [m.start() for m in (_END_LINE.search(body), re.search(r"\*{3} ?START: FULL LICENSE", body)) if m]
            body = body[: min(cut)] if cut else body
        return text[: start.start()], body, "marker"
    small = _SMALL_PRINT_END.search(text)
    if small is not None:
        ends = list(_END_LINE.finditer(text, small.end()))
        return text[: small.start()], text[small.end(): ends[-1].start() if ends else len(text)], "etext"
    return None


def header_fields(header: str) -> dict[str, str]:
    """Title / Author / Language of a PG header (continuation lines joined), where present."""
    fields: dict[str, str] = {}
    for m in _FIELD.finditer(header):
        fields.setdefault(m.group(1).lower(), _SPACES.sub(" ", " ".join(m.group(2).split("\n"))).strip())
    return fields


def unwrap(body: str) -> str:
    """Hard-wrapped text -> paragraphs separated by one blank line (see the module docstring)."""
    paragraphs = []
    for block in _BLANKS.split(body):
        lines = [_SPACES.sub(" ", line).strip() for line in block.split("\n")]
        lines = [line for line in lines if line]
        if not lines:
            continue
        short = sum(len(line) < VERSE_LINE_CHARS for line in lines[:-1])
        verse = len(lines) > 1 and 2 * short > len(lines) - 1
        paragraphs.append("\n".join(lines) if verse else " ".join(lines))
    return "\n\n".join(paragraphs)


def _strip_credits(text: str) -> str:
    """Without producer credits among the first three paragraphs ("Produced by ...") and without
    any paragraph that names Project Gutenberg (editors' notes, "End of the Project Gutenberg ...")."""
    paragraphs = text.split("\n\n")
    paragraphs = [p for i, p in enumerate(paragraphs) if not (i < 3 and _CREDIT.match(p)) and not _NAMES_PG.search(p)]
    return "\n\n".join(paragraphs)


def stopword_ratio(text: str) -> float:
    """Share of common English function words among the words of three windows of the text."""
    n = len(text)
    words: list[str] = []
    for at in (n // 4, n // 2, 3 * n // 4):
        lo = max(0, min(at - LANGUAGE_WINDOW // 2, n - LANGUAGE_WINDOW))
        words += _WORD.findall(text[lo: lo + LANGUAGE_WINDOW].lower())
    return sum(w in STOPWORDS for w in words) / len(words) if words else 0.0


def dedup_key(text: str) -> str:
    """sha256 of the first and the middle DEDUP_CHARS letters and digits (lower-cased)."""
    mid = len(text) // 2
    first = _NOT_ALNUM.sub("", text[: 4 * DEDUP_CHARS].lower())[:DEDUP_CHARS]
    middle = _NOT_ALNUM.sub("", text[mid: mid + 4 * DEDUP_CHARS].lower())[:DEDUP_CHARS]
    return hashlib.sha256(f"{first}|{middle}".encode()).hexdigest()


def paragraph_hashes(text: str) -> frozenset[bytes]:
    out = set()
    for p in text.split("\n\n"):
        norm = _NOT_ALNUM.sub("", p.lower())
        if len(norm) >= NEAR_DUP_PARAGRAPH:
            out.add(hashlib.blake2b(norm.encode(), digest_size=8).digest())
    return frozenset(out)


def clean_book(path: str, data: bytes) -> tuple[Book | None, str]:
    """A Gutenberg file -> (Book, "marker" | "etext") or (None, why it is dropped)."""
    try:
        raw = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        return None, "not_utf8"
    raw = raw.replace("\r\n", "\n").replace("\r", "\n")
    parts = split_gutenberg(raw)
    if parts is None:
        return None, "no_markers"
    header, body, fmt = parts
    if len(_HTML.findall(body)) >= HTML_TAGS:
        return None, "html"
    fields = header_fields(header)
    text = _strip_credits(unwrap(body))
    if "language" in fields and "english" not in fields["language"].lower():
        return None, "not_english"
    if stopword_ratio(text) < MIN_STOPWORD_RATIO:
        return None, "not_english"
    if len(text) < MIN_BOOK_CHARS:
        return None, "too_short"
    folder, _, name = path.partition("/")
    stem = name[:-4] if name.endswith(".txt") else name
    number = _EBOOK_NO.search(header)
    book = Book(
        path=path,
        folder=folder,
        title=fields.get("title") or _SPACES.sub(" ", stem.replace("\r", ": ")).strip(),
        author=fields.get("author") or folder,
        url=f"https://www.gutenberg.org/ebooks/{number.group(1)}" if number else None,
        text=text,
        chars=len(text),
        format=fmt,
    )
    return book, fmt


def is_book_path(path: str) -> bool:
    """`<Author>/<Title>[.txt]`: one folder deep, not a hidden file (.DS_Store)."""
    parts = path.split("/")
    return len(parts) == 2 and not parts[1].startswith(".") and not parts[0].startswith(".")


class Deduplicator:
    """Exact (`dedup_key`) and near (`paragraph_hashes`) duplicates of the books kept so far."""

    def __init__(self) -> None:
        self.keys: set[str] = set()
        self.seen: set[bytes] = set()

    def verdict(self, book: Book) -> str | None:
        assert book.text is not None
        key = dedup_key(book.text)
        if key in self.keys:
            return "duplicate"
        hashes = paragraph_hashes(book.text)
        if len(hashes) >= NEAR_DUP_MIN_PARAGRAPHS and len(hashes & self.seen) >= NEAR_DUP_SHARE * len(hashes):
            return "near_duplicate"
        self.keys.add(key)
        self.seen |= hashes
        return None


def select_books(books: list[Book], target_chars: int, author_share: float = AUTHOR_SHARE) -> tuple[list[Book], int]:
    """The selection rule on deduplicated books: (chosen books in path order, books skipped by the cap)."""
    cap = author_share * target_chars
    order = sorted(books, key=lambda b: hashlib.sha256(b.path.encode("utf-8", "surrogateescape")).hexdigest())
    chosen, per_folder, total, capped = [], Counter(), 0, 0
    for book in order:
        if per_folder[book.folder] + book.chars > cap:
            capped += 1
            continue
        if total + book.chars > target_chars:
            break
        chosen.append(book)
        per_folder[book.folder] += book.chars
        total += book.chars
    return sorted(chosen, key=lambda b: b.path), capped


_DOC_OPEN = re.compile(r'^<doc id="([^"]*)" url="([^"]*)" title="(.*)">$')
_WIKI_BR = re.compile(r"<br\b[^>]*>", re.I)
_WIKI_TAG = re.compile(
    r"</?(?:ref|references|table|tr|td|th|poem|onlyinclude|noinclude|includeonly|small|big|center|div|span|font|"
    r"gallery|sup|sub|blockquote|nowiki)\b[^>]*>", re.I
)


def _wiki_paragraph(line: str) -> str:
    return _SPACES.sub(" ", _WIKI_TAG.sub("", _WIKI_BR.sub(" ", line))).strip()


def wiki_articles(path: str, data: bytes) -> Iterator[dict]:
    """Articles of one WikiExtractor file, in file order: {id, url, title, text}."""
    import html

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BuildError(f"not valid UTF-8 (byte {e.start})", file=path) from None
    doc: dict | None = None
    lines: list[str] = []
    for line in text.replace("\r\n", "\n").split("\n"):
        if doc is None:
            m = _DOC_OPEN.match(line)
            if m:
                doc, lines = {"id": m.group(1), "url": m.group(2), "title": html.unescape(m.group(3))}, []
            continue
        if line == "</doc>":
            while lines and not lines[0].strip():
                lines.pop(0)
            if lines and html.unescape(lines[0].strip()) == doc["title"]:
                lines.pop(0)
            body = [s for s in (_wiki_paragraph(ln) for ln in lines) if s]
            yield {**doc, "text": "\n\n".join(body)}
            doc = None
            continue
        lines.append(line)
    if doc is not None:
        raise BuildError(f"unterminated <doc id=\"{doc['id']}\"> (no </doc>)", file=path)


def is_wiki_path(path: str) -> bool:
    return re.fullmatch(r"data/[A-Z]{2}/wiki_\d+", path) is not None


@dataclass
class Selection:
    books: list[Book]
    articles: list[dict]
    book_files: dict[str, str]  # path -> blob id of the chosen books
    wiki_files: dict[str, str]  # path -> blob id of the files the chosen articles come from
    dropped: dict[str, dict[str, int]]
    formats: dict[str, int]


def _select(
    guten: SourceTree,
    wiki: SourceTree,
    book_files: dict[str, str],
    wiki_files: dict[str, str],
    gutenberg_chars: int,
    wikipedia_chars: int,
    keep_text: bool,
    log: Log,
) -> Selection:
    dropped: dict[str, Counter] = {"gutenberg": Counter(), "wikipedia": Counter()}
    dedup, kept = Deduplicator(), []
    for i, path in enumerate(sorted(book_files)):
        if i and i % 500 == 0:
            log(f"  gutenberg: {i:,} of {len(book_files):,} files read")
        data = guten.read(path, book_files[path])
        if data is None:
            dropped["gutenberg"]["absent_from_source"] += 1
            continue
        book, why = clean_book(path, data)
        if book is None:
            dropped["gutenberg"][why] += 1
            continue
        dup = dedup.verdict(book)
        if dup is not None:
            dropped["gutenberg"][dup] += 1
            continue
        if not keep_text:
            book.text = None
        kept.append(book)
    books, capped = select_books(kept, gutenberg_chars)
    dropped["gutenberg"]["author_cap"] = capped
    dropped["gutenberg"]["over_target"] = len(kept) - len(books) - capped

    articles, used, total, full = [], {}, 0, False
    for path in sorted(wiki_files):
        if full:
            break
        data = wiki.read(path, wiki_files[path])
        if data is None:
            dropped["wikipedia"]["absent_from_source"] += 1
            continue
        for art in wiki_articles(path, data):
            if len(art["text"]) < MIN_ARTICLE_CHARS:
                dropped["wikipedia"]["too_short"] += 1
                continue
            if total + len(art["text"]) > wikipedia_chars:
                full = True  # the longest prefix within the target ends here
                break
            articles.append(art)
            used[path] = wiki_files[path]
            total += len(art["text"])
    return Selection(
        books=books,
        articles=articles,
        book_files={b.path: book_files[b.path] for b in books},
        wiki_files=used,
        dropped={k: dict(sorted(v.items())) for k, v in dropped.items()},
        formats=dict(sorted(Counter(b.format for b in books).items())),
    )


def read_manifest(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BuildError("the manifest does not exist", file=str(path)) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BuildError(f"the manifest is not readable JSON ({e})", file=str(path)) from None
    try:
        for src in ("gutenberg", "wikipedia"):
            entry = data[src]
            if not re.fullmatch(r"[0-9a-f]{40}", entry["commit"]):
                raise ValueError(f"{src}.commit is not a 40-hex commit id")
            for p, sha in entry["files"].items():
                if p.startswith("/") or ".." in p.split("/") or not re.fullmatch(r"[0-9a-f]{40}", sha):
                    raise ValueError(f"{src}.files: bad entry {p!r}: {sha!r}")
        int(data["targets"]["gutenberg_chars"]), int(data["targets"]["wikipedia_chars"])
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise BuildError(f"not a general-corpus manifest ({type(e).__name__}: {e})", file=str(path)) from None
    return data


def make_manifest(gutenberg: Path, wikipedia: Path, manifest: Path = MANIFEST, *,
                  gutenberg_commit: str = GUTENBERG_COMMIT, wikipedia_commit: str | None = None,
                  gutenberg_chars: int = GUTENBERG_CHARS, wikipedia_chars: int = WIKIPEDIA_CHARS,
                  log: Log = lambda s: None) -> dict:
    """Apply the rule to the whole of both sources (git repositories) and write the manifest."""
    if wikipedia_commit is None:
        r = subprocess.run(["git", "-C", str(wikipedia), "rev-parse", "HEAD"], capture_output=True, env=_git_env())
        if r.returncode != 0:
            raise BuildError(f"wikipedia source {wikipedia} is not a git repository: pass wikipedia_commit")
        wikipedia_commit = r.stdout.decode().strip()
    with SourceTree("gutenberg", gutenberg, gutenberg_commit) as guten, SourceTree("wikipedia", wikipedia, wikipedia_commit) as wiki:
        if not (guten.git and wiki.git):
            raise BuildError("make_manifest needs both sources as git repositories (the manifest pins commits)")
        glist, wlist = guten.listing() or {}, wiki.listing() or {}
        book_files = {p: s for p, s in glist.items() if is_book_path(p)}
        wiki_files = {p: s for p, s in wlist.items() if is_wiki_path(p)}
        log(f"scanning {len(book_files):,} Gutenberg files and {len(wiki_files):,} Wikipedia files")
        sel = _select(guten, wiki, book_files, wiki_files, gutenberg_chars, wikipedia_chars, keep_text=False, log=log)
    data = {
        "builder_version": BUILDER_VERSION,
        "build_command": BUILD_COMMAND,
        "targets": {"gutenberg_chars": gutenberg_chars, "wikipedia_chars": wikipedia_chars},
        "gutenberg": {"url": GUTENBERG_URL, "commit": gutenberg_commit, "files": dict(sorted(sel.book_files.items()))},
        "wikipedia": {"url": WIKIPEDIA_URL, "commit": wikipedia_commit, "files": dict(sorted(sel.wiki_files.items()))},
        "scan": {
            "gutenberg_files": len(book_files),
            "wikipedia_files": len(wiki_files),
            "formats_chosen": sel.formats,
            "dropped": sel.dropped,
        },
        "shards": {},
    }
    atomic_write_text(manifest, json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    return data


def record_shards(manifest: Path, build_info: dict) -> None:
    """Pin the shards of a reference build in the manifest (a later build is checked against them)."""
    data = read_manifest(manifest)
    data["shards"] = {s["file"]: {"sha256": s["sha256"], "content_sha256": s["content_sha256"]} for s in build_info["shards"]}
    atomic_write_text(manifest, json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def _rows(sel: Selection) -> tuple[list[dict], list[dict]]:
    books = [
        {"id": b.path, "source": "gutenberg", "title": b.title, "author": b.author, "url": b.url, "text": b.text}
        for b in sel.books
    ]
    articles = [
        {"id": a["id"], "source": "wikipedia", "title": a["title"], "author": None, "url": a["url"], "text": a["text"]}
        for a in sel.articles
    ]
    return books, articles


def _shards(rows: list[dict], prefix: str) -> Iterator[tuple[str, list[dict]]]:
    shard: list[dict] = []
    chars, n = 0, 0
    for row in rows:
        shard.append(row)
        chars += len(row["text"])
        if chars >= SHARD_CHARS:
            yield f"{prefix}-{n:05d}.jsonl.gz", shard
            shard, chars, n = [], 0, n + 1
    if shard:
        yield f"{prefix}-{n:05d}.jsonl.gz", shard


def _gzip_jsonl(rows: Iterable[dict]) -> tuple[bytes, str]:
    """(gzip bytes without timestamp or name, sha256 of the uncompressed content)."""
    content = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows).encode("utf-8")
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        gz.write(content)
    return buf.getvalue(), hashlib.sha256(content).hexdigest()


def build(gutenberg: Path, wikipedia: Path, out: Path = GENERAL_DIR, *, manifest: Path = MANIFEST,
          gutenberg_chars: int | None = None, wikipedia_chars: int | None = None, log: Log = lambda s: None) -> dict:
    """Build the corpus into `out/data/` from the manifest's files; returns BUILD.json's content.

    `gutenberg_chars` / `wikipedia_chars` default to the manifest's targets (200 M / 40 M); a
    smaller one builds a prefix of the same selection, a larger one is refused (the manifest pins
    no more). Raises `BuildError` for a bad source before anything is written."""
    pinned = read_manifest(manifest)
    targets = pinned["targets"]
    gutenberg_chars = int(targets["gutenberg_chars"]) if gutenberg_chars is None else gutenberg_chars
    wikipedia_chars = int(targets["wikipedia_chars"]) if wikipedia_chars is None else wikipedia_chars
    for name, want in (("gutenberg_chars", gutenberg_chars), ("wikipedia_chars", wikipedia_chars)):
        if want > int(targets[name]):
            raise BuildError(f"{name}={want:,} is more than the manifest pins ({int(targets[name]):,}); "
                             f"a larger corpus needs a new manifest (make_manifest)", file=str(manifest))
    out = Path(out)
    with SourceTree("gutenberg", gutenberg, pinned["gutenberg"]["commit"]) as guten, \
            SourceTree("wikipedia", wikipedia, pinned["wikipedia"]["commit"]) as wiki:
        for tree, src in ((guten, "gutenberg"), (wiki, "wikipedia")):
            _check_present(tree, pinned[src]["files"])
        log(f"reading {len(pinned['gutenberg']['files']):,} books and {len(pinned['wikipedia']['files']):,} "
            f"Wikipedia files ({'git' if guten.git else 'folder'} / {'git' if wiki.git else 'folder'})")
        sel = _select(guten, wiki, pinned["gutenberg"]["files"], pinned["wikipedia"]["files"],
                      gutenberg_chars, wikipedia_chars, keep_text=True, log=log)
    books, articles = _rows(sel)
    expected = pinned.get("shards") or {}
    check = bool(expected) and (gutenberg_chars, wikipedia_chars) == (int(targets["gutenberg_chars"]), int(targets["wikipedia_chars"]))

    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=out))
    try:
        staged = tmp / DATA
        staged.mkdir()
        shards = []
        for rows, prefix in ((books, "gutenberg"), (articles, "wikipedia")):
            for file, part in _shards(rows, prefix):
                data, content_sha = _gzip_jsonl(part)
                atomic_write(staged / file, lambda f, d=data: f.write(d), binary=True)
                shards.append({
                    "file": file, "documents": len(part), "chars": sum(len(r["text"]) for r in part),
                    "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "content_sha256": content_sha,
                })
                log(f"  wrote {file}: {len(part):,} documents, {len(data) / 1e6:.1f} MB")
        if check:
            _check_shards(shards, expected, log)
        info = {
            "builder_version": BUILDER_VERSION,
            "sources": {
                src: {"url": pinned[src]["url"], "commit": pinned[src]["commit"], "files": len(pinned[src]["files"])}
                for src in ("gutenberg", "wikipedia")
            },
            "targets": {"gutenberg_chars": gutenberg_chars, "wikipedia_chars": wikipedia_chars},
            "documents": {"gutenberg": len(books), "wikipedia": len(articles)},
            "chars": {"gutenberg": sum(len(r["text"]) for r in books), "wikipedia": sum(len(r["text"]) for r in articles)},
            "gutenberg_formats": sel.formats,
            "dropped": sel.dropped,
            "checked_against_manifest": check,
            "shards": shards,
        }
        atomic_write_text(staged / "BUILD.json", json.dumps(info, indent=1, ensure_ascii=False) + "\n")
        _swap_in(staged, out / DATA, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return info


def _check_present(tree: SourceTree, files: dict[str, str]) -> None:
    """Every pinned file is there (and, in a git repository, has its pinned blob id): fails fast."""
    listing = tree.listing()
    if listing is None:
        missing = [p for p in sorted(files) if not (tree.root / p).is_file()]
    else:
        missing = [p for p in sorted(files) if p not in listing]
        changed = [p for p in sorted(files) if p in listing and listing[p] != files[p]]
        if changed:
            raise BuildError(
                f"source file differs from the pinned version (blob {listing[changed[0]]}, expected {files[changed[0]]}, "
                f"{len(changed)} file(s) differ): the {tree.label} source changed", file=changed[0])
    if missing:
        raise BuildError(f"pinned {tree.label} source file is missing from {tree.root} "
                         f"({len(missing)} of {len(files)} missing)", file=missing[0])


def _check_shards(shards: list[dict], expected: dict, log: Log) -> None:
    names = [s["file"] for s in shards]
    if sorted(names) != sorted(expected):
        raise BuildError(f"the build made shards {names}, the manifest pins {sorted(expected)}; nothing was replaced")
    for s in shards:
        want = expected[s["file"]]
        if s["content_sha256"] != want["content_sha256"]:
            raise BuildError(
                f"shard {s['file']} differs from the pinned build (content sha256 {s['content_sha256'][:16]}..., "
                f"expected {want['content_sha256'][:16]}...); nothing was replaced")
        if s["sha256"] != want["sha256"]:
            log(f"  note: {s['file']} has the pinned content but other gzip bytes (another zlib)")


def _swap_in(staged: Path, target: Path, tmp: Path) -> None:
    """Replace `target` by `staged` (both in one folder tree): the old one is moved aside first."""
    old = tmp / "previous"
    if target.exists():
        os.replace(target, old)
    try:
        os.replace(staged, target)
    except OSError:
        if old.exists():
            os.replace(old, target)
        raise


def main(gutenberg: str, wikipedia: str, out: str | None = None) -> int:
    """`clp data build-general`: build the corpus from the two clones and print what was made."""
    import time

    t0 = time.perf_counter()
    target = Path(out) if out is not None else GENERAL_DIR
    info = build(Path(gutenberg), Path(wikipedia), target, log=print)
    print(summary(info, target / DATA, time.perf_counter() - t0))
    return 0


def summary(info: dict, data_dir: Path, seconds: float) -> str:
    lines = [f"built {data_dir} in {seconds:.0f} s"]
    for src in ("gutenberg", "wikipedia"):
        lines.append(f"  {src:10s} {info['documents'][src]:7,} documents  {info['chars'][src] / 1e6:7.1f} M chars  "
                     f"(commit {info['sources'][src]['commit'][:12]})")
    total = sum(s["bytes"] for s in info["shards"])
    lines.append(f"  {len(info['shards'])} shards, {total / 1e6:.1f} MB; "
                 + ("every shard equals the pinned build" if info["checked_against_manifest"] else "not checked against pinned shards"))
    return "\n".join(lines)


def _cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streams.general_corpus", description=__doc__.split("\n\n")[0])
    parser.add_argument("--gutenberg", required=True, help="clone of " + GUTENBERG_URL)
    parser.add_argument("--wikipedia", required=True, help="clone of " + WIKIPEDIA_URL)
    parser.add_argument("--out", default=None, help="corpus folder (default: streams/corpora/general)")
    parser.add_argument("--make-manifest", action="store_true",
                        help="maintainers: re-apply the rule to the whole sources, rewrite SOURCES.json, build, pin the shards")
    args = parser.parse_args(argv)
    try:
        if not args.make_manifest:
            return main(args.gutenberg, args.wikipedia, args.out)
        make_manifest(Path(args.gutenberg), Path(args.wikipedia), MANIFEST, log=print)
        target = Path(args.out) if args.out is not None else GENERAL_DIR
        info = build(Path(args.gutenberg), Path(args.wikipedia), target, log=print)
        record_shards(MANIFEST, info)
        print(f"wrote {MANIFEST} and pinned {len(info['shards'])} shards")
        return 0
    except (StreamDataError, OSError) as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(_cli())
