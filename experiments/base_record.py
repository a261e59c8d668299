"""What a named base brings to a run: where it is, the settings it was pretrained with, and the
tokenizer and segment length every stream read with it must use.

    base = read_base("/abs/path/reference-s0")        # a shipped name, a base folder or a base.ckpt
                                                      # (CheckpointError naming the file if none)
    base.path, base.settings                          # the checkpoint; its `pretrain:` settings
    stream = fit_stream(stream, base, "streams/x.yaml")   # the base's tokenizer / seq_len, or refused

A run config names its base with `base_checkpoint` (experiments/setup.py reads it here before the
config's `pretrain:` section is resolved, so that section comes from the base and is not copied
by hand). The record is the base's `pretrain.json`, written beside every base; a checkpoint
without one beside it (moved alone) is read for the record it holds.

The tokenizer and `seq_len` are in the record's `stream` entry (bases pretrained before it existed
have none: their streams are not checked, as before). A stream silently read with another
tokenizer than its base's gives plausible-looking nonsense (every token id means another string),
so a stream that names a different one is refused, and one that names none takes the base's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cl_platform.check import ConfigError

SHIPPED_BASES = Path(__file__).resolve().parent / "bases"  # experiments/bases/<name>/base.ckpt
BASE_FILE = "base.ckpt"
RECORD_FILE = "pretrain.json"
TOKENIZER_FILE = "tokenizer.json"  # a copy of the base's tokenizer, written beside the bases this code pretrains


@dataclass(frozen=True)
class BaseRecord:
    path: Path  # the base.ckpt
    key: str | None  # its pretraining key (None: not recorded)
    settings: dict[str, Any]  # its PretrainConfig fields, but where it ran
    tokenizer: dict[str, Any] | None  # {"fingerprint", "vocab_size", "file"}; None: not recorded
    seq_len: int | None  # None: not recorded


def shipped_names() -> list[str]:
    return sorted(p.parent.name for p in SHIPPED_BASES.glob(f"*/{BASE_FILE}"))


def resolve_base_path(value: str | Path) -> Path:
    """`base_checkpoint`'s file: the path itself, the base.ckpt inside a base folder, or a shipped
    base named by its folder name (`reference-s0`). A path that is none of these is refused,
    naming the shipped bases."""
    from cl_platform.checkpoint import CheckpointError

    path = Path(value)
    if path.is_dir() and (path / BASE_FILE).is_file():
        return path / BASE_FILE
    if path.exists():
        return path
    if (SHIPPED_BASES / path.name / BASE_FILE).is_file():
        return SHIPPED_BASES / path.name / BASE_FILE
    raise CheckpointError(f"checkpoint {path} does not exist, and {path.name!r} is not a shipped base "
                          f"({', '.join(shipped_names())})")


def read_base(value: str | Path) -> BaseRecord:
    """The base named by `value` (see resolve_base_path) and what its record says."""
    from cl_platform.checkpoint import load_checkpoint

    path = resolve_base_path(value)
    beside = path.parent / RECORD_FILE
    if beside.is_file():
        try:
            record = json.loads(beside.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ConfigError(f"base record {beside} cannot be read: {err}", field="base_checkpoint") from None
    else:  # a checkpoint that cannot be read is refused here, naming the file and why
        record = load_checkpoint(path, "base").get("record")
    record = record if isinstance(record, dict) else {}
    stream = record.get("stream") if isinstance(record.get("stream"), dict) else {}
    return BaseRecord(path=path, key=record.get("key"), settings=pretrain_settings(record.get("config")),
                      tokenizer=stream.get("tokenizer"), seq_len=stream.get("seq_len"))


def pretrain_settings(config: Any) -> dict[str, Any]:
    """The fields of a recorded pretrain config, but where it ran (the run's own machine decides)
    and fields this version does not have."""
    from cl_platform.config import PretrainConfig
    from cl_platform.memory.fwpkm import WriteRule

    if not isinstance(config, dict):
        return {}
    skip = set(PretrainConfig.PLACEMENT)
    known = {f.name for f in dataclasses.fields(PretrainConfig)} - skip
    settings = {k: v for k, v in config.items() if k in known}
    if isinstance(settings.get("fwpkm"), dict):
        rule = {f.name for f in dataclasses.fields(WriteRule)}
        settings["fwpkm"] = {k: v for k, v in settings["fwpkm"].items() if k in rule}
    return settings


def stream_entry(tokenizer: Any, seq_len: int) -> dict[str, Any]:
    """The record's `stream` entry for a base pretrained with `tokenizer` on `seq_len` segments."""
    return {"tokenizer": {"fingerprint": tokenizer.fingerprint, "vocab_size": tokenizer.vocab_size,
                          "file": Path(tokenizer.path).name if tokenizer.path is not None else None},
            "seq_len": seq_len}


def tokenizer_path(base: BaseRecord) -> Path:
    """The file of the base's tokenizer: its copy beside the base, or the shipped tokenizer of the
    same fingerprint."""
    from streams.tokenizer import SHIPPED_PATH

    fingerprint = base.tokenizer["fingerprint"]
    for candidate in [base.path.parent / TOKENIZER_FILE, *sorted(SHIPPED_PATH.parent.glob("*.json"))]:
        if candidate.is_file() and file_fingerprint(candidate) == fingerprint:
            return candidate
    raise ConfigError(f"base {base.path} was trained with tokenizer {base.tokenizer.get('file')} (sha256 "
                      f"{fingerprint[:12]}), which is neither beside it ({TOKENIZER_FILE}) nor shipped; name its "
                      f"file in the stream's 'tokenizer:' field", field="base_checkpoint")


def file_fingerprint(path: Path) -> str:
    # The same digest as streams.tokenizer.Tokenizer.fingerprint, without parsing the file.
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fit_stream(stream: Any, base: BaseRecord | None, where: str) -> Any:
    """`stream` (a StreamConfig) with the base's tokenizer and seq_len where it names none; a
    stream that names others than the base's is refused, naming both (`where`: the stream file)."""
    if base is None:
        return stream
    changes: dict[str, Any] = {}
    if base.tokenizer is not None:
        if stream.tokenizer is None:
            changes["tokenizer"] = str(tokenizer_path(base))
        else:
            own = Path(stream.tokenizer)
            if own.is_file() and file_fingerprint(own) != base.tokenizer["fingerprint"]:
                raise ConfigError(
                    f"{where}: stream field 'tokenizer' is {own.name} (sha256 {file_fingerprint(own)[:12]}), but the "
                    f"base {base.path} was trained with {base.tokenizer.get('file')} (sha256 "
                    f"{base.tokenizer['fingerprint'][:12]}); remove 'tokenizer:' to use the base's", field="tokenizer")
    if base.seq_len is not None:
        if stream.seq_len is None:
            changes["seq_len"] = base.seq_len
        elif stream.seq_len != base.seq_len:
            raise ConfigError(f"{where}: stream field 'seq_len' is {stream.seq_len}, but the base {base.path} was "
                              f"trained on {base.seq_len}-token segments; remove 'seq_len:' to use the base's",
                              field="seq_len")
    return dataclasses.replace(stream, **changes) if changes else stream
