"""Where a domain's documents come from, and loading them through Hugging Face `datasets`.

A domain's `source` is one of:
- `corpus:<name>`   a corpus shipped in `streams/corpora/<name>/` (math, law, code, web), or one
  built there from pinned sources (`general`: `clp data build-general`, streams/general_corpus.py);
- `hub:<dataset id>` a Hugging Face Hub dataset (`hub_subset`, `hub_split` choose the part);
  needs the network or a copy in the local `datasets` cache;
- a local file, a glob (`data/*.jsonl.gz`, `**` allowed) or a list of them; the format comes from
  the extension (`.jsonl`, `.json`, `.ndjson` [+ `.gz`] -> json, `.parquet` -> parquet,
  `.txt`, `.md` [+ `.gz`] -> text, one document per file) unless `format` says otherwise.
  Relative paths are relative to the YAML file that names them (`load_stream_config`).

Files are always read by `datasets.load_dataset("json" | "parquet" | "text", ...)`. When that
fails, or when its result has a bad text column, the file is re-read line by line only to say
*where* the problem is (`_diagnose`), so every error names the domain, the file and the line.
"""
from __future__ import annotations

import glob
import gzip
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from cl_platform.check import check_keys, from_mapping
from streams.errors import StreamDataError
from streams.splits import TokenBudget

CORPORA_DIR = Path(__file__).resolve().parent / "corpora"
Format = Literal["auto", "json", "parquet", "text"]
_FORMATS = ("auto", "json", "parquet", "text")
_EXTENSIONS = {".jsonl": "json", ".json": "json", ".ndjson": "json", ".parquet": "parquet", ".txt": "text", ".md": "text"}
_TRUE = {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True)
class FilterConfig:
    """Optional document filters, applied before splitting (so they change which documents exist)."""

    min_chars: int = 0
    max_chars: int | None = None
    where: dict[str, list] = field(default_factory=dict)  # keep rows whose field value is in the list
    max_documents: int | None = None  # then keep only the first N documents (source order): quick runs, tests

    def __post_init__(self):
        if isinstance(self.min_chars, bool) or not isinstance(self.min_chars, int) or self.min_chars < 0:
            raise ValueError(f"filters.min_chars must be a non-negative int, got {self.min_chars!r}")
        if self.max_chars is not None and (not isinstance(self.max_chars, int) or self.max_chars < self.min_chars):
            raise ValueError(f"filters.max_chars must be an int >= min_chars, got {self.max_chars!r}")
        if not isinstance(self.where, dict) or not all(isinstance(v, list) and v for v in self.where.values()):
            raise ValueError(f"filters.where must map field names to non-empty lists of values, got {self.where!r}")
        if self.max_documents is not None and (
            isinstance(self.max_documents, bool) or not isinstance(self.max_documents, int) or self.max_documents < 1
        ):
            raise ValueError(f"filters.max_documents must be a positive int, got {self.max_documents!r}")

    @property
    def active(self) -> bool:
        """Whether a row-wise filter applies (max_documents is a cut, not a row filter)."""
        return self.min_chars > 0 or self.max_chars is not None or bool(self.where)


