"""The platform's tokenizer: a byte-level BPE (Hugging Face `tokenizers`) shipped as one JSON file.

Every model, stream cache and result is tied to one tokenizer through `Tokenizer.fingerprint`
(sha256 of the tokenizer.json bytes): caches keyed on it are invalidated when the file changes.

    tok = load_tokenizer()                 # the shipped streams/assets/tokenizer.json
    ids = tok.encode("def f(x): ...")      # list[int]; no special tokens added
    tok.vocab_size, tok.eot_id, tok.pad_id  # 4096, 0, 1

Special tokens: `<|endoftext|>` (id 0) separates documents in packed streams; `<|pad|>` (id 1)
fills the tail of a last, partial segment. Document text is never mapped to them: a document that
literally contains "<|endoftext|>" is encoded as ordinary bytes, so data cannot forge boundaries.

The shipped file is rebuilt with `clp tokenizer build` (streams/tokenizer_build.py chooses the
training sample; this module only knows how to train on the texts it is given).
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

EOT = "<|endoftext|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = (EOT, PAD)  # order fixes the ids: EOT = 0, PAD = 1
SHIPPED_PATH = Path(__file__).resolve().parent / "assets" / "tokenizer.json"


class Tokenizer:
    """Thin wrapper over `tokenizers.Tokenizer` with the platform's conventions fixed."""

    def __init__(self, raw_json: bytes, path: Path | None = None):
        self.path = path
        self.raw_json = raw_json  # the file's bytes: what the fingerprint is of, and what gets written
        self.fingerprint = hashlib.sha256(raw_json).hexdigest()
        self._tok = tokenizers.Tokenizer.from_str(raw_json.decode("utf-8"))
        self._tok.encode_special_tokens = True  # see module docstring: text never becomes EOT/PAD
        self.eot_id = self._tok.token_to_id(EOT)
        self.pad_id = self._tok.token_to_id(PAD)
        if self.eot_id is None or self.pad_id is None:
            raise ValueError(f"tokenizer {path or '<bytes>'} lacks the special tokens {SPECIAL_TOKENS}")
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # The Rust side parallelises over the batch (TOKENIZERS_PARALLELISM governs it).
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        # Specials are kept so a decoded packed segment still shows its document boundaries.
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def token(self, token_id: int) -> str | None:
        """The vocabulary entry of an id (byte-level form, e.g. 'Ġthe')."""
        return self._tok.id_to_token(token_id)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, fingerprint={self.fingerprint[:12]}, path={self.path})"


def load_tokenizer(path: str | Path | None = None) -> Tokenizer:
    """Load a tokenizer.json; the shipped one when `path` is None."""
    p = Path(path) if path is not None else SHIPPED_PATH
    if not p.is_file():
        if p == SHIPPED_PATH:  # the shipped default itself is gone: it is rebuilt from the shipped corpora
            raise FileNotFoundError(f"tokenizer file {p} does not exist (rebuild it with `clp tokenizer build`)")
        # A path the user named: rebuilding the default tokenizer would give a different one.
        shipped = ", ".join(str(f) for f in sorted(SHIPPED_PATH.parent.glob("*.json")))
        raise FileNotFoundError(f"tokenizer file {p} does not exist; the shipped tokenizers are {shipped}")
    return Tokenizer(p.read_bytes(), path=p)


def train_tokenizer(
    files_or_texts: Iterable[str] | Sequence[Path],
    vocab_size: int = 4096,
    out_path: str | Path | None = None,
) -> Tokenizer:
    """Train a byte-level BPE and optionally write it to `out_path`.

    `files_or_texts` is either a sequence of `pathlib.Path` (plain-text files, read by `tokenizers`)
    or an iterable of document strings. Training is deterministic: the same input in the same order
    gives byte-identical JSON (tokenizers breaks ties between equally frequent pairs by token id).
    `vocab_size` counts the 256 byte symbols and the two special tokens.
    """
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size={vocab_size} must be at least {256 + len(SPECIAL_TOKENS)} (bytes + specials)")
    tok = tokenizers.Tokenizer(models.BPE())  # no unknown token: every byte has a symbol
    # GPT-2 style: no prefix space, so decode(encode(text)) == text exactly.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, seen or not
        show_progress=False,
    )
    items = list(files_or_texts) if not isinstance(files_or_texts, (str, bytes)) else [files_or_texts]
    if items and all(isinstance(x, Path) for x in items):
        tok.train([str(x) for x in items], trainer)
    elif any(isinstance(x, Path) for x in items):
        raise TypeError("train_tokenizer: pass either only Path objects (files) or only strings (texts)")
    else:
        tok.train_from_iterator(items, trainer, length=len(items))
    raw = tok.to_str(pretty=True).encode("utf-8")
    if out_path is not None:
        out = Path(out_path)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_bytes(raw)
        tmp.replace(out)  # readers never see a half-written tokenizer
        return Tokenizer(raw, path=out)
    return Tokenizer(raw)
