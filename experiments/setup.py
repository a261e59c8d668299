"""From a run config to what a run needs: the stream, the model, the strategy and the identities.

    setup = load_setup("experiments/configs/default.yaml", ["cl.fwpkm.lr_values=0.3"])
    setup.model_config                 # the architecture, vocabulary from the stream's tokenizer
    key = base_key(setup)              # names the cached base model (runs/pretrain-<key[:12]>)
    fields = run_identity(setup, {"source": "pretrain", "key": key})   # hashed into the run folder

Two identities, each covering exactly what changes its result:
- the **base key**: the architecture, the pretraining settings that affect the weights (the
  pretraining write rule included), the pretraining tokens of the domains that have any (in name
  order, as the mixture is built), and the tokenizer. Not the continual phase, not domains without
  pretraining tokens, not the order a stream file lists its domains.
- the **run identity**: the resolved config without the fields that say where things are or how
  progress is reported, with the base key standing for the pretraining section, the write rule
  every FwPKM layer uses in the continual phase, and fingerprints of the data the phase reads.
  Fields that cannot affect a run in its mode are refused by the config (`cl.lr` in fast mode).
Neither covers the accelerator (like the thread count, it moves results by float rounding only;
the provenance records the machine), so a run started on a GPU can be resumed on a CPU.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from cl_platform.check import ConfigError, check_writable
from cl_platform.checkpoint import model_config_dict
from cl_platform.config import FINETUNE_ONLY, CLConfig, PretrainConfig, RunConfig, config_hash, load_config
from cl_platform.device import check_placement
from cl_platform.memory.fwpkm import WriteRule
from cl_platform.model import FwPKMLM, ModelConfig

# Fields that say where things are, not what is computed (the order is in the data fingerprint).
WHERE_FIELDS = ("stream", "base_checkpoint", "name", "runs_root", "order")


@dataclass
class Setup:
    """A run config with its stream loaded and its architecture resolved."""

    config: RunConfig
    config_path: Path
    scenario: Any
    model_config: ModelConfig | None = None  # None: the config's, with the vocabulary of the stream's tokenizer
    base_record: Any = None  # experiments.base_record.BaseRecord of the base the config names, if any

    def __post_init__(self):
        if self.model_config is None:
            self.model_config = dataclasses.replace(self.config.model, vocab_size=self.scenario.tokenizer.vocab_size)

    @property
    def layer_names(self) -> list[str]:
        return [f"fwpkm{i}" for i in self.model_config.fwpkm_layers]


def load_setup(config_path: str | Path, overrides: Sequence[str] = ()) -> Setup:
    """Read the run config (with dotted overrides) and build its stream; errors name file and field."""
    from streams import build_stream, load_stream_config

    from experiments.base_record import fit_stream

    path = Path(config_path)
    cfg, base = load_run_config(path, overrides)
    # Where the phases run and write, before any data is built or read: a GPU this machine lacks,
    # a multi-node launch without its launcher, a runs root that takes no files: named here,
    # with nothing written.
    try:
        check_placement(cfg.pretrain, "pretrain")
        check_placement(cfg.cl, "cl")
        check_writable(cfg.runs_root, "runs_root")  # several nodes or sweep workers: a shared mount
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from None
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
    try:
        stream_cfg = fit_stream(stream_cfg, base, cfg.stream)
    except ConfigError as err:
        raise ConfigError(f"{path}: run config field 'stream': {err}", field="stream") from None
    scenario = build_stream(stream_cfg)
    if cfg.cl.eval_split != "eval":
        missing = [name for name, d in scenario.domains.items() if not d.splits[cfg.cl.eval_split].n_docs]
        if missing:
            raise ConfigError(f"{path}: run config field 'cl.eval_split': {cfg.cl.eval_split!r} but domain(s) "
                              f"{missing} have none; set token_budget.{cfg.cl.eval_split} in {cfg.stream}")
    return Setup(cfg, path, scenario, base_record=base)


def load_run_config(path: str | Path, overrides: Sequence[str] = ()) -> tuple[RunConfig, Any]:
    """The run config, with the `pretrain:` section of the base it names (if any) under the file's
    and the command line's values, and that base's record (experiments/base_record.BaseRecord,
    or None when the config names no base). Reads no stream."""
    from cl_platform.base_file import contradictions
    from experiments.base_record import read_base

    path = Path(path)
    cfg = load_config(path, overrides)
    if cfg.base_checkpoint is None:
        return cfg, None
    # A named base brings its pretraining settings; its tokenizer and segment length are applied
    # to the stream by load_setup. A field the file or the command line sets that contradicts the
    # base is refused here, naming the field, before any data is read (and again, against the
    # checkpoint's own record, when the base is loaded: experiments/base.py).
    try:
        base = read_base(cfg.base_checkpoint)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}", field=err.field) from None
    cfg = load_config(path, overrides, pretrain_defaults=base.settings)
    differ = contradictions(base.settings, cfg.pretrain)
    if differ:
        raise ConfigError(f"{path}: the base {base.path} was pretrained with other settings than this run's pretrain "
                          f"section: {'; '.join(differ)}. Remove these fields (a named base brings its own), or "
                          f"name the base of these settings in base_checkpoint", field="pretrain")
    return dataclasses.replace(cfg, base_checkpoint=str(base.path)), base


def build_model(model_config: ModelConfig, seed: int, rule: WriteRule | None = None) -> FwPKMLM:
    """The model with slow weights and fast state initialised from `seed`."""
    torch.manual_seed(seed)
    return FwPKMLM(model_config, rule)


def make_strategy(setup: Setup):
    """The configured strategy object; an unknown name, bad arguments, or a model, mode or stream
    it cannot run with name the field, before any pretraining.

    A list of strategies (`strategy: [{name, kwargs}, ...]`) gives one `CompositeStrategy` of
    its members in order; errors name the element (`strategy[1].name`)."""
    from cl_platform.strategy import CompositeStrategy
    from strategies import STRATEGIES, get_strategy

    where_from, mode = setup.config_path, setup.config.cl.mode
    members = []
    for where, spec in setup.config.strategy_fields:
        if spec.name not in STRATEGIES:
            raise ConfigError(f"{where_from}: run config field '{where}.name': unknown strategy {spec.name!r}; "
                              f"allowed: {', '.join(sorted(STRATEGIES))}")
        try:
            member = get_strategy(spec.name, **spec.kwargs)
        except (TypeError, ValueError) as err:  # constructor arguments that do not fit, or values it refuses
            raise ConfigError(f"{where_from}: run config field '{where}.kwargs' {spec.kwargs!r}: {err}") from None
        try:
            member.check(setup.model_config, mode, setup.scenario)
        except ValueError as err:
            raise ConfigError(f"{where_from}: run config field '{where}' (with cl.mode {mode!r}): {err}") from None
        members.append(member)
    # One strategy runs as itself (its checkpoint state is its own, as before lists existed).
    try:
        strategy = members[0] if len(members) == 1 else CompositeStrategy(members)
    except ValueError as err:
        raise ConfigError(f"{where_from}: run config field 'strategy': {err}") from None
    if strategy.routes_eval_memory and setup.config.cl.eval_memory == "reset":
        raise ConfigError(f"{where_from}: run config field 'cl.eval_memory': 'reset' re-draws the memory "
                          f"that the strategy's routing would replace; use 'frozen' or 'stream'")
    return strategy


# --- the base model's identity ----------------------------------------------------------------------
def pretrain_fingerprint(scenario) -> str:
    """sha256 of the packed pretraining tokens of every domain that has any, in name order."""
    h = hashlib.sha256()
    for name in sorted(scenario.domains):
        split = scenario.domains[name].splits["pretrain"]
        if not split.n_docs:
            continue  # contributes nothing to the mixture, so nothing to the key
        h.update(name.encode("utf-8") + b"\0")
        h.update(split.segments.tokens.numpy().tobytes())
    return h.hexdigest()


def base_key(setup: Setup) -> str:
    settings = dataclasses.asdict(setup.config.pretrain)
    for name in PretrainConfig.REPORTING + PretrainConfig.PLACEMENT:
        settings.pop(name)
    return config_hash({
        "model": model_config_dict(setup.model_config),
        "pretrain": settings,
        "data": pretrain_fingerprint(setup.scenario),
        "tokenizer": setup.scenario.tokenizer.fingerprint,
    })


# --- the run's identity --------------------------------------------------------------------------------
def stream_fingerprint(scenario, eval_split: str = "eval") -> str:
    """sha256 of what the continual phase reads: each experience's adapt tokens, and every
    domain's split that evaluations read (`eval_split`)."""
    h = hashlib.sha256()
    for exp in scenario:
        h.update(f"adapt:{exp.domain}\0".encode("utf-8"))
        h.update(exp.data.segments.tokens.numpy().tobytes())
    for name in scenario.eval_domains:
        tag = "eval" if eval_split == "eval" else f"eval[{eval_split}]"  # the default hashes as before
        h.update(f"{tag}:{name}\0".encode("utf-8"))
        h.update(scenario.domains[name].splits[eval_split].segments.tokens.numpy().tobytes())
    return h.hexdigest()