@dataclass(frozen=True)
class DomainConfig:
    """One domain of a stream: where its text is, which field holds it, filters and token budget."""

    name: str
    source: str | list[str]
    text_field: str = "text"
    format: Format = "auto"  # local files only; Hub datasets bring their own
    hub_subset: str | None = None  # the Hub dataset's configuration name, if it has several
    hub_split: str = "train"
    filters: FilterConfig = field(default_factory=FilterConfig)
    token_budget: TokenBudget | None = None  # None: the stream's default budget

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or any(c in self.name for c in "/\\ #"):
            raise ValueError(f"domain name must be a non-empty string without '/', '\\', ' ' or '#', got {self.name!r}")
        sources = [self.source] if isinstance(self.source, str) else self.source
        if not isinstance(sources, list) or not sources or not all(isinstance(s, str) and s for s in sources):
            raise ValueError(f"domain '{self.name}': source must be a non-empty string or list of strings")
        remote = [s for s in sources if s.startswith(("hub:", "corpus:"))]
        if remote and len(sources) > 1:
            raise ValueError(f"domain '{self.name}': source {remote[0]!r} cannot be combined with other sources")
        if remote and not remote[0].split(":", 1)[1]:
            raise ValueError(f"domain '{self.name}': source {remote[0]!r} needs a name after the colon")
        if not isinstance(self.text_field, str) or not self.text_field:
            raise ValueError(f"domain '{self.name}': text_field must be a non-empty string")
        if self.format not in _FORMATS:
            raise ValueError(f"domain '{self.name}': format must be one of {_FORMATS}, got {self.format!r}")
        if not isinstance(self.filters, FilterConfig):
            raise ValueError(f"domain '{self.name}': filters must be a FilterConfig")
        if self.token_budget is not None and not isinstance(self.token_budget, TokenBudget):
            raise ValueError(f"domain '{self.name}': token_budget must be a TokenBudget or None")

    @property
    def sources(self) -> list[str]:
        return [self.source] if isinstance(self.source, str) else list(self.source)

    @property
    def kind(self) -> Literal["corpus", "hub", "files"]:
        first = self.sources[0]
        return "corpus" if first.startswith("corpus:") else "hub" if first.startswith("hub:") else "files"

    @classmethod
    def from_dict(cls, data: dict, where: str = "domain", base_dir: Path | None = None) -> "DomainConfig":
        check_keys(cls, data, where)
        data = dict(data)
        if "name" not in data or "source" not in data:
            raise ValueError(f"{where}: 'name' and 'source' are required")
        where = f"domain '{data['name']}'"
        try:
            if isinstance(data.get("filters"), dict):
                data["filters"] = from_mapping(FilterConfig, data["filters"], "filters")
            if isinstance(data.get("token_budget"), dict):
                data["token_budget"] = from_mapping(TokenBudget, data["token_budget"], "token_budget")
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if base_dir is not None:
            data["source"] = _rebase(data["source"], base_dir)
        return cls(**data)


def _rebase(source: Any, base_dir: Path) -> Any:
    def one(s: Any) -> Any:
        if not isinstance(s, str) or s.startswith(("hub:", "corpus:")) or os.path.isabs(os.path.expanduser(s)):
            return s
        return str(base_dir / s)

    return [one(s) for s in source] if isinstance(source, list) else one(source)


BUILT_MANIFEST = "SOURCES.json"  # marks a corpus built locally from pinned sources (streams/general_corpus.py)


def shipped_corpora() -> list[str]:
    """Corpora whose data ship with the package; a locally built one (`general`) is not among them."""
    return sorted(
        p.name for p in CORPORA_DIR.iterdir()
        if p.is_dir() and not (p / BUILT_MANIFEST).is_file() and any(p.glob("*/*.jsonl.gz"))
    )


def corpus_files(name: str) -> list[Path]:
    """The files of a shipped (or locally built) corpus, in the sorted order that defines its document order."""
    folder = CORPORA_DIR / name
    files = sorted(folder.glob("*/*.jsonl.gz"))
    if not files and (folder / BUILT_MANIFEST).is_file():
        try:
            command = json.loads((folder / BUILT_MANIFEST).read_text(encoding="utf-8"))["build_command"]
        except (OSError, ValueError, KeyError, TypeError):
            command = f"see {folder / 'README.md'}"
        raise FileNotFoundError(f"corpus '{name}' is not built: run `{command}`")
    if not files:
        raise FileNotFoundError(f"no shipped corpus '{name}'; shipped: {shipped_corpora()}")
    return files


def resolve_files(domain: DomainConfig) -> list[Path]:
    """Local files of a domain, checked to exist and be non-empty."""
    if domain.kind == "corpus":
        name = domain.sources[0].removeprefix("corpus:")
        try:
            return corpus_files(name)
        except FileNotFoundError as e:
            raise StreamDataError(domain.name, str(e)) from None
    files: list[Path] = []
    for pattern in domain.sources:
        expanded = os.path.expanduser(pattern)
        if glob.has_magic(expanded):
            matches = sorted(Path(p) for p in glob.glob(expanded, recursive=True) if os.path.isfile(p))
            if not matches:
                raise StreamDataError(domain.name, f"glob {pattern!r} matches no file")
            files.extend(matches)
        elif not os.path.isfile(expanded):
            raise StreamDataError(domain.name, "file does not exist", file=pattern)
        else:
            files.append(Path(expanded))
    for f in files:
        if _is_empty(f, domain.name):
            raise StreamDataError(domain.name, "file is empty", file=str(f))
    return files


def _is_empty(path: Path, domain: str) -> bool:
    if path.stat().st_size == 0:
        return True
    if path.suffix == ".gz":
        try:
            with gzip.open(path, "rb") as f:
                return f.read(1) == b""
        except (OSError, EOFError) as e:
            raise StreamDataError(domain, f"not a readable gzip file ({e})", file=str(path)) from None
    return False


