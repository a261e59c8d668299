"""Checkpoint files: written atomically, read back with checks that name what is wrong.

A checkpoint is a `torch.save`d dict with a `format` tag, a `kind` ("base" model, "pretrain" or
"run" progress) and the `model_config` it was saved for, so that loading a file into the wrong
model, or a file that is not ours, fails with a message instead of a shape error deep in torch.

Writes go to a temporary file in the same folder, are fsync'ed and renamed over the target:
a process killed during a save (SIGKILL included) leaves the previous checkpoint intact. A
resumable checkpoint also keeps the one before it (`last.ckpt` + `prev.ckpt`): once the new file
is complete on disk, the old `last.ckpt` is renamed to `prev.ckpt` and the new one to `last.ckpt`,
so at every moment at least one complete checkpoint is on disk (a kill between the two renames
leaves only `prev.ckpt`), and a newest file that was damaged after it was written (a full disk
elsewhere, a bad copy, a truncated transfer) falls back to the previous one (`load_latest`), which
moves the damaged file aside (`last.ckpt.unreadable`) so that the next rotation keeps the good
`prev.ckpt` instead of it. Once a run has finished it needs neither for resuming: it keeps what
`cl.keep_checkpoints` says (`keep_after_run`; by default `last.ckpt` alone).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable

import torch

from cl_platform.atomic import atomic_write

FORMAT = "cl-platform-checkpoint/1"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used: unreadable, of another kind, or for another model."""


class CheckpointUnreadable(CheckpointError):
    """The file cannot be deserialised at all (corrupted, truncated, not a torch file)."""


PREVIOUS = "prev.ckpt"


def previous_path(path: str | os.PathLike[str]) -> Path:
    """Where the checkpoint written before `path` is kept: `prev.ckpt` beside it."""
    return Path(path).with_name(PREVIOUS)


def latest_checkpoint(path: str | os.PathLike[str]) -> Path | None:
    """`path` if it is there, else the previous checkpoint if that is (a kill between the two
    renames of a rotation), else None."""
    path = Path(path)
    for candidate in (path, previous_path(path)):
        if candidate.is_file():
            return candidate
    return None


def model_config_dict(config: Any) -> dict[str, Any]:
    """The architecture a checkpoint is for: the model config without `preset`, which only names
    where its defaults came from (a base built from equal fields fits whatever the preset name).
    Fields added after bases were made leave out their off value (OFF_FIELDS): at that value they
    name the architecture the bases have, so a base's key (`experiments.setup.base_key` hashes
    this) and its checkpoint comparison stay what they were, and the shipped bases are found."""
    data = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    data.pop("preset", None)
    for name, off in OFF_FIELDS.items():
        if name in data and data[name] == off:
            del data[name]
    return data


# ModelConfig fields added after the shipped bases, with the value that is the architecture before them.
OFF_FIELDS = {"conv_kernel": 0}


def save_checkpoint(path: str | os.PathLike[str], kind: str, model_config: Any, payload: dict[str, Any],
                    keep_previous: bool = False) -> None:
    """Write `path` atomically; `keep_previous`: the file it replaces becomes `prev.ckpt` (a
    failed write — a full disk — changes neither). Raises `cl_platform.atomic.WriteError`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": FORMAT, "kind": kind, "model_config": model_config_dict(model_config), **payload}
    atomic_write(path, lambda f: torch.save(data, f), binary=True,
                 keep_previous=previous_path(path) if keep_previous else None)


def keep_after_run(path: str | os.PathLike[str], keep: str) -> None:
    """A finished run's checkpoints, as `cl.keep_checkpoints` says: "final" keeps `path` (the
    checkpoint of the end), "all" also the one before it, "none" neither (and the emptied folder).
    Call only once the results are final: until then a run needs both (resume, fallback)."""
    path = Path(path)
    if keep == "all":
        return
    previous_path(path).unlink(missing_ok=True)
    if keep == "none":
        path.unlink(missing_ok=True)
        if path.parent.is_dir() and not any(path.parent.iterdir()):
            path.parent.rmdir()


def load_latest(path: str | os.PathLike[str], kind: str, model_config: Any | None = None,
                say: Callable[[str], None] = print) -> tuple[dict[str, Any], Path]:
    """Load `path`, or the checkpoint before it when `path` is missing or unreadable (saying so):
    (data, the file loaded). Any other problem (another kind, another model) is not a reason to
    fall back: it is raised, as is an unreadable file with no previous one."""
    path = Path(path)
    previous = previous_path(path)
    if previous == path:  # asked for the previous checkpoint itself: nothing older to fall back to
        return load_checkpoint(path, kind, model_config), path
    if not path.is_file() and previous.is_file():
        say(f"checkpoint {path} is missing (the process was stopped while rotating checkpoints); "
            f"continuing from {previous}")
        return load_checkpoint(previous, kind, model_config), previous
    try:
        return load_checkpoint(path, kind, model_config), path
    except CheckpointUnreadable as err:
        if not previous.is_file():
            raise
        try:
            data = load_checkpoint(previous, kind, model_config)
        except CheckpointUnreadable as err2:
            raise CheckpointError(f"{err}; and the previous one: {err2}") from None
        aside = path.with_name(path.name + ".unreadable")
        os.replace(path, aside)
        say(f"{err}; continuing from the previous checkpoint {previous} (the unreadable file is kept as {aside.name})")
        return data, previous


def load_checkpoint(path: str | os.PathLike[str], kind: str, model_config: Any | None = None) -> dict[str, Any]:
    """Read and check a checkpoint; `model_config` (if given) must equal the one it was saved for."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} {'is a folder, not a file' if path.is_dir() else 'does not exist'}")
    try:
        # weights_only: a checkpoint may come from elsewhere, and ours hold only tensors, numbers,
        # strings and containers (strategy states included: see cl_platform.strategy).
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for truncated / foreign files
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        raise CheckpointUnreadable(
            f"checkpoint {path} cannot be read: corrupted, truncated, or holding objects other than "
            f"tensors, numbers, strings and containers ({type(err).__name__}: {first})"
        ) from None
    found = data.get("format") if isinstance(data, dict) else None
    if isinstance(found, str) and found.startswith(FORMAT.split("/")[0] + "/") and found != FORMAT:
        raise CheckpointError(f"checkpoint {path} was saved by an incompatible version of cl-platform "
                              f"(format {found!r}; this version reads {FORMAT!r})")
    if found != FORMAT:
        raise CheckpointError(f"checkpoint {path} is not a cl-platform checkpoint (format {found!r}, expected {FORMAT!r})")
    if data.get("kind") != kind:
        raise CheckpointError(f"checkpoint {path} holds a {data.get('kind')!r} checkpoint, expected {kind!r}")
    if model_config is not None:
        expected = model_config_dict(model_config)
        saved = model_config_dict(data.get("model_config") or {})
        if saved != expected:
            diffs = _diff(saved or {}, expected)
            raise CheckpointError(
                f"checkpoint {path} was saved for a different model config: " + "; ".join(diffs[:8])
                + (f"; ... ({len(diffs)} differences)" if len(diffs) > 8 else "")
            )
    return data


def _diff(saved: dict, expected: dict, where: str = "") -> list[str]:
    out = []
    for key in sorted(set(saved) | set(expected)):
        a, b = saved.get(key, "<absent>"), expected.get(key, "<absent>")
        name = f"{where}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            out += _diff(a, b, name + ".")
        elif a != b:
            out.append(f"{name} is {a!r} in the checkpoint, {b!r} in this run")
    return out
