"""The base model of a run, by one question: `resolve_base(setup)` returns the base this config
needs (a `cl_platform.base_file.BaseFile`: path, weights, record, provenance, probe) or refuses
with one CheckpointError naming the file, before anything of the run is written.

    base = resolve_base(setup)     # given, cached, shipped, or pretrained now
    base.path, base.weights, base.how, base.entry()

The whole decision is `resolve_base`, top to bottom:
1. **given** (`base_checkpoint`): that file; refused if it contradicts the run's `pretrain`
   section, or was built by other code and this code does not reproduce its probe (unless
   `reuse_stale`, `clp run --reuse-stale-base`).
2. **cached** under `<runs_root>/pretrain-<key[:12]>/`, built by this code or reproducing its probe.
3. **shipped** in `experiments/bases/*/` with the same key (pretrain.json), under the same rule:
   a config that pretrains a shipped base reads it instead of rebuilding it for an hour.
4. **stale cached** (other code, probe not reproduced): reused with `reuse_stale`, otherwise
   moved aside to `pretrain-<key[:12]>.stale-<its code hash[:12] or 'unknown'>` and rebuilt.
5. **unfinished pretraining** (a killed one): continued, unless other code started it (then moved
   aside, unless `reuse_stale`).
6. **pretrained now** into the cache folder (with its probe.json and tokenizer.json beside it).

The key (`experiments.setup.base_key`) covers the configuration and data that determine the base's
weights, so a run that changes only the continual phase reuses the base. The code that determines
the weights is checked beside the key, not hashed into it: a check can say which files differ (a
new key cannot), finds bases made before the check with the same rule, and run folders (whose
identity includes the base key) do not all change name at every code edit. The questions about one
file (whose code built it, does its probe reproduce) are `cl_platform.base_file`'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path
from typing import Callable

from cl_platform.atomic import atomic_write
from cl_platform.base_file import REUSE_FLAG, BaseFile, check_loads, code_change, contradictions, describe, move_aside, open_base
from cl_platform.checkpoint import CheckpointError, latest_checkpoint, load_latest
from cl_platform.device import Placement, launch_rank
from cl_platform.file_lock import FileLock
from cl_platform.lm_module import precision_note
from cl_platform.pretrain import BASE, PROGRESS, Pretrainer
from cl_platform.probe import write_probe
from experiments.base_record import SHIPPED_BASES, TOKENIZER_FILE, stream_entry
from experiments.setup import Setup, base_key, build_model


def base_dir(setup: Setup, key: str) -> Path:
    return Path(setup.config.runs_root) / f"pretrain-{key[:12]}"


def resolve_base(setup: Setup, say: Callable[[str], None] = print, reuse_stale: bool = False,
                 progress_bar: bool = True, shipped: tuple[Path, ...] = (SHIPPED_BASES,)) -> BaseFile:
    """The base this config needs (the module docstring lists the cases in the order they are
    tried), with `how` set to "given", "cached" (shipped too) or "pretrained"."""
    cfg, model_config, rule = setup.config, setup.model_config, setup.config.pretrain.fwpkm
    if cfg.base_checkpoint is not None:
        base = open_base(cfg.base_checkpoint, model_config, rule)
        if base.key is None:
            raise CheckpointError(f"checkpoint {base.path} has no pretraining key")
        check_loads(base.path, base.weights, model_config, rule)
        differ = contradictions(base.record.get("config"), cfg.pretrain)
        if differ:
            raise CheckpointError(
                f"checkpoint {base.path} was pretrained with other settings than this run's pretrain section: "
                f"{'; '.join(differ)}. Point base_checkpoint at the base of these settings (a shipped name may "
                "name the seed: reference-s${pretrain.seed}), or remove these fields from the config: a named "
                "base brings its own")
        if not base.usable and not reuse_stale:
            raise CheckpointError(f"checkpoint {base.path} was built by {base.change}, and {base.refusal()}; pass "
                                  f"{REUSE_FLAG} to use it anyway, or leave base_checkpoint unset to pretrain a base "
                                  "with this code")
        say(f"base model: {base.path} (given by base_checkpoint{'; ' + base.note() if base.note() else ''})")
        return dataclasses.replace(base, how="given")

    key = base_key(setup)
    out = base_dir(setup, key)
    # One process at a time looks at and builds a base: two runs that need the same uncached base
    # (two terminals, two sweep workers) do not both pretrain it; the second waits on the lock
    # beside the folder (beside, because a stale folder is renamed; hidden, so that it is not taken
    # for a base folder) and then finds it cached. A data-parallel pretraining's other ranks take
    # no lock: rank 0 holds it for the whole pretraining, which needs them in it.
    placement = Placement.of(cfg.pretrain)
    lock = (contextlib.nullcontext() if placement.world_size > 1 and launch_rank(placement.devices) > 0 else
            FileLock(out.with_name(f".{out.name}.lock"), f"base {out}", wait=True, on_wait=say, on_takeover=say))
    with lock:
        cached = open_base(out / BASE, model_config, rule) if (out / BASE).is_file() else None
        if cached is not None and cached.key != key:
            raise CheckpointError(f"{cached.path} was built for pretraining key {cached.key}, expected {key}; "
                                  f"delete {out} to rebuild it")
        if cached is not None and cached.usable:
            say(f"base model: cached {cached.path} ({cached.note() + '; ' if cached.note() else ''}"
                f"{describe(cached.record)})")
            return dataclasses.replace(cached, how="cached")
        for record_file in shipped_records(shipped, key):
            base = open_base(record_file.parent / BASE, model_config, rule)
            if base.key != key:
                raise CheckpointError(f"{base.path} holds pretraining key {base.key}, but {record_file} says {key}")
            if base.usable:
                say(f"base model: shipped {base.path} (pretraining key {key[:12]}"
                    f"{'; ' + base.note() if base.note() else ''}; {describe(base.record)})")
                return dataclasses.replace(base, how="cached")
            say(f"base model: shipped {base.path} has this key but was built by {base.change} and "
                f"{base.refusal()}: not used")
        if cached is not None and reuse_stale:
            check_loads(cached.path, cached.weights, model_config, rule)  # other code may name or shape its weights otherwise
            say(f"base model: cached {cached.path} was built by {cached.change}; reused anyway ({REUSE_FLAG}) "
                f"({describe(cached.record)})")
            return dataclasses.replace(cached, how="cached")
        if cached is not None:
            aside = move_aside(out, cached.record)
            say(f"base model: cached {cached.path} was built by {cached.change}: moved to {aside}, rebuilding "
                f"({REUSE_FLAG} would reuse it)")
        elif latest_checkpoint(out / PROGRESS) is not None:
            # An unfinished pretraining continues only with the code it started with (its record
            # is the previous checkpoint's if the newest cannot be read: it continues from that one too).
            record = load_latest(out / PROGRESS, "pretrain", model_config, say=lambda _: None)[0].get("record", {})
            change = code_change(record)
            if change is not None and reuse_stale:
                say(f"base model: the unfinished pretraining in {out} was started by {change}; continuing anyway "
                    f"({REUSE_FLAG})")
            elif change is not None:
                aside = move_aside(out, record)
                say(f"base model: the unfinished pretraining in {out} was started by {change}: moved to {aside}, "
                    f"starting over ({REUSE_FLAG} would continue it)")
        return pretrain_base(setup, key, out, progress_bar, say)


def shipped_records(roots: tuple[Path, ...], key: str) -> list[Path]:
    """The pretrain.json files under `roots` (one folder a base) that name pretraining key `key`."""
    found = []
    for root in roots:
        for record_file in sorted(Path(root).glob("*/pretrain.json")):
            try:
                if json.loads(record_file.read_text(encoding="utf-8")).get("key") == key:
                    found.append(record_file)
            except (OSError, ValueError):
                continue
    return found


def pretrain_base(setup: Setup, key: str, out: Path, progress_bar: bool, say: Callable[[str], None]) -> BaseFile:
    """Pretrain the base of `key` into `out` (continuing an unfinished pretraining there)."""
    from streams import PretrainDataModule

    cfg = setup.config
    say(f"base model: pretraining {cfg.pretrain.steps} steps into {out} (built once, reused by later runs)")
    if (note := precision_note(cfg.pretrain.precision, "pretrain.precision")) is not None:
        say(note)  # here, where a pretraining starts: a run on a given base trains none
    model = build_model(setup.model_config, cfg.pretrain.seed, cfg.pretrain.fwpkm)
    pretrainer = Pretrainer(
        model=model,
        data=PretrainDataModule(setup.scenario, cfg.pretrain.batch_size, seed=cfg.pretrain.seed),
        eval_loaders=setup.scenario[0].eval_loaders(cfg.cl.eval_batch_size),
        config=cfg.pretrain,
        out_dir=out,
        key=key,
        eval_batch_size=cfg.cl.eval_batch_size,
        progress_bar=progress_bar,
        stream=stream_entry(setup.scenario.tokenizer, setup.scenario.config.seq_len),
    )
    record = pretrainer.run()
    if pretrainer.is_rank_zero:  # data parallel: the other ranks hold the same weights and write nothing
        write_probe(out, model.state_dict(), setup.model_config, cfg.pretrain.fwpkm)  # lets other code check it, once given
        # The tokenizer travels with the base: a stream read with it takes this file.
        raw = setup.scenario.tokenizer.raw_json
        atomic_write(out / TOKENIZER_FILE, lambda f: f.write(raw), binary=True)
    say(f"base model: {out / BASE} ({describe(record)})")
    return BaseFile(out / BASE, key, model.state_dict(), record, None, how="pretrained")
