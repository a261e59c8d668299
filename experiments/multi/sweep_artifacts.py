"""A sweep's trial checkpoints in Optuna's artifact store (sweep field `artifacts`: a folder every
worker mounts), so that a trial retried by a worker on another machine — its own `runs_root`, no
copy of the dead worker's run folder — continues from the last checkpoint instead of from row 0.

    uploads = TrialCheckpoints(store, study, trial, folder)   # a RunCallback given to the trial's run
    restore(store, study, folder, say)                        # before the run: the newest checkpoint here

Every time the trial's run writes its resumable checkpoint (cl_platform.engine, `on_checkpoint`)
the run folder's `run.json`, `config.yaml` and `checkpoints/last.ckpt` are packed into one tar
file and uploaded (`optuna.artifacts.upload_artifact`, so the trial lists it in Optuna Dashboard).
A study user attribute per run folder, `checkpoint:<folder number>`, then points at it with its
run step and SHA-256; it is set only after the upload has finished, so a worker killed during an
upload leaves the pointer on the previous, complete artifact. The artifact before the newest is
kept too (`previous`), as the run folder keeps `prev.ckpt`: a newest artifact that reads back
damaged falls back to it. Older ones are removed.

Which checkpoint a retry continues from: the newest of the local run folder's and the store's, by
run step (a worker that died between writing its checkpoint and uploading it is one checkpoint
ahead locally; a trial that moved to another machine and back is behind locally). A run folder
holds one trial lineage at a time (the storage hands a queued retry to one worker), so the
pointer is written by one process at a time.
"""
from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path
from typing import Any, Callable

from cl_platform.callbacks import RunCallback
from cl_platform.run_dir import CHECKPOINT

# What a run folder needs to be continued elsewhere: its identity and record, the resolved config,
# the checkpoint (which holds the results so far). TensorBoard files and reports stay local.
MEMBERS = ("run.json", "config.yaml", str(CHECKPOINT))


def pointer_key(folder: Path) -> str:
    return f"checkpoint:{folder.name}"


def make_store(path: str) -> Any:
    from optuna.artifacts import FileSystemArtifactStore

    Path(path).mkdir(parents=True, exist_ok=True)
    return FileSystemArtifactStore(base_path=path)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def checkpoint_step(path: Path) -> int | None:
    """The run step a checkpoint file was written at, or None if it is not a readable run checkpoint."""
    from cl_platform.checkpoint import CheckpointError, load_checkpoint

    try:
        return int(load_checkpoint(path, "run")["position"]["step"])
    except CheckpointError:  # not a candidate: the store's copy is used
        return None


def local_step(folder: Path) -> int | None:
    from cl_platform.checkpoint import latest_checkpoint

    found = latest_checkpoint(folder / CHECKPOINT)
    return checkpoint_step(found) if found is not None else None


class TrialCheckpoints(RunCallback):
    """Uploads the run folder's checkpoint after every save and moves the study's pointer to it."""

    def __init__(self, store: Any, study: Any, trial: Any, folder: Path):
        self.store, self.study, self.trial, self.folder = store, study, trial, folder

    def on_checkpoint(self, runner: Any, path: Path) -> None:
        import optuna

        pack = self.folder / "checkpoint-upload.tar"
        with tarfile.open(pack, "w") as tar:  # uncompressed: float weights do not compress
            for name in MEMBERS:
                tar.add(self.folder / name, arcname=name)
        try:
            artifact = optuna.artifacts.upload_artifact(artifact_store=self.store, file_path=str(pack),
                                                        study_or_trial=self.trial)
            entry = {"artifact": artifact, "step": int(runner.position.step), "sha256": _sha256(pack),
                     "trial": self.trial.number}
        finally:
            pack.unlink(missing_ok=True)
        old = self.study.user_attrs.get(pointer_key(self.folder)) or {}
        self.study.set_user_attr(pointer_key(self.folder), {**entry, "previous": {k: v for k, v in old.items() if k != "previous"} or None})
        stale = (old.get("previous") or {}).get("artifact")
        if stale:
            try:
                self.store.remove(stale)
            except Exception:  # already gone (a worker died between pointer and removal): nothing to free
                pass


def restore(store: Any, study: Any, folder: Path, say: Callable[[str], None]) -> int | None:
    """Make `folder` hold the newest checkpoint of its trial lineage: the store's, unless the local
    one is at a later step (or equal). Returns the step the run will continue from, None if neither
    has one. An artifact whose SHA-256 does not match what was uploaded is skipped for the one
    before it, saying so."""
    pointer = study.user_attrs.get(pointer_key(folder))  # read from the storage, not a copy
    here = local_step(folder)
    candidates = [c for c in (pointer, (pointer or {}).get("previous")) if c]
    for entry in candidates:
        if here is not None and here >= entry["step"]:
            return here  # this machine's folder is as far as the store, or further
        data = io.BytesIO()
        try:
            with store.open_reader(entry["artifact"]) as f:
                data.write(f.read())
        except Exception as err:
            say(f"checkpoint artifact {entry['artifact']} (step {entry['step']}) cannot be read ({err}); trying the one before it")
            continue
        if hashlib.sha256(data.getvalue()).hexdigest() != entry["sha256"]:
            say(f"checkpoint artifact {entry['artifact']} (step {entry['step']}) is damaged (SHA-256 mismatch); "
                f"trying the one before it")
            continue
        data.seek(0)
        _unpack(data, folder)
        say(f"trial run folder {folder}: checkpoint of step {entry['step']} taken from the artifact store "
            f"(written by trial {entry['trial']}){'' if here is None else f'; the one here was at step {here}'}")
        return entry["step"]
    return here


def _unpack(data: io.BytesIO, folder: Path) -> None:
    """The tar's known members into `folder`, each written atomically over its target. The local
    checkpoint it replaces is older, so it is dropped, with the `prev.ckpt` before it."""
    from cl_platform.atomic import atomic_write
    from cl_platform.checkpoint import previous_path

    with tarfile.open(fileobj=data, mode="r") as tar:
        for name in MEMBERS:  # only these names: a tar never writes outside the folder
            member = tar.extractfile(name)
            if member is None:
                raise ValueError(f"checkpoint artifact lacks {name}")
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            atomic_write(folder / name, lambda f: f.write(member.read()), binary=True)
    previous_path(folder / CHECKPOINT).unlink(missing_ok=True)