def file_format(domain: DomainConfig, files: list[Path]) -> Literal["json", "parquet", "text"]:
    if domain.format != "auto":
        return domain.format  # type: ignore[return-value]
    found = set()
    for f in files:
        suffixes = [s for s in f.suffixes if s != ".gz"]
        fmt = _EXTENSIONS.get(suffixes[-1] if suffixes else "")
        if fmt is None:
            raise StreamDataError(
                domain.name, f"cannot tell the format from the extension; set format to one of {_FORMATS[1:]}", file=str(f)
            )
        found.add(fmt)
    if len(found) > 1:
        raise StreamDataError(domain.name, f"files of several formats {sorted(found)}; use one format per domain")
    return found.pop()


def hub_offline() -> bool:
    """Offline as the environment says *now* (datasets reads HF_HUB_OFFLINE only at import)."""
    import datasets

    env = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("HF_DATASETS_OFFLINE") or ""
    return bool(datasets.config.HF_HUB_OFFLINE) or env.upper() in _TRUE


def load_documents(domain: DomainConfig, cache_dir: Path):
    """The domain's documents as a `datasets.Dataset` with one string column `text`, filtered.

    JSON and parquet files are loaded one `load_dataset` call per file, so files of one domain
    may carry different extra fields (GSM8K and MATH do) and a failure is pinned to its file;
    text files (one document each) are loaded in one call. Raises `StreamDataError` for any bad
    input; nothing is written to the cache for a source that fails (`datasets` builds into a
    temporary directory and renames it only on success).
    """
    import datasets

    hf_cache = str(cache_dir / "datasets")
    if domain.kind == "hub":
        parts = [_checked_columns(domain, _load_hub(domain, hf_cache), [], "hub")]
    else:
        files = resolve_files(domain)
        fmt = file_format(domain, files)
        groups = [files] if fmt == "text" else [[f] for f in files]
        parts = [_checked_columns(domain, _load_files(domain, g, fmt, hf_cache), g, fmt) for g in groups]
    ds = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
    if domain.filters.active:
        ds = ds.filter(
            _keep_row,
            fn_kwargs={"filters": domain.filters},
            batched=True,
            new_fingerprint=_hash(ds._fingerprint, repr(domain.filters)),
            desc=f"filter {domain.name}",
        )
        ds = ds.select_columns(["text"])
    if domain.filters.max_documents is not None and len(ds) > domain.filters.max_documents:
        ds = ds.select(range(domain.filters.max_documents))
    if len(ds) == 0:
        what = "after filters" if domain.filters.active else "in its source"
        raise StreamDataError(domain.name, f"no documents {what}")
    return ds


def _load_files(domain: DomainConfig, files: list[Path], fmt: str, hf_cache: str):
    import datasets

    kwargs = {"sample_by": "document"} if fmt == "text" else {}
    try:
        return datasets.load_dataset(fmt, data_files=[str(f) for f in files], split="train", cache_dir=hf_cache, **kwargs)
    except Exception as e:  # datasets wraps parser errors in several types; the diagnosis is what matters
        _raise_diagnosed(domain, files, fmt, f"datasets could not read the file: {_root_cause(e)}", e)


def _checked_columns(domain: DomainConfig, ds, files: list[Path], fmt: str):
    """Validate the text column, keep it (as `text`) and the fields the filters need."""
    field_name = "text" if fmt == "text" else domain.text_field  # the text loader names its column "text"
    _check_text_column(domain, ds, field_name, files, fmt)
    where = [k for k in domain.filters.where if k != field_name]
    for k in where:
        if k not in ds.column_names:
            raise StreamDataError(
                domain.name,
                f"filters.where names field {k!r}, which the data lacks (has {ds.column_names})",
                file=str(files[0]) if len(files) == 1 else None,
            )
    ds = ds.select_columns([field_name, *where])
    return ds.rename_column(field_name, "text") if field_name != "text" else ds


def _keep_row(batch: dict, filters: FilterConfig) -> list[bool]:
    keep = []
    for i, text in enumerate(batch["text"]):
        ok = len(text) >= filters.min_chars and (filters.max_chars is None or len(text) <= filters.max_chars)
        keep.append(ok and all(batch[k][i] in allowed for k, allowed in filters.where.items()))
    return keep


def _hash(*parts: str) -> str:
    import hashlib

    return hashlib.sha256("\x00".join(parts).encode("utf-8")).hexdigest()[:16]


