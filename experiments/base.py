"""The base model of a run: cached under `<runs_root>/pretrain-<key[:12]>/`, pretrained on a miss,
or given by `base_checkpoint`.

    path, record, cached, weights = ensure_base(setup)     # pretrain once, reuse afterwards

The key (`experiments.setup.base_key`) covers everything that determines the base's weights, so a
run that changes only the continual phase (its write rule, mode, strategy, seed) reuses the base,
and one that changes the architecture or the pretraining gets its own. A pretraining killed
part-way continues from its last checkpoint.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

from cl_platform.checkpoint import CheckpointError, load_checkpoint
from experiments.setup import Setup, base_key, build_model


def base_dir(setup: Setup, key: str) -> Path:
    return Path(setup.config.runs_root) / f"pretrain-{key[:12]}"


def ensure_base(setup: Setup, progress_bar: bool = True, say: Callable[[str], None] = print) -> tuple[Path, dict, bool, dict]:
    """The base model of this config: cached, or pretrained now. Returns (checkpoint path, record,
    whether it was cached, model state dict)."""
    from cl_platform.pretrain import BASE, Pretrainer
    from streams import PretrainDataModule

    cfg = setup.config
    key = base_key(setup)
    out = base_dir(setup, key)
    base = out / BASE
    if base.is_file():
        data = load_checkpoint(base, "base", setup.model_config)
        if data.get("key") != key:
            raise CheckpointError(f"{base} was built for pretraining key {data.get('key')}, expected {key}; delete {out} to rebuild it")
        say(f"base model: cached {base} ({describe(data['record'])})")
        return base, data["record"], True, data["model"]
    say(f"base model: pretraining {cfg.pretrain.steps} steps into {out} (built once, reused by later runs)")
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
    )
    record = pretrainer.run()
    say(f"base model: {base} ({describe(record)})")
    return base, record, False, model.state_dict()


def given_base(setup: Setup, say: Callable[[str], None]) -> tuple[dict, dict]:
    """The base named by `base_checkpoint`, checked against this run's architecture: (identity, weights)."""
    path = setup.config.base_checkpoint
    data = load_checkpoint(path, "base", setup.model_config)
    if "key" not in data:
        raise CheckpointError(f"checkpoint {path} has no pretraining key")
    say(f"base model: {path} (given by base_checkpoint)")
    return {"source": "checkpoint", "key": data["key"]}, data["model"]


def describe(record: dict) -> str:
    """One line: final eval loss vs the unigram baseline, steps and time."""
    loss, uni = record.get("final_eval_mean", math.nan), record.get("unigram_mean", math.nan)
    return (f"eval loss {loss:.3f} (ppl {math.exp(loss):.1f}) vs unigram {uni:.3f} (ppl {math.exp(uni):.1f}); "
            f"{record.get('steps', 0)} steps, {record.get('tokens', 0):,} tokens, {record.get('seconds', 0.0):.0f} s")