def run_identity(setup: Setup, base: dict[str, str]) -> dict[str, Any]:
    """Everything the results depend on, and nothing about where files are or how progress is shown."""
    scenario, names = setup.scenario, setup.layer_names
    data = {
        "experiences": [exp.domain for exp in scenario],
        "eval_domains": list(scenario.eval_domains),
        "seq_len": scenario.config.seq_len,
        "stream": stream_fingerprint(scenario, setup.config.cl.eval_split),
        "tokenizer": scenario.tokenizer.fingerprint,
    }
    cfg = setup.config.to_dict()
    for name in WHERE_FIELDS:
        cfg.pop(name)
    cfg.pop("pretrain")  # the base key (or the given checkpoint's) stands for it
    cfg.pop("model")  # the resolved architecture below has the vocabulary too
    cl = cfg["cl"]
    for name in CLConfig.REPORTING + ("fwpkm", "fwpkm_by_layer", "accelerator"):
        cl.pop(name)
    # The world size changes a finetune run (each rank streams its own shard); one node hashes as
    # the runs made before `num_nodes` existed.
    if cl["num_nodes"] == 1:
        cl.pop("num_nodes")
    if setup.config.cl.mode == "fast":
        for name in FINETUNE_ONLY:
            cl.pop(name)
    rules = setup.config.cl.write_rules(names)
    return {
        "config": cfg,
        "model": model_config_dict(setup.model_config),
        "write_rules": {name: dataclasses.asdict(rule) for name, rule in rules.items()},
        "data": data,
        "base": base,
    }
