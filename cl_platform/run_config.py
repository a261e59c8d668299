"""The run configuration: one YAML file, typed sections, validated on construction.

    cfg = load_run_config("experiments/default.yaml")
    cfg.cl.mode                                   # "fast"
    cfg.model_config(vocab_size=4096)             # the resolved ModelConfig

Sections (every field has a default; a YAML file changes only what it names):

    stream:          path of the stream YAML (relative paths resolve against the run config's folder)
    order:           experience order (domain names, repeats allowed); null = the stream's own order
    model:           {preset: small, <ModelConfig field>: value, fwpkm: {<FwPKMConfig field>: value}}
    pretrain:        how the base model is trained on the mixture of pretrain splits (PretrainConfig)
    base_checkpoint: a base model checkpoint to start from instead of pretraining (null = pretrain,
                     or reuse the cached base built from exactly this model/pretrain/data)
    cl:              the continual-learning phase (CLConfig)
    strategy:        {name: naive, kwargs: {}} (a name registered in `strategies.STRATEGIES`)
    seed:            seed of the continual-learning phase (finetune randomness, strategies)
    name:            run name prefix (null = the config file's stem)
    runs_root:       where run folders go (relative to the working directory)

A mistake names its field: `run config field 'cl.mode': 'fastt' is not one of ['fast', 'finetune']`.
Names that only another package can check (strategy names, domain names in `order`) are checked
where that package is in scope (experiments/run.py), before anything is written.

Run identity is the hash of the resolved configuration (`config_hash`); the fields that say
*where* things are (`runs_root`, `name`, file paths) are not part of it, the data they point at is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import yaml

from cl_platform.memory_policy import POLICIES
from cl_platform.model import ModelConfig
from cl_platform.results import Mode


class ConfigError(ValueError):
    """A run configuration is invalid; the message names the field."""


def _bad(where: str, value: Any, why: str) -> ConfigError:
    return ConfigError(f"run config field '{where}': {value!r} {why}")


def _positive_int(obj: Any, name: str, where: str) -> None:
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _bad(f"{where}.{name}", value, "must be a positive int")


def _number(obj: Any, name: str, where: str, low: float = 0.0, strict: bool = False) -> None:
    value = getattr(obj, name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if strict else value >= low)
    if not ok:
        raise _bad(f"{where}.{name}", value, f"must be a finite number {'>' if strict else '>='} {low}")
    setattr(obj, name, float(value))


@dataclass
class PretrainConfig:
    """Base model: slow weights trained through the fast-weight writes on the mixture of every
    domain's `pretrain` split (shuffled segments), AdamW with warm-up and cosine decay."""

    steps: int = 300
    batch_size: int = 8
    lr: float = 1.5e-3
    warmup_steps: int = 30
    min_lr_ratio: float = 0.1  # cosine decays to lr · min_lr_ratio at the last step
    weight_decay: float = 0.1
    grad_clip: float = 1.0  # max global norm of the dense gradients; 0 = off
    seed: int = 0  # initialisation and data order of the base model
    log_every: int = 5
    eval_every: int = 50  # steps between evaluations of the loss curve on the eval splits
    eval_segments: int = 4  # segments per domain in those evaluations (the final one uses all)
    checkpoint_every: int = 50

    def validate(self, where: str = "pretrain") -> None:
        for name in ("steps", "batch_size", "log_every", "eval_every", "eval_segments", "checkpoint_every"):
            _positive_int(self, name, where)
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise _bad(f"{where}.warmup_steps", self.warmup_steps, "must be an int >= 0")
        _number(self, "lr", where, strict=True)
        _number(self, "weight_decay", where)
        _number(self, "grad_clip", where)
        _number(self, "min_lr_ratio", where)
        if self.min_lr_ratio > 1:
            raise _bad(f"{where}.min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise _bad(f"{where}.seed", self.seed, "must be an int")


@dataclass
class CLConfig:
    """The continual-learning phase: one pass over each experience's `adapt` data, in order.

    mode 'fast' (the FwPKM paper's protocol): slow weights frozen, writes on, the memory carries
    over from domain to domain. mode 'finetune': slow weights trained too (AdamW, constant lr),
    fast weights active, memory carried over.
    """

    mode: Mode = "fast"
    eval_memory: str = "frozen"  # evaluation memory policy, a name in cl_platform.memory_policy.POLICIES
    batch_size: int = 8
    eval_batch_size: int = 16
    lr: float = 3e-4  # finetune only
    weight_decay: float = 0.0  # finetune only
    grad_clip: float = 1.0  # finetune only; 0 = off
    curve_every: int = 4  # steps between forgetting-curve evaluations (every domain)
    curve_segments: int = 2  # segments per domain in a forgetting-curve evaluation
    checkpoint_every: int = 10  # steps between resumable checkpoints (and one after every row)
    log_every: int = 1  # steps between training-loss / memory-statistics logs
    devices: int = 1  # > 1: Lightning DDP over CPU processes (gloo); finetune mode only

    def validate(self, where: str = "cl") -> None:
        if self.mode not in get_args(Mode):
            raise _bad(f"{where}.mode", self.mode, f"is not one of {list(get_args(Mode))}")
        if self.eval_memory not in POLICIES:
            raise _bad(f"{where}.eval_memory", self.eval_memory, f"is not one of {sorted(POLICIES)}")
        for name in ("batch_size", "eval_batch_size", "curve_every", "curve_segments", "checkpoint_every",
                     "log_every", "devices"):
            _positive_int(self, name, where)
        _number(self, "lr", where, strict=True)
        _number(self, "weight_decay", where)
        _number(self, "grad_clip", where)
        if self.devices > 1 and self.mode != "finetune":
            # Fast mode trains no slow weights, so there is nothing for data parallelism to
            # synchronise but the writes; one process streams the same data just as well.
            raise _bad(f"{where}.devices", self.devices, "> 1 needs cl.mode 'finetune'")


@dataclass
class StrategyConfig:
    name: str = "naive"
    kwargs: dict[str, Any] = field(default_factory=dict)

    def validate(self, where: str = "strategy") -> None:
        if not isinstance(self.name, str) or not self.name:
            raise _bad(f"{where}.name", self.name, "must be a non-empty string")
        if not isinstance(self.kwargs, dict):
            raise _bad(f"{where}.kwargs", self.kwargs, "must be a mapping of constructor arguments")


@dataclass
class RunConfig:
    stream: str = "streams/default.yaml"
    order: list[str] | None = None
    model: dict[str, Any] = field(default_factory=lambda: {"preset": "small"})
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    base_checkpoint: str | None = None
    cl: CLConfig = field(default_factory=CLConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    seed: int = 0
    name: str | None = None
    runs_root: str = "runs"

    def __post_init__(self) -> None:
        if not isinstance(self.stream, str) or not self.stream:
            raise _bad("stream", self.stream, "must be the path of a stream YAML")
        if self.order is not None and (
            not isinstance(self.order, list) or not self.order or not all(isinstance(d, str) for d in self.order)
        ):
            raise _bad("order", self.order, "must be a non-empty list of domain names, or null")
        if not isinstance(self.model, dict):
            raise _bad("model", self.model, "must be a mapping {preset: ..., <field>: value}")
        try:
            # The vocabulary comes from the tokenizer at run time; any valid size checks the rest.
            self.model_config(vocab_size=4096)
        except ConfigError:
            raise
        except (ValueError, TypeError) as err:
            raise ConfigError(f"run config field 'model': {err}") from None
        self.pretrain.validate()
        self.cl.validate()
        self.strategy.validate()
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise _bad("seed", self.seed, "must be an int")
        if self.base_checkpoint is not None and (not isinstance(self.base_checkpoint, str) or not self.base_checkpoint):
            raise _bad("base_checkpoint", self.base_checkpoint, "must be a path or null")
        if self.name is not None and (not isinstance(self.name, str) or not self.name or "/" in self.name):
            raise _bad("name", self.name, "must be a non-empty string without '/', or null")
        if not isinstance(self.runs_root, str) or not self.runs_root:
            raise _bad("runs_root", self.runs_root, "must be a path")

    def model_config(self, vocab_size: int) -> ModelConfig:
        """The model this run trains: the preset with the overrides, vocabulary from the tokenizer."""
        spec = dict(self.model)
        preset = spec.pop("preset", "small")
        if "vocab_size" in spec:
            raise _bad("model.vocab_size", spec["vocab_size"], "is set from the tokenizer; remove it")
        return ModelConfig.preset(preset, vocab_size=vocab_size, **spec)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> "RunConfig":
        return _build(cls, data, "")


def _build(cls: type, data: Any, where: str) -> Any:
    """Dataclass `cls` from a mapping: unknown keys are errors; nested dataclass fields recurse."""
    label = where or "<root>"
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"run config field '{label}': expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        prefix = f"{where}." if where else ""
        raise ConfigError(
            f"run config: unknown field(s) {[prefix + k for k in unknown]}; "
            f"allowed in '{label}': {sorted(known)}"
        )
    kwargs = {}
    for key, value in data.items():
        sub = f"{where}.{key}" if where else key
        kind = hints[key]
        if dataclasses.is_dataclass(kind):
            value = _build(kind, value, sub)
            value.validate(sub)
        kwargs[key] = value
    return cls(**kwargs)


def load_run_config(path: str | Path) -> tuple[RunConfig, Path]:
    """Read a run YAML; returns the config with `stream` (and `base_checkpoint`) made absolute,
    resolved against the YAML's folder, and the YAML's path."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"run config {path} does not exist")
    with open(path, encoding="utf-8") as f:
        try:
            data = yaml.safe_load(f)
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML ({err})") from None
    try:
        cfg = RunConfig.from_dict(data)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
    base = path.resolve().parent
    cfg.stream = str((base / Path(cfg.stream).expanduser()).resolve())
    if cfg.base_checkpoint is not None:
        cfg.base_checkpoint = str((base / Path(cfg.base_checkpoint).expanduser()).resolve())
    return cfg, path


def config_hash(identity: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of `identity` (sorted keys, no whitespace)."""
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def dict_diff(old: Any, new: Any, where: str = "") -> list[str]:
    """Human-readable differences between two JSON-like values, one line per leaf."""
    if isinstance(old, dict) and isinstance(new, dict):
        lines = []
        for key in sorted(set(old) | set(new), key=str):
            sub = f"{where}.{key}" if where else str(key)
            if key not in old:
                lines.append(f"{sub}: absent before, now {new[key]!r}")
            elif key not in new:
                lines.append(f"{sub}: was {old[key]!r}, now absent")
            else:
                lines += dict_diff(old[key], new[key], sub)
        return lines
    return [] if old == new else [f"{where or '<root>'}: was {old!r}, now {new!r}"]
