"""The general-corpus builder on tiny synthetic sources: real git repositories made here, with a
manifest written by the test (no network, no mirrors). What is kept and dropped, the exact text,
determinism, loading through `corpus:general`, and bad sources failing before anything is written."""
from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

import streams.general_corpus as gc
import streams.sources as sources
from streams.errors import StreamDataError

TARGETS = {"gutenberg_chars": 1_200_000, "wikipedia_chars": 1_000_000}  # author cap: 5 % = 60,000 chars
LICENCE = "Section 1. General Terms of Use and Redistributing Project Gutenberg-tm electronic works"


def english(tag: str, n: int = 110) -> list[str]:
    """n distinct English paragraphs (~250 chars each) naming `tag`."""
    return [
        f"{tag} paragraph {i}: it was the end of the day and the man had gone to the house that he had seen in "
        f"the town, for it was not his way to be out at night with her; and so {tag} {i} came to be told as it "
        f"is told here, in the words of one who was there."
        for i in range(n)
    ]


def french(n: int = 110) -> list[str]:
    return [
        f"Le jour {i} était fini et l'homme était allé vers la maison qu'il avait vue dans la ville, car ce "
        f"n'était guère son habitude de sortir seul durant la nuit avec elle; voilà comment cette histoire "
        f"nous fut racontée."
        for i in range(n)
    ]


VERSE = ["Tyger Tyger, burning bright,", "In the forests of the night;", "What immortal hand or eye,",
         "Could frame thy fearful symmetry?"]


def wrapped(paragraphs: list[str], verse: list[str] | None = None) -> str:
    """Hard-wrapped at 70 columns, indented verse after the first paragraph, CRLF line ends."""
    blocks = ["\n".join(textwrap.wrap(p, 70)) for p in paragraphs]
    if verse:
        blocks.insert(1, "\n".join("    " + line for line in verse))
    return "\n\n".join(blocks).replace("\n", "\r\n")


def modern(title: str, author: str, body: str, number: int, language: str | None = "English") -> bytes:
    head = (
        f"The Project Gutenberg EBook of {title}, by {author}\r\n\r\n"
        "This eBook is for the use of anyone anywhere at no cost and with\r\nalmost no restrictions whatsoever.\r\n\r\n"
        f"Title: {title}\r\n\r\nAuthor: {author}\r\n\r\nRelease Date: June, 1998 [EBook #{number}]\r\n\r\n"
        + (f"Language: {language}\r\n\r\n" if language else "")
        + f"*** START OF THIS PROJECT GUTENBERG EBOOK {title.upper()} ***\r\n\r\n\r\n"
        "Produced by Anonymous Volunteers\r\n\r\n\r\n\r\n"
    )
    tail = (
        f"\r\n\r\n\r\nEnd of the Project Gutenberg EBook of {title}, by {author}\r\n\r\n"
        f"*** END OF THIS PROJECT GUTENBERG EBOOK {title.upper()} ***\r\n\r\n{LICENCE}\r\n"
    )
    return (head + body + tail).encode("utf-8")


def etext(title: str, body: str) -> bytes:
    return (
        f"Project Gutenberg Etext of {title}\r\n\r\nCopyright laws are changing all over the world, be sure to check\r\n"
        "the copyright laws for your country before posting these files!!\r\n\r\n"
        "*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\r\n\r\n"
        f"{body}\r\n\r\n\r\nEnd of Project Gutenberg Etext of {title}\r\n"
    ).encode("utf-8")


LONG_WIKI = " ".join(f"Anarchism is a political philosophy, sentence {i} of its lead." for i in range(40))
WIKI_00 = (
    '<doc id="12" url="http://en.wikipedia.org/wiki?curid=12" title="Anarchism &amp; Order">\n'
    "Anarchism &amp; Order\n\n"
    f"{LONG_WIKI}\nHistory.\nThe term first appeared<br>in the 1640s.</ref>\n\n</doc>\n"
    '<doc id="25" url="http://en.wikipedia.org/wiki?curid=25" title="Stub">\nStub\n\nA short stub.\n</doc>\n'
)
WIKI_01 = (
    '<doc id="39" url="http://en.wikipedia.org/wiki?curid=39" title="Albedo">\nAlbedo\n\n'
    + "\n".join(f"Albedo paragraph {i} is about the reflected share of light from a surface." for i in range(40))
    + "\n</doc>\n"
)

