"""The base model of a run: cached under `<runs_root>/pretrain-<key[:12]>/`, found among the
shipped bases (experiments/bases/*/, by key), pretrained on a miss, or given by `base_checkpoint`.

    path, record, cached, weights = ensure_base(setup)     # pretrain once, reuse afterwards
    identity, weights, record = given_base(setup, say)      # the file named by base_checkpoint

The key (`experiments.setup.base_key`) covers the configuration and data that determine the base's
weights, so a run that changes only the continual phase (its write rule, mode, strategy, seed)
reuses the base, and one that changes the architecture or the pretraining gets its own. A
pretraining killed part-way continues from its last checkpoint.

The code that determines the weights (`cl_platform.provenance.BASE_CODE`) is checked beside the
key, not hashed into it: every base records the per-file hashes of the code that built it, and a
base (or an unfinished pretraining) whose record differs from the running code, or has none (made
before bases recorded their code), is stale. By default a stale cached base is moved aside to
`pretrain-<key[:12]>.stale-<its code hash[:12] or 'unknown'>` and rebuilt in place, and a stale
`base_checkpoint` is refused; `reuse_stale=True` (`clp run --reuse-stale-base`) uses it anyway,
and run.json says so — except that a base (cached, shipped or given) whose `probe.json` (written
beside every base it pretrains; experiments/base_probe.py) this code reproduces is the same
function, and is used with a note naming the files that differ. A check rather than the key, because it can say which files differ (a new
key cannot), it finds bases made before the check with the same rule, and run folders (whose
identity includes the base key) do not all change name at every code edit.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from cl_platform.atomic import atomic_write
from cl_platform.checkpoint import CheckpointError, load_checkpoint
from cl_platform.lm_module import precision_note
from cl_platform.provenance import base_code, changed_modules
from experiments.base_probe import PROBE_FILE, probe_difference, write_probe
from experiments.base_record import SHIPPED_BASES, TOKENIZER_FILE, contradictions, stream_entry
from experiments.base_probe import TOLERANCE as PROBE_TOLERANCE
from experiments.setup import Setup, base_key, build_model

REUSE_FLAG = "--reuse-stale-base"


def base_dir(setup: Setup, key: str) -> Path:
    return Path(setup.config.runs_root) / f"pretrain-{key[:12]}"


# Bases shipped in the repository (experiments/bases/<name>/: base.ckpt, pretrain.json, probe.json)
# are each a cache entry under its pretraining key, found by any config that pretrains that base.


def ensure_base(setup: Setup, progress_bar: bool = True, say: Callable[[str], None] = print,
                reuse_stale: bool = False, shipped: tuple[Path, ...] = (SHIPPED_BASES,)) -> tuple[Path, dict, bool, dict]:
    """The base model of this config: cached, or pretrained now. Returns (checkpoint path, record,
    whether it was cached, model state dict). A cached base built by other code is used if this
    code reproduces its probe; otherwise it, or an unfinished pretraining built by other code, is
    moved aside and rebuilt, unless `reuse_stale`.

    One process at a time looks at and builds a base: two runs that need the same uncached base
    (two terminals, two sweep workers) do not both pretrain it — the second waits on
    `.pretrain-<key[:12]>.lock` beside the folder (beside, because a stale folder is renamed;
    hidden, so that it is not taken for a base folder) and then finds the base cached.

    Before pretraining, the folders under `shipped` (the repository's experiments/bases) are
    searched for a base of the same key: one that this code built, or whose probe this code
    reproduces, is used where it lies (`shipped_base`), so that a config which pretrains a
    shipped base (`clp eval`/`clp niah` families, experiments/configs/reference.yaml) reads it
    instead of rebuilding it for an hour."""
    from cl_platform.device import Placement, launch_rank
    from cl_platform.file_lock import FileLock

    out = base_dir(setup, base_key(setup))
    placement = Placement.of(setup.config.pretrain)
    if placement.world_size > 1 and launch_rank(placement.devices) > 0:
        # A data-parallel pretraining's other ranks: rank 0 holds the lock for the whole
        # pretraining, which needs these ranks in it; they follow rank 0's decisions and write
        # nothing. (Ranks of a data-parallel continual phase still wait: they need the base built
        # by one process before they start.)
        return _ensure_base(setup, progress_bar, say, reuse_stale, shipped)
    with FileLock(out.with_name(f".{out.name}.lock"), f"base {out}", wait=True, on_wait=say, on_takeover=say):
        return _ensure_base(setup, progress_bar, say, reuse_stale, shipped)


def shipped_base(setup: Setup, key: str, roots: tuple[Path, ...],
                 say: Callable[[str], None]) -> tuple[Path, dict, bool, dict] | None:
    """The shipped base of pretraining key `key` under `roots` (as ensure_base returns it), or None.
    Built by other code, it is used only if its probe reproduces (the same function), as a given
    base is; one that does not is named and passed over."""
    import json

    from cl_platform.pretrain import BASE

    for root in roots:
        for record_file in sorted(Path(root).glob("*/pretrain.json")):
            try:
                if json.loads(record_file.read_text(encoding="utf-8")).get("key") != key:
                    continue
            except (OSError, ValueError):
                continue
            path = record_file.parent / BASE
            data = load_checkpoint(path, "base", setup.model_config)
            if data.get("key") != key:
                raise CheckpointError(f"{path} holds pretraining key {data.get('key')}, but {record_file} says {key}")
            record, note = data["record"], ""
            change = code_change(record)
            if change is not None:
                diff = checked_probe_difference(path.parent, data["model"], setup)
                if diff is None or diff > PROBE_TOLERANCE:
                    why = ("it has no probe (or weights this model cannot load)" if diff is None
                           else f"its probe differs by {diff:.3g} nats under this code")
                    say(f"base model: shipped {path} has this key but was built by {change} and {why}: not used")
                    continue
                record = {**record, "probe_difference": diff}
                note = f"; {same_function_words(record)}"
            say(f"base model: shipped {path} (pretraining key {key[:12]}{note}; {describe(record)})")
            return path, record, True, data["model"]
    return None


def _ensure_base(setup: Setup, progress_bar: bool, say: Callable[[str], None],
                 reuse_stale: bool, shipped: tuple[Path, ...]) -> tuple[Path, dict, bool, dict]:
    from cl_platform.checkpoint import latest_checkpoint
    from cl_platform.pretrain import BASE, PROGRESS, Pretrainer
    from streams import PretrainDataModule

    cfg = setup.config
    key = base_key(setup)
    out = base_dir(setup, key)
    base = out / BASE
    if base.is_file():
        data = load_checkpoint(base, "base", setup.model_config)
        if data.get("key") != key:
            raise CheckpointError(f"{base} was built for pretraining key {data.get('key')}, expected {key}; delete {out} to rebuild it")
        change = code_change(data["record"])
        if change is None:
            say(f"base model: cached {base} ({describe(data['record'])})")
            return base, data["record"], True, data["model"]
        # Built by other code: still this base if this code computes the same function with it
        # (a code edit that leaves the function alone does not cost an hour's rebuild).
        diff = checked_probe_difference(out, data["model"], setup)
        if diff is not None and diff <= PROBE_TOLERANCE:
            record = {**data["record"], "probe_difference": diff}
            say(f"base model: cached {base} ({same_function_words(record)}; {describe(record)})")
            return base, record, True, data["model"]
    found = shipped_base(setup, key, shipped, say)
    if found is not None:
        return found
    if base.is_file():
        if reuse_stale:
            check_loads(base, data["model"], setup)  # other code may name or shape its weights otherwise
            say(f"base model: cached {base} was built by {change}; reused anyway ({REUSE_FLAG}) "
                f"({describe(data['record'])})")
            return base, data["record"], True, data["model"]
        aside = move_aside(out, data["record"])
        say(f"base model: cached {base} was built by {change}: moved to {aside}, rebuilding "
            f"({REUSE_FLAG} would reuse it)")
    elif latest_checkpoint(out / PROGRESS) is not None:
        # An unfinished pretraining continues only with the code it started with.
        record = _progress_record(out / PROGRESS, setup)
        change = code_change(record)
        if change is not None and reuse_stale:
            say(f"base model: the unfinished pretraining in {out} was started by {change}; continuing anyway ({REUSE_FLAG})")
        elif change is not None:
            aside = move_aside(out, record)
            say(f"base model: the unfinished pretraining in {out} was started by {change}: moved to {aside}, "
                f"starting over ({REUSE_FLAG} would continue it)")
    say(f"base model: pretraining {cfg.pretrain.steps} steps into {out} (built once, reused by later runs)")
    if (note := precision_note(cfg.pretrain.precision, "pretrain.precision")) is not None:
        say(note)  # here, where a pretraining starts: a run on a given base trains none
    model = build_model(setup.model_config, cfg.pretrain.seed, cfg.pretrain.fwpkm)
    data_module = PretrainDataModule(setup.scenario, cfg.pretrain.batch_size, seed=cfg.pretrain.seed)
    pretrainer = Pretrainer(
        model=model,
        data=data_module,
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
    say(f"base model: {base} ({describe(record)})")
    return base, record, False, model.state_dict()


def checked_probe_difference(folder: Path, weights: dict, setup: Setup) -> float | None:
    """The probe's difference under this code for a cached or shipped base (None: no probe, or
    weights this model cannot load, which no probe can vouch for)."""
    try:
        check_loads(folder, weights, setup)
    except CheckpointError:
        return None
    return probe_difference(folder, weights, setup.model_config, setup.config.pretrain.fwpkm)


def _progress_record(path: Path, setup: Setup) -> dict:
    """The record of an unfinished pretraining (the previous checkpoint's if the newest cannot be
    read: the pretraining will continue from that one too)."""
    from cl_platform.checkpoint import load_latest

    data, _ = load_latest(path, "pretrain", setup.model_config, say=lambda _: None)
    return data.get("record", {})


def given_base(setup: Setup, say: Callable[[str], None], reuse_stale: bool = False) -> tuple[dict, dict, dict]:
    """The base named by `base_checkpoint`, checked against this run's architecture and code:
    (identity, weights, record). Every problem is a CheckpointError naming the file, raised
    before anything is written or trained."""
    path = Path(setup.config.base_checkpoint)
    data = load_checkpoint(path, "base", setup.model_config)
    if "key" not in data:
        raise CheckpointError(f"checkpoint {path} has no pretraining key")
    record = data.get("record") if isinstance(data.get("record"), dict) else {}
    change = code_change(record)
    check_loads(path, data["model"], setup)
    check_pretrain_settings(path, record, setup)
    note = ""
    if change is not None:
        # Built by other code: still the same base if this code computes the same function with it.
        diff = probe_difference(path.parent, data["model"], setup.model_config, setup.config.pretrain.fwpkm)
        same = diff is not None and diff <= PROBE_TOLERANCE
        record = {**record, "probe_difference": diff}
        if same:
            note = f"; {same_function_words(record)}"
        elif reuse_stale:
            note = f"; built by {change}, used anyway ({REUSE_FLAG})"
        else:
            probe = (f"its probe ({path.parent / PROBE_FILE}) differs by {diff:.3g} nats under this code"
                     if diff is not None else f"it has no {PROBE_FILE} beside it to check")
            raise CheckpointError(f"checkpoint {path} was built by {change}, and {probe}; pass {REUSE_FLAG} "
                                  f"to use it anyway, or leave base_checkpoint unset to pretrain a base with this code")
    say(f"base model: {path} (given by base_checkpoint{note})")
    return {"source": "checkpoint", "key": data["key"]}, data["model"], record


def check_pretrain_settings(path: Path, record: dict, setup: Setup) -> None:
    """The run's `pretrain` section must describe the given base: it is what run.json, the run's
    identity and `--base-seeds` (which sets `pretrain.seed`) read as the base's settings. So a base
    of another seed or schedule is refused, naming the fields, instead of standing in silently for
    the one the config names. Reporting fields (log_every, ...) and where it ran (accelerator) do
    not change a base and are not compared; a record without settings (a base made by other tools) is not checked."""
    differ = contradictions(record.get("config"), setup.config.pretrain)
    if differ:
        raise CheckpointError(f"checkpoint {path} was pretrained with other settings than this run's pretrain "
                              f"section: {'; '.join(differ)}. Point base_checkpoint at the base of these settings "
                              "(a shipped name may name the seed: reference-s${pretrain.seed}), or remove these "
                              "fields from the config: a named base brings its own")


def code_change(record: dict) -> str | None:
    """None when the base's recorded code is the running code; otherwise what built it, in words."""
    changed = changed_modules(record.get("code"), base_code())
    if changed is None:
        return "unknown code (its record has no code fingerprint: it was made before bases recorded one)"
    if not changed:
        return None
    return f"other code ({', '.join(changed)} differ{'s' if len(changed) == 1 else ''})"


