"""The run configuration: one typed tree, loaded by one loader, overridable by dotted paths.

    cfg = load_config("experiments/configs/default.yaml", ["cl.fwpkm.lr_values=0.3", "seed=1"])
    cfg.cl.mode                      # "fast"
    cfg.cl.fwpkm.lr_values           # 0.3: the continual phase's write rule
    cfg.pretrain.fwpkm.lr_values     # 1.0: the base model's (unchanged, so the base is reused)

Sections (every field has a default; a YAML file and the command line change only what they name):

    stream:          path of the stream YAML (from a YAML file: relative to that file's folder;
                     from the command line: relative to the working directory)
    order:           experience order (domain names, repeats allowed); null = the stream's own
    model:           the architecture (`cl_platform.model.ModelConfig`); `model.preset` chooses the
                     defaults the other model fields start from
    pretrain:        the base model's training (PretrainConfig), its write rule in `pretrain.fwpkm`
    base_checkpoint: a base model to start from instead of pretraining (null = pretrain, or reuse
                     the cached base built from exactly this architecture, pretraining and data);
                     the `pretrain` section must hold the settings it was trained with (checked,
                     experiments/base.py), and the path may name the seed through OmegaConf's
                     interpolation, `../bases/reference-s${pretrain.seed}/base.ckpt`, so that
                     `--base-seeds 0,1,2` reads one shipped base per seed
    cl:              the continual-learning phase (CLConfig); its write rule `cl.fwpkm` defaults to
                     `pretrain.fwpkm`, and `cl.fwpkm_by_layer.<layer>` (e.g. `fwpkm3`) to `cl.fwpkm`
    strategy:        {name: naive, kwargs: {}} (a name registered in `strategies.STRATEGIES`), or a
                     non-empty list of such mappings, composed in the given order (one
                     `CompositeStrategy`; the run's strategy name is the names joined by '+'):
                         strategy:
                           - {name: replay, kwargs: {size: 64, policy: balanced, ratio: 0.25}}
                           - {name: slot_freezing, kwargs: {fraction: 0.05}}
                     The mapping form is a list of one (`RunConfig.strategy` is always a list;
                     a list of one is saved as the mapping, so its identity is the same).
                     The same name may appear twice (two instances; a loss term both return is
                     refused when the run computes it). Dotted overrides (`strategy.name=replay`)
                     reach the mapping form only; a list is overridden whole, in YAML flow syntax:
                     `strategy=[{name: replay}, {name: naive}]`. Errors name the element, 0-based:
                     `strategy[1].name`.
    seed:            seed of the continual-learning phase (finetune randomness, strategies)
    name:            run name prefix (null = the config file's stem)
    runs_root:       where run folders go (relative to the working directory)

Merging, type conversion and the dotted-path syntax are OmegaConf's (structured configs): a
command-line value is parsed as YAML (`order=[math,law]`, `model.mixer=full`, `cl.fwpkm.lookahead=false`),
checked against the field's type, and an unknown key is an error naming it and the nearest valid
keys. Value constraints are each dataclass's own `__post_init__` checks (cl_platform/check.py),
reported at their dotted path: `run config field 'cl.mode': 'fastt' ...`.

The resolved tree (`to_yaml`) is what a run folder stores: loading it again gives the same tree,
and so the same run. Run and base identities are built from it in `experiments/setup.py`.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from cl_platform.check import ConfigError, check, is_int, is_number, read_yaml
from cl_platform.constants import PRECISIONS, Precision
from cl_platform.device import ACCELERATORS
from cl_platform.memory.fwpkm import WriteRule
from cl_platform.memory_policy import POLICIES
from cl_platform.model import PRESETS, ModelConfig
from cl_platform.results import Mode

__all__ = ["ConfigError", "PretrainConfig", "CLConfig", "StrategyConfig", "RunConfig", "load_config",
           "read_yaml", "to_yaml", "config_hash", "dict_diff"]


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
    fwpkm: WriteRule = field(default_factory=WriteRule)  # how the memory writes while the base trains
    # "bf16-mixed": slow-weight matmuls in bfloat16 under autocast (memory, parameters, losses stay
    # float32), 1.5x faster on CPUs with native bfloat16; part of the base key.
    precision: Precision = "32-true"
    log_every: int = 5
    eval_every: int = 50  # steps between evaluations of the loss curve on the eval splits
    eval_segments: int = 4  # segments per domain in those evaluations (the final one uses all)
    checkpoint_every: int = 50
    # Where it runs (cl_platform/device.py): auto = CUDA where torch sees a GPU, else the CPU.
    # devices × num_nodes > 1: data parallel (Lightning DDP), each rank reading batch_size / world
    # segments of every step, so a step sees the same batch_size segments as one process. None of
    # the three is part of the base key, like the thread count: the same settings elsewhere are the
    # same base up to float rounding (the provenance records the machine).
    accelerator: str = "auto"
    devices: int = 1
    num_nodes: int = 1

    # Fields that change when and how progress is reported, never the weights.
    REPORTING: typing.ClassVar[tuple[str, ...]] = ("log_every", "eval_every", "eval_segments", "checkpoint_every")
    PLACEMENT: typing.ClassVar[tuple[str, ...]] = ("accelerator", "devices", "num_nodes")

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "devices", "num_nodes", *self.REPORTING):
            check(is_int(getattr(self, name), 1), self, name, "must be a positive int")
        world = self.devices * self.num_nodes
        check(self.batch_size % world == 0, self, "batch_size",
              f"must be a multiple of devices × num_nodes = {world} (each rank reads an equal share of every step)")
        check(is_int(self.warmup_steps, 0), self, "warmup_steps", "must be an int >= 0")
        check(is_number(self.lr, 0.0, strict=True), self, "lr", "must be a finite number > 0")
        for name in ("weight_decay", "grad_clip"):
            check(is_number(getattr(self, name), 0.0), self, name, "must be a finite number >= 0")
        check(is_number(self.min_lr_ratio, 0.0) and self.min_lr_ratio <= 1, self, "min_lr_ratio", "must be in [0, 1]")
        check(is_int(self.seed), self, "seed", "must be an int")
        check(isinstance(self.fwpkm, WriteRule), self, "fwpkm", "must be a WriteRule")
        check(self.precision in PRECISIONS, self, "precision", f"is not one of {list(PRECISIONS)}")
        check(self.accelerator in ACCELERATORS, self, "accelerator", f"is not one of {list(ACCELERATORS)}")


# Used by the outer optimiser only: in 'fast' mode nothing reads them.
FINETUNE_ONLY = ("lr", "weight_decay", "grad_clip")
# What a finished run keeps of its checkpoints (CLConfig.keep_checkpoints, cl_platform/checkpoint.py).
KeepCheckpoints = typing.Literal["final", "all", "none"]


@dataclass
class CLConfig:
    """The continual-learning phase: one pass over each experience's `adapt` data, in order.

    mode 'fast' (the FwPKM paper's protocol): slow weights frozen, writes on, the memory carries
    over from domain to domain. mode 'finetune': slow weights trained too (AdamW, constant lr),
    fast weights active, memory carried over. The memory writes by `fwpkm` (per layer:
    `fwpkm_by_layer`), whatever the base was pretrained with.

    keep_checkpoints: what a finished run keeps in checkpoints/ — "final" (default) last.ckpt alone,
    "all" last.ckpt and prev.ckpt (as a running run keeps them), "none" nothing. A running, killed
    or preempted run always keeps both, so --resume is unaffected; not part of the run's identity.
    """

    mode: Mode = "fast"
    eval_memory: str = "frozen"  # evaluation memory policy, a name in cl_platform.memory_policy.POLICIES
    # The split every evaluation (rows, curves) reads: "eval" for results a table quotes, "dev"
    # (the stream's `token_budget.dev`) for choosing settings without ever looking at "eval".
    eval_split: typing.Literal["eval", "dev"] = "eval"
    fwpkm: WriteRule = field(default_factory=WriteRule)  # the loader defaults it to pretrain.fwpkm
    fwpkm_by_layer: dict[str, WriteRule] = field(default_factory=dict)  # {"fwpkm3": rule}: one layer's own
    precision: Precision = "32-true"  # of every forward in this phase (see PretrainConfig.precision)
    batch_size: int = 8
    eval_batch_size: int = 16
    lr: float = 3e-4  # finetune only
    weight_decay: float = 0.0  # finetune only
    grad_clip: float = 1.0  # finetune only; 0 = off
    curve_every: int = 4  # steps between forgetting-curve evaluations (every domain)
    curve_segments: int = 2  # segments per domain in a forgetting-curve evaluation
    checkpoint_every: int = 10  # steps between resumable checkpoints (and one after every row)
    log_every: int = 1  # steps between training-loss / memory-statistics logs
    # Where it runs (cl_platform/device.py). accelerator: auto = CUDA where torch sees a GPU, else
    # the CPU (not part of a run's identity, like the thread count). devices × num_nodes > 1:
    # Lightning DDP (gloo on CPU, NCCL on CUDA), finetune mode only; each rank streams its shard
    # of every batch_size-segment step, and the FwPKM writes are summed over the ranks.
    accelerator: str = "auto"
    devices: int = 1
    num_nodes: int = 1
    # Record what the slots hold and the gate per token into run_dir/inspect/ (bounded in size:
    # cl_platform/memory_recorder.py) for `clp report`; reads what the layers compute, changes nothing.
    inspect: bool = False
    # The checkpoints a finished run keeps in checkpoints/: "final" only the last one (last.ckpt:
    # model, fast weights, optimiser and strategy state at the end of the stream); "all" also the
    # one before it (prev.ckpt), the fallback a running run keeps; "none" neither (results.json,
    # run.json and TensorBoard stay; `clp compare` then cannot size the strategy's state). Until
    # the last row is measured a run keeps both, whatever this says: a kill loses no finished work
    # and --resume works as ever.
    keep_checkpoints: KeepCheckpoints = "final"

    # Fields that change when and how progress is reported and saved, never the results.
    REPORTING: typing.ClassVar[tuple[str, ...]] = ("checkpoint_every", "log_every", "inspect", "keep_checkpoints")

    def __post_init__(self) -> None:
        check(self.mode in typing.get_args(Mode), self, "mode", f"is not one of {list(typing.get_args(Mode))}")
        check(self.eval_memory in POLICIES, self, "eval_memory", f"is not one of {sorted(POLICIES)}")
        check(self.eval_split in ("eval", "dev"), self, "eval_split", "is not one of ['eval', 'dev']")
        check(self.precision in PRECISIONS, self, "precision", f"is not one of {list(PRECISIONS)}")
        for name in ("batch_size", "eval_batch_size", "curve_every", "curve_segments", "checkpoint_every",
                     "log_every", "devices", "num_nodes"):
            check(is_int(getattr(self, name), 1), self, name, "must be a positive int")
        check(self.accelerator in ACCELERATORS, self, "accelerator", f"is not one of {list(ACCELERATORS)}")
        check(is_number(self.lr, 0.0, strict=True), self, "lr", "must be a finite number > 0")
        for name in ("weight_decay", "grad_clip"):
            check(is_number(getattr(self, name), 0.0), self, name, "must be a finite number >= 0")
        check(isinstance(self.inspect, bool), self, "inspect", "must be true or false")
        check(self.keep_checkpoints in typing.get_args(KeepCheckpoints), self, "keep_checkpoints",
              f"is not one of {list(typing.get_args(KeepCheckpoints))}")
        check(isinstance(self.fwpkm, WriteRule), self, "fwpkm", "must be a WriteRule")
        check(isinstance(self.fwpkm_by_layer, dict) and all(isinstance(r, WriteRule) for r in self.fwpkm_by_layer.values()),
              self, "fwpkm_by_layer", "must map layer names (fwpkm<index>) to write rules")
        # Fast mode trains no slow weights, so there is nothing for data parallelism to
        # synchronise but the writes; one process streams the same data just as well.
        check(self.devices == 1 or self.mode == "finetune", self, "devices", "> 1 needs cl.mode 'finetune'")
        check(self.num_nodes == 1 or self.mode == "finetune", self, "num_nodes", "> 1 needs cl.mode 'finetune'")
        if self.mode == "fast":
            defaults = CLConfig.__dataclass_fields__
            for name in FINETUNE_ONLY:
                # A value nothing reads would still mint a new run: refuse it instead.
                check(getattr(self, name) == defaults[name].default, self, name,
                      "is used in finetune mode only (fast mode trains no slow weights); remove it")

    def write_rules(self, layer_names: Sequence[str]) -> dict[str, WriteRule]:
        """The rule every FwPKM layer writes by in this phase."""
        return {name: self.fwpkm_by_layer.get(name, self.fwpkm) for name in layer_names}


@dataclass
class StrategyConfig:
    """One strategy: a name in `strategies.STRATEGIES` and its constructor arguments.
    `RunConfig.strategy` is one of these or a list of them (composed in order)."""

    name: str = "naive"
    # Constructor arguments of the named strategy: checked against its signature when the run is
    # set up (experiments/setup.py), since only the strategies package knows them.
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check(isinstance(self.name, str) and bool(self.name), self, "name", "must be a non-empty string")
        check(isinstance(self.kwargs, dict), self, "kwargs", "must be a mapping of constructor arguments")


@dataclass
class RunConfig:
    stream: str = "streams/default.yaml"
    order: list[str] | None = None
    model: ModelConfig = field(default_factory=lambda: ModelConfig.from_preset("small"))
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    base_checkpoint: str | None = None
    cl: CLConfig = field(default_factory=CLConfig)
    # The strategies, composed in order (see the module docstring). The YAML's mapping form
    # `strategy: {name, kwargs}` is a list of one; `to_dict` writes a list of one back as that
    # mapping, so run identities made before lists existed are unchanged.
    strategy: list[StrategyConfig] = field(default_factory=lambda: [StrategyConfig()])
    seed: int = 0
    name: str | None = None
    runs_root: str = "runs"

    def __post_init__(self) -> None:
        check(isinstance(self.stream, str) and bool(self.stream), self, "stream", "must be the path of a stream YAML")
        check(self.order is None or (isinstance(self.order, list) and bool(self.order)
                                     and all(isinstance(d, str) for d in self.order)),
              self, "order", "must be a non-empty list of domain names, or null")
        check(self.model.vocab_size is None, self, "model", "vocab_size is set from the tokenizer; remove it")
        layers = [f"fwpkm{i}" for i in self.model.fwpkm_layers]
        unknown = sorted(set(self.cl.fwpkm_by_layer) - set(layers))
        if unknown:
            why = f"is not an FwPKM layer of this model; its FwPKM layers are {layers}"
            raise ConfigError(f"RunConfig.cl.fwpkm_by_layer: {unknown[0]!r} {why}", field=f"cl.fwpkm_by_layer.{unknown[0]}",
                              value=unknown[0], why=why)
        check(is_int(self.seed), self, "seed", "must be an int")
        check(self.base_checkpoint is None or (isinstance(self.base_checkpoint, str) and bool(self.base_checkpoint)),
              self, "base_checkpoint", "must be a path or null")
        check(self.name is None or (isinstance(self.name, str) and bool(self.name) and "/" not in self.name),
              self, "name", "must be a non-empty string without '/', or null")
        check(isinstance(self.runs_root, str) and bool(self.runs_root), self, "runs_root", "must be a path")
        if isinstance(self.strategy, StrategyConfig):
            self.strategy = [self.strategy]  # the one place the single form becomes the list
        check(isinstance(self.strategy, list) and bool(self.strategy)
              and all(isinstance(s, StrategyConfig) for s in self.strategy),
              self, "strategy", "must be a non-empty list of StrategyConfig")

    @property
    def strategy_fields(self) -> list[tuple[str, StrategyConfig]]:
        """(field path, member) in order: `strategy` for a single strategy, `strategy[i]` for a
        composed list, as errors, TensorBoard's hparams and the YAML name them."""
        if len(self.strategy) == 1:
            return [("strategy", self.strategy[0])]
        return [(f"strategy[{i}]", s) for i, s in enumerate(self.strategy)]

    @property
    def strategy_name(self) -> str:
        """The run's strategy name in results and printouts: the members' names joined by '+'."""
        return "+".join(s.name for s in self.strategy)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if len(self.strategy) == 1:
            data["strategy"] = data["strategy"][0]  # the mapping form: identities as before lists existed
        return data


# --- loading --------------------------------------------------------------------------------------
def load_config(path: str | Path, overrides: Sequence[str] = (),
                pretrain_defaults: dict[str, Any] | None = None) -> RunConfig:
    """Read a run YAML, apply dotted `key=value` overrides, resolve defaults and paths, validate.

    Errors name the file (or the override) and the field; `stream` and `base_checkpoint` come
    back absolute. `pretrain_defaults`: `pretrain` fields that replace the built-in defaults (a
    named base's settings, experiments/base_record.py); the file and the command line still
    override them, and the run's checks refuse what then contradicts the base.
    """
    from omegaconf import OmegaConf

    path = Path(path)
    raw = read_yaml(path, "run config")
    try:
        cli = OmegaConf.from_dotlist([str(o) for o in overrides])
    except Exception as err:  # OmegaConf raises its own grammar errors
        raise ConfigError(f"command-line override: {_first_line(err)} (expected key=value, e.g. seed=1)") from None
    bad = [o for o in overrides if "=" not in str(o)]
    if bad:
        raise ConfigError(f"command-line override {bad[0]!r}: expected key=value, e.g. cl.fwpkm.lr_values=0.3")
    try:
        return _resolve(raw, cli, path, pretrain_defaults or {})
    except ConfigError as err:
        where = "command line" if _names_override(err, cli) else str(path)
        raise ConfigError(f"{where}: {err}", field=err.field) from None


def _resolve(raw: dict[str, Any], cli: Any, path: Path, pretrain_defaults: dict[str, Any]) -> RunConfig:
    from omegaconf import OmegaConf

    if OmegaConf.is_list(cli.get("strategy")) and "strategy" in raw:
        raw = {k: v for k, v in raw.items() if k != "strategy"}  # a list on the command line replaces the file's
    elif isinstance(raw.get("strategy"), list) and cli.get("strategy") is not None:
        if not OmegaConf.is_list(cli.strategy):
            raise ConfigError("run config field 'strategy': the file gives a list of strategies; "
                              "override it whole, e.g. 'strategy=[{name: replay}, {name: naive}]'", field="strategy")
    user = OmegaConf.merge(OmegaConf.create(raw), cli)  # untyped layering: file, then command line
    # The strategies are checked member by member, apart from the typed tree.
    members = _strategy_members(user)
    model = user.get("model")
    preset = model.get("preset", "small") if model is not None and OmegaConf.is_dict(model) else "small"
    if preset not in PRESETS:
        raise ConfigError(f"run config field 'model.preset': {preset!r} is not one of {sorted(PRESETS)}",
                          field="model.preset")
    schema = OmegaConf.structured(RunConfig(model=ModelConfig.from_preset(preset)))
    if pretrain_defaults:
        schema.pretrain = _typed_merge(schema.pretrain, pretrain_defaults, prefix="pretrain")
    merged = _typed_merge(schema, user)
    # Write-rule defaults follow the tree: cl.fwpkm starts from pretrain.fwpkm, and each
    # cl.fwpkm_by_layer entry from cl.fwpkm, so an override names only what it changes.
    schema.cl.fwpkm = merged.pretrain.fwpkm
    merged = _typed_merge(schema, user)
    schema.cl.fwpkm_by_layer = {name: merged.cl.fwpkm for name in merged.cl.fwpkm_by_layer}
    merged = _typed_merge(schema, user)
    cfg = _build(RunConfig, merged, "")
    if members is not None:
        cfg = dataclasses.replace(cfg, strategy=members)  # else the default, [naive]
    # Paths in the YAML file are relative to its folder; paths on the command line to the working directory.
    for key in ("stream", "base_checkpoint"):
        value = getattr(cfg, key)
        if value is not None:
            base = Path.cwd() if OmegaConf.select(cli, key) is not None else path.resolve().parent
            setattr(cfg, key, str((base / Path(value).expanduser()).resolve()))
    return cfg


def _strategy_members(user: Any) -> list[StrategyConfig] | None:
    """`strategy` as its list of members, each checked and built, and removed from `user`; None
    when the config names none. Errors: `strategy.name` for the mapping form, `strategy[i].name`
    for a list."""
    from omegaconf import OmegaConf

    if "strategy" not in user:
        return None
    node = user.get("strategy")
    del user["strategy"]
    if OmegaConf.is_dict(node):
        merged = _typed_merge(OmegaConf.structured(StrategyConfig), node, prefix="strategy")
        return [_build(StrategyConfig, merged, "strategy")]
    if not OmegaConf.is_list(node):
        value = OmegaConf.to_container(node) if OmegaConf.is_config(node) else node
        why = "must be a mapping {name, kwargs} or a non-empty list of them"
        raise ConfigError(f"run config field 'strategy': {value!r} {why}", field="strategy", value=value, why=why)
    if len(node) == 0:
        why = "must be a mapping {name, kwargs} or a non-empty list of them"
        raise ConfigError(f"run config field 'strategy': [] {why}", field="strategy", value=[], why=why)
    members = []
    for i, item in enumerate(node):
        where = f"strategy[{i}]"
        if not OmegaConf.is_dict(item):
            value = OmegaConf.to_container(item) if OmegaConf.is_config(item) else item
            raise ConfigError(f"run config field '{where}': {value!r} must be a mapping {{name, kwargs}}", field=where)
        merged = _typed_merge(OmegaConf.structured(StrategyConfig), item, prefix=where)
        members.append(_build(StrategyConfig, merged, where))
    return members


def _typed_merge(schema: Any, user: Any, prefix: str = "") -> Any:
    """`user` merged into the typed `schema`; errors name the dotted path, under `prefix`."""
    from omegaconf import OmegaConf
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

    def at(key: str) -> str:
        return ".".join(p for p in (prefix, key) if p)

    try:
        return OmegaConf.merge(schema, user)
    except ConfigKeyError as err:
        key = err.full_key or str(err.key)
        parent = key.rsplit(".", 1)[0] if "." in key else ""
        valid = _keys_at(schema, parent)
        near = difflib.get_close_matches(str(err.key), valid, n=3, cutoff=0.5)
        hint = f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""
        raise ConfigError(f"run config: unknown field '{at(key)}'{hint} Valid fields of "
                          f"'{at(parent) or '<root>'}': {valid}", field=at(key)) from None
    except ValidationError as err:
        where = at(err.full_key) or "<root>"
        if OmegaConf.is_list(err.child_node) and not isinstance(err.value, (list, tuple)):
            # `order=a,b` reaches a list field as the string 'a,b': a list is written in brackets.
            raise ConfigError(f"run config field '{where}': expects a list, got {err.value!r}; write a list in "
                              f"brackets: {where}=[{err.value}] on the command line, [{err.value}] in a YAML file",
                              field=where) from None
        raise ConfigError(f"run config field '{where}': {_first_line(err)}", field=where) from None
    except OmegaConfBaseException as err:
        full_key = getattr(err, "full_key", None)
        raise ConfigError(f"run config: {_first_line(err)}", field=at(full_key) if full_key else (prefix or None)) from None


def _keys_at(schema: Any, dotted: str) -> list[str]:
    from omegaconf import OmegaConf

    node = OmegaConf.select(schema, dotted) if dotted else schema
    return sorted(str(k) for k in node.keys()) if OmegaConf.is_dict(node) else []


def _build(cls: type, node: Any, where: str) -> Any:
    """Dataclass `cls` from a merged node, children first; a failed check is re-raised at its path."""
    from omegaconf import OmegaConf

    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        value, kind = node[f.name], hints[f.name]
        sub = f"{where}.{f.name}" if where else f.name
        origin, args = typing.get_origin(kind), typing.get_args(kind)
        item = args[-1] if origin in (dict, list) else None
        if dataclasses.is_dataclass(kind):
            kwargs[f.name] = _build(kind, value, sub)
        elif origin is dict and dataclasses.is_dataclass(item):
            kwargs[f.name] = {str(k): _build(item, v, f"{sub}.{k}") for k, v in value.items()}
        elif origin is list and dataclasses.is_dataclass(item):
            kwargs[f.name] = [_build(item, v, f"{sub}[{i}]") for i, v in enumerate(value)]
        else:
            kwargs[f.name] = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    try:
        return cls(**kwargs)
    except ConfigError as err:
        raise err.at(where) from None


def _names_override(err: ConfigError, cli: Any) -> bool:
    from omegaconf import OmegaConf

    return bool(err.field) and OmegaConf.select(cli, err.field, default=None) is not None


def _first_line(err: BaseException) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def to_yaml(cfg: RunConfig) -> str:
    """The resolved tree as YAML; `load_config` on it gives `cfg` back."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


# --- identity ---------------------------------------------------------------------------------------
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