PRIDE = english("pride")
EMMA = english("emma")
OLD = english("oldbook")
PROLIFIC = {f"Prolific, Writer/Book {k}.txt": english(f"prolific{k}") for k in range(3)}

GUTENBERG_FILES = {
    ".DS_Store": b"\x00\x01",
    "Austen, Jane/Pride and Prejudice.txt": modern("Pride and Prejudice", "Jane Austen", wrapped(PRIDE, VERSE), 1342),
    "Austen, Jane/Emma.txt": modern("Emma", "Jane Austen", wrapped(EMMA), 158),
    "Copy, Folder/Pride again.txt": modern("Pride, another edition", "J. Austen", wrapped(PRIDE, VERSE), 99999),
    "Hugo, Victor/Les Misérables.txt": modern("Les Misérables", "Victor Hugo", wrapped(french()), 135, language=None),
    "Old, Etext/Old Book.txt": etext("Old Book", wrapped(OLD)),
    "Anon, Nobody/No Markers.txt": wrapped(english("nomarkers")).encode("utf-8"),
    **{p: modern(p.split("/")[1][:-4], "Prolific Writer", wrapped(body), 500 + i) for i, (p, body) in enumerate(PROLIFIC.items())},
}
WIKIPEDIA_FILES = {"generate.py": b"print('unrelated')\n", "data/AA/wiki_00": WIKI_00.encode(), "data/AA/wiki_01": WIKI_01.encode()}


def _git(root: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(root), "-c", "user.name=test", "-c", "user.email=test@example.org", "-c", "commit.gpgsign=false",
         "-c", "core.autocrlf=false", *args],
        check=True, capture_output=True, env={"PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(root)},
    )
    return out.stdout.decode().strip()


def make_repo(root: Path, files: dict[str, bytes]) -> str:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "sources")
    return _git(root, "rev-parse", "HEAD")


def write_manifest(path: Path, commits: dict[str, str], **changes) -> Path:
    data = {
        "builder_version": gc.BUILDER_VERSION,
        "build_command": gc.BUILD_COMMAND,
        "targets": dict(TARGETS),
        "gutenberg": {"url": gc.GUTENBERG_URL, "commit": commits["gutenberg"],
                      "files": {p: gc.blob_id(d) for p, d in GUTENBERG_FILES.items() if gc.is_book_path(p)}},
        "wikipedia": {"url": gc.WIKIPEDIA_URL, "commit": commits["wikipedia"],
                      "files": {p: gc.blob_id(d) for p, d in WIKIPEDIA_FILES.items() if gc.is_wiki_path(p)}},
        "shards": {},
    }
    for key, value in changes.items():
        data[key] = value
    path.write_text(json.dumps(data, indent=1))
    return path


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("sources")
    commits = {"gutenberg": make_repo(root / "gutenberg", GUTENBERG_FILES),
               "wikipedia": make_repo(root / "wikipedia", WIKIPEDIA_FILES)}
    manifest = write_manifest(root / "SOURCES.json", commits)
    built = root / "built"
    info = gc.build(root / "gutenberg", root / "wikipedia", built, manifest=manifest)
    return {"root": root, "commits": commits, "manifest": manifest, "out": built, "info": info}


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for f in sorted((out / gc.DATA).glob("*.jsonl.gz")) for line in gzip.open(f, "rt", encoding="utf-8")]


def shard_hashes(out: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted((out / gc.DATA).iterdir())}