def _load_hub(domain: DomainConfig, hf_cache: str):
    import datasets

    repo = domain.sources[0].removeprefix("hub:")
    offline = hub_offline()
    try:
        # datasets fixed its offline flag at import; honour a later HF_HUB_OFFLINE=1 without touching the network.
        with _datasets_offline(offline):
            return datasets.load_dataset(repo, name=domain.hub_subset, split=domain.hub_split, cache_dir=hf_cache)
    except Exception as e:
        cause = _root_cause(e)
        if offline:
            msg = (
                f"Hub dataset {repo!r} is not in the local cache ({hf_cache}) and the Hub is offline "
                f"(HF_HUB_OFFLINE is set); download it once while online, or use a local file source"
            )
        elif isinstance(e, ConnectionError) or "connect" in cause.lower() or "resolve" in cause.lower():
            msg = (
                f"cannot reach the Hugging Face Hub for dataset {repo!r} (no network?) and it is not cached; "
                f"set HF_HUB_OFFLINE=1 to fail fast, or use a local file source ({cause})"
            )
        else:
            msg = f"cannot load Hub dataset {repo!r} (subset={domain.hub_subset!r}, split={domain.hub_split!r}): {cause}"
        raise StreamDataError(domain.name, msg) from e


class _datasets_offline:
    """Temporarily set datasets' import-time offline flag (restored on exit)."""

    def __init__(self, offline: bool):
        self.offline = offline

    def __enter__(self):
        import datasets

        self.before = datasets.config.HF_HUB_OFFLINE
        datasets.config.HF_HUB_OFFLINE = self.before or self.offline

    def __exit__(self, *exc):
        import datasets

        datasets.config.HF_HUB_OFFLINE = self.before
        return False


def _root_cause(e: BaseException) -> str:
    while e.__cause__ is not None or (e.__context__ is not None and not str(e)):
        e = e.__cause__ or e.__context__
    return f"{type(e).__name__}: {e}"


def _check_text_column(domain: DomainConfig, ds, field_name: str, files: list[Path], fmt: str) -> None:
    import pyarrow as pa

    if field_name not in ds.column_names:
        _raise_diagnosed(domain, files, fmt, f"no field {field_name!r} (fields: {ds.column_names})")
    col = ds.data.column(field_name)
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        _raise_diagnosed(domain, files, fmt, f"field {field_name!r} is not text (type {col.type})")
    if col.null_count:
        _raise_diagnosed(domain, files, fmt, f"field {field_name!r} is missing or null in {col.null_count} rows")
    try:
        col.validate(full=True)  # Arrow's JSON reader accepts invalid UTF-8; full validation catches it
    except pa.ArrowInvalid:
        _raise_diagnosed(domain, files, fmt, "text is not valid UTF-8")


def _raise_diagnosed(domain: DomainConfig, files: list[Path], fmt: str, fallback: str, cause: BaseException | None = None):
    for f in files:
        found = _diagnose(f, fmt, domain.text_field)
        if found is not None:
            line, message = found
            raise StreamDataError(domain.name, message, file=str(f), line=line) from cause
    where = files[0] if len(files) == 1 else None
    raise StreamDataError(domain.name, fallback, file=str(where) if where else None) from cause


def _diagnose(path: Path, fmt: str, text_field: str) -> tuple[int | None, str] | None:
    """First problem in one file as (line, message), or None. Runs only after a failure."""
    if fmt == "parquet":
        return _diagnose_parquet(path, text_field)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return lineno, f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
            if fmt == "text" or not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                return lineno, f"malformed JSON ({e.msg} at column {e.colno})"
            if not isinstance(row, dict):
                return lineno, f"expected a JSON object per line, got {type(row).__name__}"
            if text_field not in row or row[text_field] is None:
                return lineno, f"no field {text_field!r} (fields: {sorted(row)})"
            if not isinstance(row[text_field], str):
                return lineno, f"field {text_field!r} is {type(row[text_field]).__name__}, not a string"
    return None


def _diagnose_parquet(path: Path, text_field: str) -> tuple[int | None, str] | None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:
        return None, f"not a readable parquet file ({e})"
    if text_field not in table.column_names:
        return None, f"no column {text_field!r} (columns: {table.column_names})"
    col = table.column(text_field)
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        return None, f"column {text_field!r} is {col.type}, not a string"
    if col.null_count:
        first = col.to_pylist().index(None)
        return None, f"column {text_field!r} is null in row {first}"
    return None
