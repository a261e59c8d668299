"""Provenance of a result: which code made it, with which packages, on which machine, in how long.

    base_code()                      # {"modules": {path: sha256}, "combined": sha256}: the code that makes a base
    code_fingerprint(root, files)    # the same for any files under any project root (a copied tree in tests)
    changed_modules(recorded, now)   # [] when equal, the paths that differ, None when nothing was recorded
    session()                        # {"code", "versions", "machine"} of this process, for run.json
    clock = PhaseClock(); clock.start("row0_eval"); ...; clock.stop(); clock.seconds

A fingerprint hashes source text, file by file: editing a comment counts as a change. That errs
on the safe side (a rebuilt base, not a silently stale one), and the per-file hashes name what
changed, so whoever knows the edit cannot matter can say so (`clp run --reuse-stale-base`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import time
from pathlib import Path
from typing import Any, Callable

from cl_platform.results import package_versions

# The folder that holds cl_platform/ and its sibling packages (a checkout, or site-packages).
PROJECT_ROOT = Path(__file__).resolve().parents[1]

# The source files whose code decides a base model's weights, relative to PROJECT_ROOT. The base
# key covers the rest: the resolved configuration (every default included), the packed
# pretraining tokens and the tokenizer (so not streams/tokenizer.py or the streams modules that
# load, split and pack text). Not listed either: config.py and check.py (their values are in the
# key), checkpoint.py, atomic.py, callbacks.py, results.py and run_dir.py (files and logging),
# engine.py, strategy.py and strategies/ (the continual phase only), memory/fwpkm_naive.py (a test
# reference), and experiments/base.py, experiments/setup.py (they pass configuration values, which
# the key covers, into the modules below). Listing a file of another package reads its text; it
# imports nothing.
BASE_CODE = (
    "cl_platform/model.py",                # the decoder: architecture, initialisation, forward
    "cl_platform/constants.py",            # IGNORE_INDEX: which targets the loss skips (packing writes it)
    "cl_platform/memory/fwpkm.py",         # the FwPKM layer: read, chunked writes, initial fast state
    "cl_platform/memory/product_keys.py",  # the product-key lookup that FwPKM and PKM read through
    "cl_platform/memory/pkm.py",           # static PKM layers (`model.pkm_layers`)
    "cl_platform/memory/norm.py",          # RMSNorm, in every block
    "cl_platform/optim.py",                # MixedAdamW, the pretraining optimiser
    "cl_platform/lm_module.py",            # the training step: loss, per-step seeds, learning-rate schedule, clipping, precision
    "cl_platform/memory_policy.py",        # evaluation points during pretraining restore the memory through it
    "cl_platform/trainer.py",              # the Lightning Trainer every fit runs in
    "cl_platform/pretrain.py",             # the pretraining loop: which samples each step reads, resume
    "streams/packing.py",                  # segments → input ids and targets (the data fingerprint hashes the tokens only)
    "streams/scenario.py",                 # the pretraining mixture: which splits, concatenated in which order
    "streams/datamodule.py",               # the seeded order in which pretraining reads the mixture
)

# Everything a run's results can depend on; run.json records all of their sources.
PACKAGES = ("cl_platform", "streams", "strategies", "experiments", "analysis")

# Package versions worth recording beside a result (the platform itself included).
VERSIONS = ("cl-platform", "torch", "lightning", "avalanche-lib", "numpy", "tokenizers", "datasets", "omegaconf")


def code_fingerprint(root: str | os.PathLike[str], files: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """sha256 of each file's bytes ("absent" for a missing file), and one sha256 over all of them."""
    root = Path(root)
    modules = {}
    for name in sorted(files):
        path = root / name
        modules[name] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "absent"
    combined = hashlib.sha256("".join(f"{name}\0{digest}\n" for name, digest in modules.items()).encode("utf-8"))
    return {"modules": modules, "combined": combined.hexdigest()}


def source_files(root: str | os.PathLike[str], packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Every .py file of `packages` under `root`, relative to it."""
    root = Path(root)
    return sorted(p.relative_to(root).as_posix() for pkg in packages for p in (root / pkg).rglob("*.py"))


# Computed once per process: the code that runs is what was imported, even if a file is edited
# while the process runs.
@functools.lru_cache(maxsize=1)
def base_code() -> dict[str, Any]:
    """The fingerprint of BASE_CODE in this installation."""
    return code_fingerprint(PROJECT_ROOT, BASE_CODE)


@functools.lru_cache(maxsize=1)
def all_code() -> dict[str, Any]:
    """The fingerprint of every source file of the platform in this installation."""
    return code_fingerprint(PROJECT_ROOT, source_files(PROJECT_ROOT))


def changed_modules(recorded: dict[str, Any] | None, current: dict[str, Any]) -> list[str] | None:
    """The files whose hash differs between a recorded fingerprint and `current` ([] when none
    does); None when there is no record to compare (something made before fingerprints existed)."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("modules"), dict):
        return None
    old, new = recorded["modules"], current["modules"]
    return sorted(name for name in set(old) | set(new) if old.get(name) != new.get(name))


def machine() -> dict[str, Any]:
    """The CPU model, core count, torch's thread count, OS and Python of this process."""
    import torch

    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "os": platform.platform(),
        "python": platform.python_version(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass  # not Linux: platform knows less, but something
    return platform.processor() or platform.machine() or "unknown"


def session() -> dict[str, Any]:
    """What a run folder records about the process working on it."""
    return {"code": all_code(), "versions": package_versions(VERSIONS), "machine": machine()}


class PhaseClock:
    """Wall seconds per named phase, accumulated: a phase started again (after a resume) adds to
    what its `state_dict` held. `flush()` books the running phase's time so far, so a checkpoint
    written mid-phase carries it; time after the last checkpoint of a killed process is lost."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self.seconds: dict[str, float] = {}
        self.current: str | None = None
        self._since = 0.0

    def start(self, phase: str) -> None:
        """End the running phase (if any) and time `phase` from now on."""
        self.stop()
        self.current = phase
        self.seconds.setdefault(phase, 0.0)
        self._since = self.clock()

    def flush(self) -> None:
        if self.current is not None:
            now = self.clock()
            self.seconds[self.current] += now - self._since
            self._since = now

    def stop(self) -> None:
        self.flush()
        self.current = None

    def state_dict(self) -> dict[str, float]:
        self.flush()
        return dict(self.seconds)

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.seconds = {name: float(value) for name, value in state.items()}
        if self.current is not None:
            self.seconds.setdefault(self.current, 0.0)