def test_books_kept_and_dropped(src):
    info, got = src["info"], {r["id"]: r for r in rows(src["out"])}
    books = sorted(i for i, r in got.items() if r["source"] == "gutenberg")
    prolific = [b for b in books if b.startswith("Prolific")]
    assert sorted(set(books) - set(prolific)) == ["Austen, Jane/Emma.txt", "Austen, Jane/Pride and Prejudice.txt", "Old, Etext/Old Book.txt"]
    # 3 prolific books of ~27,000 chars, a cap of 5 % x 1,200,000: two fit, the third is skipped
    assert len(prolific) == 2 and sum(len(got[b]["text"]) for b in prolific) <= 0.05 * TARGETS["gutenberg_chars"]
    assert info["dropped"]["gutenberg"] == {"author_cap": 1, "duplicate": 1, "no_markers": 1, "not_english": 1, "over_target": 0}
    assert info["gutenberg_formats"] == {"etext": 1, "marker": 4}
    assert info["documents"] == {"gutenberg": 5, "wikipedia": 2}
    assert info["chars"]["gutenberg"] == sum(len(got[b]["text"]) for b in books)


def test_book_text_exact(src):
    got = {r["id"]: r for r in rows(src["out"])}
    pride = got["Austen, Jane/Pride and Prejudice.txt"]
    # header, credit, closing line, END marker and licence gone; paragraphs unwrapped; verse lines kept
    assert pride["text"] == "\n\n".join([PRIDE[0], "\n".join(VERSE), *PRIDE[1:]])
    assert "\r" not in pride["text"] and "Gutenberg" not in pride["text"] and "Produced by" not in pride["text"]
    assert (pride["title"], pride["author"], pride["url"]) == ("Pride and Prejudice", "Jane Austen", "https://www.gutenberg.org/ebooks/1342")
    old = got["Old, Etext/Old Book.txt"]
    assert old["text"] == "\n\n".join(OLD)
    assert (old["title"], old["author"], old["url"]) == ("Old Book", "Old, Etext", None)


def test_wikipedia_articles(src):
    wiki = [r for r in rows(src["out"]) if r["source"] == "wikipedia"]
    assert [(r["id"], r["title"]) for r in wiki] == [("12", "Anarchism & Order"), ("39", "Albedo")]  # the stub is dropped
    assert wiki[0]["text"] == f"{LONG_WIKI}\n\nHistory.\n\nThe term first appeared in the 1640s."
    assert wiki[0]["url"] == "http://en.wikipedia.org/wiki?curid=12" and wiki[0]["author"] is None
    assert wiki[1]["text"].startswith("Albedo paragraph 0 ")  # the repeated title line is not text
    assert src["info"]["dropped"]["wikipedia"] == {"too_short": 1}


def test_layout_and_build_json(src):
    data = src["out"] / gc.DATA
    assert sorted(p.name for p in data.iterdir()) == ["BUILD.json", "gutenberg-00000.jsonl.gz", "wikipedia-00000.jsonl.gz"]
    build = json.loads((data / "BUILD.json").read_text())
    assert build["sources"]["gutenberg"]["commit"] == src["commits"]["gutenberg"]
    assert build["builder_version"] == gc.BUILDER_VERSION
    for shard in build["shards"]:
        raw = (data / shard["file"]).read_bytes()
        assert shard["sha256"] == hashlib.sha256(raw).hexdigest()
        assert shard["content_sha256"] == hashlib.sha256(gzip.decompress(raw)).hexdigest()
        assert raw[4:8] == b"\0\0\0\0"  # gzip mtime 0
    assert not list(src["out"].glob(".build-*"))  # the staging folder is gone


def test_deterministic_across_builds_and_source_kinds(src, tmp_path):
    root = src["root"]
    bare = tmp_path / "gutenberg.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(root / "gutenberg"), str(bare)], check=True, capture_output=True)
    plain = tmp_path / "wikipedia-download"
    shutil.copytree(root / "wikipedia", plain, ignore=shutil.ignore_patterns(".git"))
    gc.build(bare, plain, tmp_path / "again", manifest=src["manifest"])
    assert shard_hashes(tmp_path / "again") == shard_hashes(src["out"])  # BUILD.json included