def same_function_words(record: dict) -> str:
    """Why a base built by other code is used, in plain words: this code reproduces its probe
    (experiments/base_probe.py). run.json names the files that changed (`base.changed_modules`)."""
    changed = changed_modules(record.get("code"), base_code())
    since = ("it was made before bases recorded their code" if changed is None else
             f"the code has changed in {len(changed)} file{'' if len(changed) == 1 else 's'} since it was built")
    tolerance = f"{PROBE_TOLERANCE:.0e}".replace("e-0", "e-")  # 1e-4
    return f"{since}, and this code computes the same function with it: its probe reproduces within {tolerance} nats"


def move_aside(out: Path, record: dict) -> Path:
    """Rename a stale base folder so that its key's folder is free for the rebuild; nothing is deleted."""
    code = record.get("code") if isinstance(record.get("code"), dict) else {}
    stem = f"{out.name}.stale-{str(code.get('combined', 'unknown'))[:12]}"
    aside, n = out.with_name(stem), 1
    while aside.exists():
        n += 1
        aside = out.with_name(f"{stem}-{n}")
    out.rename(aside)
    return aside


def check_loads(path: Path, weights: dict, setup: Setup) -> None:
    """A base's weights must fit this version's model exactly (names and shapes); torch's own
    error would come later, after the run folder is made."""
    model = build_model(setup.model_config, 0, setup.config.pretrain.fwpkm)
    try:
        model.load_state_dict(weights)
    except (RuntimeError, KeyError, TypeError) as err:
        detail = " ".join(str(err).split())[:300]
        raise CheckpointError(f"checkpoint {path} holds weights this version of cl-platform cannot load "
                              f"into the model (saved by an incompatible version?): {detail}") from None


