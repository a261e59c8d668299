"""`clp pretrain CONFIG`: train the base model of a run config once; later runs reuse it.

    clp pretrain experiments/default.yaml

The base lives in `<runs_root>/pretrain-<key>/` (base.ckpt, pretrain.json with the loss curves and
the unigram baseline, tensorboard/), keyed by everything that determines its weights: the model
config, the pretrain settings that affect training, and the fingerprints of the pretraining data
and of the tokenizer. `clp run` reuses a base whose key matches and says so; anything else trains
a new one (and says so). A pretraining killed part-way continues from its last checkpoint.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from cl_platform.checkpoint import CheckpointError, load_checkpoint
from cl_platform.model import FwPKMLM, ModelConfig
from cl_platform.run_config import ConfigError, RunConfig, config_hash, load_run_config

# Pretrain fields that change when and how progress is reported, not the weights.
_REPORTING_FIELDS = ("log_every", "eval_every", "eval_segments", "checkpoint_every")


@dataclass
class Setup:
    """A run config with its stream loaded and its model config resolved."""

    config: RunConfig
    config_path: Path
    scenario: Any
    model_config: ModelConfig


def load_setup(config_path: str | Path) -> Setup:
    """Read the run config and build its stream; every error names the file and field."""
    from streams import build_stream, load_stream_config

    cfg, path = load_run_config(config_path)
    try:
        stream_cfg = load_stream_config(cfg.stream)
    except FileNotFoundError:
        raise ConfigError(f"{path}: run config field 'stream': {cfg.stream} does not exist") from None
    except ValueError as err:  # the stream YAML's own validation, which names its file and field
        raise ConfigError(f"{path}: run config field 'stream': {err}") from None
    if cfg.order is not None:
        try:
            stream_cfg = dataclasses.replace(stream_cfg, order=list(cfg.order))
        except ValueError as err:
            raise ConfigError(f"{path}: run config field 'order': {err}") from None
    scenario = build_stream(stream_cfg)
    return Setup(cfg, path, scenario, cfg.model_config(scenario.tokenizer.vocab_size))


def build_model(model_config: ModelConfig, seed: int) -> FwPKMLM:
    torch.manual_seed(seed)
    return FwPKMLM(model_config)


def pretrain_fingerprint(scenario) -> str:
    """sha256 of every domain's packed pretraining tokens, in configured order."""
    h = hashlib.sha256()
    for name, domain in scenario.domains.items():
        h.update(name.encode("utf-8") + b"\0")
        h.update(domain.splits["pretrain"].segments.tokens.numpy().tobytes())
    return h.hexdigest()


def pretrain_key(setup: Setup) -> str:
    settings = dataclasses.asdict(setup.config.pretrain)
    for name in _REPORTING_FIELDS:
        settings.pop(name)
    return config_hash({
        "model": dataclasses.asdict(setup.model_config),
        "pretrain": settings,
        "data": pretrain_fingerprint(setup.scenario),
        "tokenizer": setup.scenario.tokenizer.fingerprint,
    })


def pretrain_dir(setup: Setup, key: str) -> Path:
    return Path(setup.config.runs_root) / f"pretrain-{key[:12]}"


def ensure_base(setup: Setup, progress_bar: bool = True, say: Callable[[str], None] = print) -> tuple[Path, dict, bool, dict]:
    """The base model of this config: cached, or pretrained now. Returns (checkpoint path, record,
    whether it was cached, model state dict)."""
    from cl_platform.pretrain import BASE, Pretrainer
    from streams import PretrainDataModule

    cfg = setup.config
    key = pretrain_key(setup)
    out = pretrain_dir(setup, key)
    base = out / BASE
    if base.is_file():
        data = load_checkpoint(base, "base", setup.model_config)
        if data.get("key") != key:
            raise CheckpointError(f"{base} was built for pretraining key {data.get('key')}, expected {key}; delete {out} to rebuild it")
        say(f"base model: cached {base} ({describe(data['record'])})")
        return base, data["record"], True, data["model"]
    say(f"base model: pretraining {cfg.pretrain.steps} steps into {out} (built once, reused by later runs)")
    model = build_model(setup.model_config, cfg.pretrain.seed)
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


def describe(record: dict) -> str:
    """One line: final eval loss vs the unigram baseline, steps and time."""
    loss, uni = record.get("final_eval_mean", math.nan), record.get("unigram_mean", math.nan)
    return (f"eval loss {loss:.3f} (ppl {math.exp(loss):.1f}) vs unigram {uni:.3f} (ppl {math.exp(uni):.1f}); "
            f"{record.get('steps', 0)} steps, {record.get('tokens', 0):,} tokens, {record.get('seconds', 0.0):.0f} s")


def report(record: dict) -> str:
    """Per-domain table of the pretrained base against the unigram baseline, and the loss curve."""
    lines = [f"{'domain':<10} {'unigram':>9} {'base':>9}"]
    for name, uni in record["unigram"].items():
        lines.append(f"{name:<10} {uni:>9.3f} {record['final_eval'][name]:>9.3f}")
    lines.append(f"{'mean':<10} {record['unigram_mean']:>9.3f} {record['final_eval_mean']:>9.3f}")
    curve = record["loss_curve"]
    if curve:
        marks = sorted({0, len(curve) // 4, len(curve) // 2, 3 * len(curve) // 4, len(curve) - 1})
        lines.append("training loss: " + ", ".join(f"step {curve[i][0]}: {curve[i][1]:.3f}" for i in marks))
    return "\n".join(lines)


def main(config: str) -> int:
    setup = load_setup(config)
    path, record, _, _ = ensure_base(setup)
    print(report(record))
    print(f"TensorBoard: tensorboard --logdir {path.parent / 'tensorboard'}")
    return 0