def test_make_manifest_pins_the_selection(src, tmp_path):
    manifest = tmp_path / "SOURCES.json"
    made = gc.make_manifest(src["root"] / "gutenberg", src["root"] / "wikipedia", manifest,
                            gutenberg_commit=src["commits"]["gutenberg"], **TARGETS)
    kept = {r["id"] for r in rows(src["out"]) if r["source"] == "gutenberg"}
    assert set(made["gutenberg"]["files"]) == kept
    assert made["gutenberg"]["files"] == {p: gc.blob_id(GUTENBERG_FILES[p]) for p in kept}
    assert set(made["wikipedia"]["files"]) == {"data/AA/wiki_00", "data/AA/wiki_01"}
    assert made["wikipedia"]["commit"] == src["commits"]["wikipedia"]
    info = gc.build(src["root"] / "gutenberg", src["root"] / "wikipedia", tmp_path / "out", manifest=manifest)
    gc.record_shards(manifest, info)
    assert {p.name: p.read_bytes() for p in (tmp_path / "out" / gc.DATA).glob("*.gz")} == \
        {p.name: p.read_bytes() for p in (src["out"] / gc.DATA).glob("*.gz")}
    again = gc.build(src["root"] / "gutenberg", src["root"] / "wikipedia", tmp_path / "out", manifest=manifest)
    assert again["checked_against_manifest"] is True


def test_loads_as_corpus_general(src, tmp_path, monkeypatch):
    import datasets

    corpora = tmp_path / "corpora"
    shutil.copytree(src["out"], corpora / "general")
    (corpora / "general" / "SOURCES.json").write_text(src["manifest"].read_text())
    monkeypatch.setattr(sources, "CORPORA_DIR", corpora)
    docs = sources.load_documents(sources.DomainConfig(name="general", source="corpus:general"), tmp_path / "cache")
    assert len(docs) == 7
    assert docs[0]["text"] == rows(src["out"])[0]["text"]
    assert sources.shipped_corpora() == []  # built here, not shipped: the tokenizer is not trained on it
    shard = corpora / "general" / gc.DATA / "wikipedia-00000.jsonl.gz"
    ds = datasets.load_dataset("json", data_files=str(shard), split="train", cache_dir=str(tmp_path / "hf"))
    assert ds["title"] == ["Anarchism & Order", "Albedo"]


def test_corpus_not_built_says_how(tmp_path, monkeypatch):
    corpora = tmp_path / "corpora"
    (corpora / "general").mkdir(parents=True)
    (corpora / "general" / "SOURCES.json").write_text(json.dumps({"build_command": gc.BUILD_COMMAND}))
    monkeypatch.setattr(sources, "CORPORA_DIR", corpora)
    with pytest.raises(StreamDataError) as err:
        sources.resolve_files(sources.DomainConfig(name="general", source="corpus:general"))
    assert str(err.value) == ("domain 'general': corpus 'general' is not built: run "
                              "`clp data build-general --gutenberg DIR --wikipedia DIR`")


def test_the_shipped_manifest_is_small_and_consistent():
    data = gc.read_manifest(gc.MANIFEST)
    assert gc.MANIFEST.stat().st_size < 1_000_000
    assert data["gutenberg"]["commit"] == gc.GUTENBERG_COMMIT and data["builder_version"] == gc.BUILDER_VERSION
    assert data["targets"] == {"gutenberg_chars": gc.GUTENBERG_CHARS, "wikipedia_chars": gc.WIKIPEDIA_CHARS}
    assert all(gc.is_book_path(p) for p in data["gutenberg"]["files"]) and all(gc.is_wiki_path(p) for p in data["wikipedia"]["files"])
    assert data["shards"]  # a rebuild is checked bit for bit
    readme = (gc.GENERAL_DIR / "README.md").read_text()
    assert gc.BUILD_COMMAND.split(" DIR")[0] in readme and "CC BY-SA 3.0" in readme