def base_entry(path: Path, record: dict, how: str) -> dict[str, Any]:
    """What run.json says about the base a run started from. `how`: "pretrained" (by this run),
    "cached" or "given" (base_checkpoint)."""
    changed = changed_modules(record.get("code"), base_code())
    code = record.get("code") if isinstance(record.get("code"), dict) else {}
    return {
        "path": str(path),
        "how": how,
        "key": record.get("key"),
        "code": code.get("combined"),  # None: made before bases recorded their code
        # A base built by other code is only ever used when asked for (--reuse-stale-base).
        "reused_stale": changed != [] and not same_function(record),
        "changed_modules": changed if changed is not None else "unknown",
        "pretraining_seconds": record.get("seconds"),
        # A given base built by other code: max |Δ| of its probe under this code (None: not checked).
        "probe_difference": record.get("probe_difference"),
    }


def same_function(record: dict) -> bool:
    diff = record.get("probe_difference")
    return diff is not None and diff <= PROBE_TOLERANCE


def describe(record: dict) -> str:
    """One line: final eval loss vs the unigram baseline, steps and time."""
    loss, uni = record.get("final_eval_mean", math.nan), record.get("unigram_mean", math.nan)
    return (f"eval loss {loss:.3f} (ppl {math.exp(loss):.1f}) vs unigram {uni:.3f} (ppl {math.exp(uni):.1f}); "
            f"{record.get('steps', 0)} steps, {record.get('tokens', 0):,} tokens, {record.get('seconds', 0.0):.0f} s")
