"""`clp run CONFIG --seeds 0,1,2 [--base-seeds 0,1,2]`: one run per seed, then their mean ± std.

    clp run experiments/configs/default.yaml --seeds 0,1,2                    # continual-phase seeds, one base
    clp run experiments/configs/default.yaml --seeds 0 --base-seeds 0,1,2     # three bases (pretrain.seed)

Each member is an ordinary run (its own folder, hash, TensorBoard events) made with the overrides
`seed=<s>` and, with base seeds, `pretrain.seed=<b>`; the aggregate goes to
`<runs_root>/<name>-seeds-<hash>/aggregate.json` (+ `aggregate.txt`), the hash taken over the
members' hashes. Members are resumed where a kill left them, so the same command continues a
stopped multi-seed job and finds finished members.

In `fast` mode with the `naive` strategy nothing in the continual phase is random (the model is in
eval mode and streams its data in order), so continual-phase seeds give identical runs: the
spread that matters there comes from the base, `--base-seeds`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable, Sequence

from analysis.aggregate import aggregate, format_aggregate
from cl_platform.atomic import atomic_write_json, atomic_write_text
from cl_platform.check import ConfigError
from cl_platform.checkpoint import CheckpointError
from cl_platform.config import load_config


def run_seeds(
    config: str | Path,
    overrides: Sequence[str],
    seeds: Sequence[int] | None,
    base_seeds: Sequence[int] | None = None,
    progress_bar: bool = True,
    say: Callable[[str], None] = print,
    reuse_stale_base: bool = False,
) -> tuple[Path, dict]:
    """Every (base seed, seed) member run, then the aggregate: (aggregate folder, aggregate)."""
    from experiments.run import execute

    cfg = load_config(config, overrides)  # a bad config fails here, before any member trains
    seeds = list(seeds) if seeds is not None else [cfg.seed]
    bases = list(base_seeds) if base_seeds is not None else [None]
    check_given_bases(config, overrides, base_seeds)
    members = [(b, s) for b in bases for s in seeds]
    runs, labels, folders = [], [], []
    for b, s in members:
        label = f"seed {s}" if b is None else f"base {b} seed {s}"
        extra = [f"seed={s}"] + ([] if b is None else [f"pretrain.seed={b}"])
        say(f"--- {label} ({len(runs) + 1}/{len(members)})")
        folder, results, _ = execute(config, [*overrides, *extra], resume=True, progress_bar=progress_bar, say=say,
                                     reuse_stale_base=reuse_stale_base)
        runs.append(results)
        labels.append(label)
        folders.append(str(folder))
    agg = aggregate(runs, labels)
    agg["run_folders"] = folders
    digest = hashlib.sha256("\0".join(agg["config_hashes"]).encode("utf-8")).hexdigest()
    name = cfg.name or Path(config).stem
    out = Path(cfg.runs_root) / f"{name}-seeds-{digest[:12]}"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "aggregate.json", agg)
    text = format_aggregate(agg)
    atomic_write_text(out / "aggregate.txt", text + "\n")
    say(text)
    say(f"aggregate: {out}/aggregate.json (members: {', '.join(folders)})")
    return out, agg


def check_given_bases(config: str | Path, overrides: Sequence[str], base_seeds: Sequence[int] | None) -> None:
    """With a given base (`base_checkpoint`, e.g. `reference-s${pretrain.seed}`), every base seed's
    base must exist before the first member runs, not when its turn comes."""
    from experiments.setup import load_run_config

    for b in base_seeds or []:
        try:
            load_run_config(config, [*overrides, f"pretrain.seed={b}"])
        except (ConfigError, CheckpointError) as err:
            raise ConfigError(f"base seed {b}: {err}", field=getattr(err, "field", "base_checkpoint")) from None
