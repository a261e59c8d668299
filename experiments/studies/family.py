"""The baseline family: one run config of the bases (`base`) and its variants, which differ only in
where the memories sit, how wide the MLPs are and, for a pretraining-data knob such as the
retrieval episodes, which stream they pretrain on (`variants`: name -> {fwpkm_layers, pkm_layers,
mlp_ratio, mixer, conv_kernel, stream}), each an ordinary cached base per pretraining seed. The long-context study
(`clp eval`) scores the family; the needle study (`clp niah`) fine-tunes and reads it. A family
file is a long-context config: its `base`, `variants` and `runs_root` fields are the family, the
rest is the long-context study's.

    family = load_family("experiments/configs/longctx.yaml")
    setup = family.setup("fwpkm", seed=0)        # experiments.setup.Setup of that variant's base
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from cl_platform.check import ConfigError, check, read_yaml
from experiments.config_files import relative_to
from experiments.studies.study import Study

# What a variant may change: where the memories sit, and the MLP width (an attention-only twin at
# the FwPKM model's active parameters widens its MLPs instead of holding a memory); the token
# mixer (`mixer: full`, the full-attention twin trained with pSWA) and its short causal
# convolution (`conv_kernel`); and the stream it pretrains on, relative to the base run config's
# folder as that file's own `stream` is (a stream with the same eval splits and another
# pretraining mix, e.g. the retrieval knob).
VARIANT_FIELDS = ("fwpkm_layers", "pkm_layers", "mlp_ratio", "mixer", "conv_kernel", "stream")


def check_variants(owner: Any, variants: Any) -> None:
    """`variants` must map names to changes of VARIANT_FIELDS only (errors name `owner`'s field)."""
    check(isinstance(variants, dict) and bool(variants), owner, "variants",
          "must map variant names to the fields they change")
    for name, change in variants.items():
        bad = [k for k in (change or {}) if k not in VARIANT_FIELDS]
        check(isinstance(change, dict) and not bad, owner, "variants",
              f"variant {name!r} changes {bad or change!r}; a variant may set only {list(VARIANT_FIELDS)}")
        stream = change.get("stream") if isinstance(change, dict) else None
        check(stream is None or (isinstance(stream, str) and bool(stream)), owner, "variants",
              f"variant {name!r}: stream must be the path of a stream YAML, got {stream!r}")


@dataclass
class Family:
    base: str                          # the bases' run config (a path)
    variants: dict[str, dict[str, Any]]
    runs_root: str | None = None       # default: the base run config's runs_root

    def __post_init__(self) -> None:
        check_variants(self, self.variants)

    def overrides(self, variant: str, seed: int) -> list[str]:
        """The dotted overrides that make variant `variant`'s base of pretraining seed `seed`."""
        change = dict(self.variants[variant] or {})
        out = []
        if "stream" in change:  # a command-line path is read from the working directory: make it absolute
            out.append(f"stream={(Path(self.base).resolve().parent / change.pop('stream')).resolve()}")
        out += [f"model.{k}={json.dumps(v)}" for k, v in change.items()] + [f"pretrain.seed={seed}"]
        if self.runs_root is not None:
            out.append(f"runs_root={self.runs_root}")
        return out

    def setup(self, variant: str, seed: int, who: str = "family"):
        """The variant's `experiments.setup.Setup` (its config checked; nothing pretrained);
        errors start with `who` (the study asking)."""
        from experiments.setup import load_setup

        try:
            return load_setup(self.base, self.overrides(variant, seed))
        except ConfigError as err:
            raise ConfigError(f"{who} variant {variant!r}: {err}") from None

    def resolved_runs_root(self) -> str:
        from cl_platform.config import load_config

        return self.runs_root or load_config(self.base).runs_root

    def identity(self) -> dict[str, Any]:
        """What determines the family's bases: the base run config's settings (its parsed YAML, so
        a comment changes nothing; a cached member is reused only for the same base key anyway)
        and the variants."""
        return {"base": read_yaml(self.base, "run config"), "variants": self.variants}


def reading_model(setup, weights: dict):
    """A family base's model, set up for scoring: its weights, eval mode, the pretraining write rule
    with a memory that persists between calls (a study restores it itself). Returns (model, the
    base's memory snapshot, the autocast context of the base's pretraining precision)."""
    import dataclasses

    import torch

    from experiments.setup import build_model

    cfg = setup.config
    model = build_model(setup.model_config, 0, dataclasses.replace(cfg.pretrain.fwpkm, persistence="persist"))
    model.load_state_dict(weights)
    model.eval()
    autocast = torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=cfg.pretrain.precision == "bf16-mixed")
    return model, model.snapshot_memory(), autocast


def load_family(path: str | Path) -> Family:
    """The family part of a family (long-context) config file; `base` relative to the file."""
    data = read_yaml(path, "family config")
    if "base" not in data:
        raise ConfigError(f"family config {path}: field 'base' is required (the bases' run config)", field="base")
    try:
        family = Family(base=relative_to(path, str(data["base"])), variants=data.get("variants"),
                        runs_root=data.get("runs_root"))
    except ConfigError as err:
        raise ConfigError(f"family config {path}: {err}", field=err.field) from None
    if not Path(family.base).is_file():
        raise ConfigError(f"family config {path}: field 'base': run config {family.base} does not exist", field="base")
    return family


class FamilyStudy(Study):
    """A study that scores the family's bases (`clp eval`, `clp repeat`): members every (variant,
    base seed), `setups[(variant, seed)]` filled by the subclass's `prepare`; a cached member is
    reused only for the same base (a rebuilt or changed base is scored again)."""

    setups: dict[tuple[str, int], Any]

    def members(self) -> list[tuple[str, int]]:
        return [(v, s) for v in self.exp.variants for s in self.exp.seeds]

    def fresh(self, name: str, seed: int, result: dict[str, Any]) -> bool:
        from experiments.setup import base_key

        return result.get("base_key") == base_key(self.setups[(name, seed)])

    def base(self, name: str, seed: int, say: Callable[[str], None]) -> tuple[Any, dict, dict, dict[str, Any]]:
        """(setup, the base's record, its weights, the member's first fields) of the member's base,
        cached or pretrained now."""
        from experiments.base import resolve_base
        from experiments.setup import base_key

        setup = self.setups[(name, seed)]
        base = resolve_base(setup, say, progress_bar=False)
        return setup, base.record, base.weights, {"variant": name, "seed": seed, "base": str(base.path),
                                                  "base_key": base_key(setup)}