def _fails(src, tmp_path, match: str, *, gutenberg=None, wikipedia=None, manifest=None, out=None) -> BaseException:
    out = out if out is not None else tmp_path / "never"
    before = shard_hashes(out) if (out / gc.DATA).is_dir() else None
    with pytest.raises(StreamDataError, match=match) as err:
        gc.build(gutenberg or src["root"] / "gutenberg", wikipedia or src["root"] / "wikipedia", out,
                 manifest=manifest or src["manifest"])
    if before is None:
        assert not out.exists()  # nothing written
    else:
        assert shard_hashes(out) == before and not list(out.glob(".build-*"))  # the previous build intact
    assert "\n" not in str(err.value)
    return err.value


def test_missing_source_folder(src, tmp_path):
    _fails(src, tmp_path, r"gutenberg source folder .*nowhere does not exist \(clone https://github.com/rcdm-uga/Gutenberg_Text",
           gutenberg=tmp_path / "nowhere")


def test_pinned_commit_absent(src, tmp_path):
    manifest = write_manifest(tmp_path / "m.json", {**src["commits"], "wikipedia": "0" * 40})
    _fails(src, tmp_path, "wikipedia repository .* lacks the pinned commit 0000000000", manifest=manifest)


def test_missing_file(src, tmp_path):
    plain = tmp_path / "gutenberg-download"
    shutil.copytree(src["root"] / "gutenberg", plain, ignore=shutil.ignore_patterns(".git"))
    (plain / "Austen, Jane/Emma.txt").unlink()
    err = _fails(src, tmp_path, "pinned gutenberg source file is missing", gutenberg=plain)
    assert err.file == "Austen, Jane/Emma.txt"
    data = json.loads(src["manifest"].read_text())  # in a git repository: a path the commit lacks
    data["wikipedia"]["files"]["data/AB/wiki_07"] = "1" * 40
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps(data))
    assert _fails(src, tmp_path, "missing", manifest=manifest).file == "data/AB/wiki_07"


def test_changed_file_keeps_the_previous_build(src, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(src["out"], out)
    plain = tmp_path / "gutenberg-download"
    shutil.copytree(src["root"] / "gutenberg", plain, ignore=shutil.ignore_patterns(".git"))
    (plain / "Old, Etext/Old Book.txt").write_bytes(GUTENBERG_FILES["Old, Etext/Old Book.txt"] + b"x")
    err = _fails(src, tmp_path, "differs from the pinned version", gutenberg=plain, out=out)
    assert err.file == "Old, Etext/Old Book.txt"
    data = json.loads(src["manifest"].read_text())  # in a git repository: another blob at the commit
    data["gutenberg"]["files"]["Austen, Jane/Emma.txt"] = "2" * 40
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps(data))
    assert _fails(src, tmp_path, "differs from the pinned version", manifest=manifest, out=out).file == "Austen, Jane/Emma.txt"


def test_shard_mismatch_names_the_shard(src, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(src["out"], out)
    shards = {s["file"]: {"sha256": s["sha256"], "content_sha256": s["content_sha256"]} for s in src["info"]["shards"]}
    shards["wikipedia-00000.jsonl.gz"] = {"sha256": "3" * 64, "content_sha256": "4" * 64}
    manifest = write_manifest(tmp_path / "m.json", src["commits"], shards=shards)
    _fails(src, tmp_path, "shard wikipedia-00000.jsonl.gz differs from the pinned build", manifest=manifest, out=out)


def test_cli_reports_one_line(tmp_path, capsys):
    from experiments.cli import main

    code = main(["data", "build-general", "--gutenberg", str(tmp_path / "g"), "--wikipedia", str(tmp_path / "w"),
                 "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("clp data build-general: error: corpus 'general': gutenberg source folder")
    assert not (tmp_path / "out").exists()
