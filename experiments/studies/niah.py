"""Needle in a haystack with n-iter reading (issue 8; the FwPKM paper's protocol) on the baseline
family's language-model bases, zero-shot and after a brief fine-tune on needle episodes.

    clp niah experiments/configs/niah.yaml                # the bases come from the family config (clp eval)
    clp niah experiments/configs/niah.yaml --seeds 0,1,2  # fine-tuning seeds
    clp niah experiments/configs/niah.yaml --models fwpkm,fwpkm-no-lookahead   # a subset (results are shared)
    clp niah experiments/configs/niah.yaml --base-seeds 0,1,2   # every base seed, t-intervals over the bases
    clp niah experiments/configs/niah.yaml reference=fwpkm      # every other model minus this one, paired

An episode (`streams/needles.py`: any needle sentence, ID alphabet and number length): a window of
real text (the haystack domain's split, or any file) with 5 needles "The secret number for ID-xxxx
is dddddd.", then a question about one; exact match of the number's tokens, teacher forced (every
answer token the argmax given the gold ones before it: exactly when greedy decoding reproduces the
number). The readings (n-iter: n reads, n − 1 whole-context writes; in-pass: the ordinary mode),
the memory between episodes (reset, or carried over as the official evaluation does) and the
fine-tune are `needle_reading.py`; where the question reads against where each needle wrote,
`analysis.memory_inspect.addresses`. Fine-tuning (`finetune: true`) trains the slow weights on
episodes of the haystack domain's `pretrain` split, each with a memory of its own, as in evaluation
(before 2026-12-06 they shared one: LOG stop 43; `FINETUNE_MEMORY`). Results:
`<runs_root>/niah-<key>/`, one JSON per (model, seed), reused by later runs.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from analysis.intervals import interval_text, mean_and_std, mean_std, over_bases_text, paired_bootstrap, wilson
from analysis.memory_inspect import address_summary, address_text
from cl_platform.check import ConfigError, check, is_int, is_number
from experiments.config_files import relative_to
from experiments.studies.needle_reading import (by_flag, episode_facts, finetune, name_guess, read_episodes,
                                                split_tokens, token_accuracy)
from experiments.studies.family import Family, load_family
from experiments.studies.study import Study, check_seeds, each_base, load_study, publish, row, study_folder

MODEL_KEYS = ("variant", "finetune", "rule", "model", "writes", "patch")
# `writes: [3]`: only these FwPKM layers write while a zero-shot model reads (a per-layer ablation);
# `patch: true`: its questions read with the asked needle's queries (the causal test of the address). `model:` may change how far attention reaches, nothing with parameters, so
# the variant's base loads as it is: `model: {window: 4096}` on the FwPKM base is the positive
# control (issue 22), which must retrieve for a memory's null result to mean the memory.
REACH_FIELDS = ("mixer", "window", "pswa_prob")
# How a fine-tuned model's training episodes hold memory (module doc); a fine-tuned result made
# otherwise is not reused.
FINETUNE_MEMORY = "per-episode"


@dataclass
class NeedleExperiment:
    family: str = "longctx.yaml"  # the baseline family config (experiments/studies/longctx.py), relative to this file
    models: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {variant, finetune, rule}
    needles: dict[str, Any] = field(default_factory=dict)  # streams.needles.NeedleConfig fields
    haystack_domain: str = "web"  # where haystacks (and fine-tuning episodes, from its pretrain split) come from
    haystack_source: str | None = None  # or any text: a file, glob or corpus:NAME, as a stream domain's source
    split: str = "eval"  # "dev" to choose settings on: the domain's dev split, or the source's first half
    memory: str = "reset"  # per episode from the model's own memory, or "persist": carried over, order shuffled per seed
    iterations: list[int] = field(default_factory=lambda: [1, 2, 3])
    episodes: int = 100  # evaluation episodes, the asked needle cycling through every depth
    finetune_steps: int = 300
    finetune_batch_size: int = 2
    finetune_lr: float = 1e-3
    base_seed: int = 0  # which of the family's bases
    seeds: list[int] = field(default_factory=lambda: [0])  # fine-tuning seeds (zero-shot models: the first only)
    # Compared with every other model episode by episode (`reference=NAME`): paired bootstrap over the
    # episodes (over base seeds: the t-interval of the bases' differences). Printing only: not in the key.
    reference: str | None = None
    runs_root: str | None = None

    def __post_init__(self) -> None:
        from cl_platform.memory.fwpkm import WriteRule
        from streams.needles import NeedleConfig

        try:
            self.needle_config = NeedleConfig(**self.needles)
        except TypeError as err:
            raise ConfigError(f"needle config field 'needles': {err}") from None
        check(isinstance(self.models, dict) and bool(self.models), self, "models",
              "must map model names to {variant, finetune, rule}")
        for name, spec in self.models.items():
            bad = [k for k in (spec or {}) if k not in MODEL_KEYS]
            check(isinstance(spec, dict) and not bad and "variant" in spec, self, "models",
                  f"model {name!r}: needs 'variant' and may set only {list(MODEL_KEYS)} (got {bad or spec!r})")
            reach, writes = spec.get("model") or {}, spec.get("writes")
            for ok, why in (
                    (isinstance(spec.get("finetune", False), bool), "finetune must be true or false"),
                    (isinstance(reach, dict) and set(reach) <= set(REACH_FIELDS),
                     f"'model' may change only {list(REACH_FIELDS)} of the variant's architecture (got {reach!r})"),
                    (writes is None or (isinstance(writes, list) and all(is_int(i) for i in writes)
                                        and len(set(writes)) == len(writes)),
                     f"writes must be a list of distinct FwPKM layer indices (got {writes!r})"),
                    (writes is None or not spec.get("finetune"), "writes applies to zero-shot models (finetune: false)"),
                    (isinstance(spec.get("patch", False), bool), "patch must be true or false")):
                check(ok, self, "models", f"model {name!r}: {why}")
            try:
                WriteRule(**(spec.get("rule") or {}))
            except (TypeError, ConfigError) as err:
                raise ConfigError(f"needle config field 'models.{name}.rule': {err}") from None
        check(self.split in ("dev", "eval"), self, "split", "must be 'dev' or 'eval'")
        check(self.memory in ("reset", "persist"), self, "memory", "must be 'reset' or 'persist'")
        check(bool(self.iterations) and all(is_int(n, 1) for n in self.iterations), self, "iterations",
              "must be a list of ints >= 1 (reads of the haystack)")
        for name in ("episodes", "finetune_steps", "finetune_batch_size"):
            check(is_int(getattr(self, name), 1), self, name, "must be a positive int")
        check(is_number(self.finetune_lr, 0, strict=True), self, "finetune_lr", "must be a number > 0")
        check_seeds(self)
        check(self.reference is None or self.reference in self.models, self, "reference",
              f"{self.reference!r} is not among the models ({list(self.models)}; with --models, name it there too)")

    @property
    def settings(self) -> list[str]:
        """The readings, in table order: n-iter for each n, then in-pass."""
        return [f"{n}-iter" for n in self.iterations] + ["in-pass"]


def load(path: str | Path, seeds: list[int] | None = None, models: list[str] | None = None,
         overrides: Sequence[str] = ()) -> NeedleExperiment:
    """The experiment in a YAML file with `key=value` overrides; `seeds` replaces the file's;
    `models` keeps only those."""
    exp = load_study(NeedleExperiment, path, "needle config", overrides, seeds, subset=("models", models, "--models"))
    exp.family = relative_to(path, exp.family)
    if exp.haystack_source is not None and not exp.haystack_source.startswith(("corpus:", "hub:")):
        exp.haystack_source = relative_to(path, exp.haystack_source, "haystack_source", overrides)
    return exp


def needle_family(exp: NeedleExperiment) -> Family:
    """The baseline family the models come from, with this study's runs_root if it sets one."""
    family = load_family(exp.family)
    if exp.runs_root is not None:
        family.runs_root = exp.runs_root
    return family


def check_models(exp: NeedleExperiment) -> dict[str, Any]:
    """Each model's variant setup, every name checked against the family and its stream; raises
    before any pretraining, fine-tuning or scoring."""
    family = needle_family(exp)
    setups = {}
    for name, spec in exp.models.items():
        if spec["variant"] not in family.variants:
            raise ConfigError(f"needle config field 'models.{name}.variant': {spec['variant']!r} is not a variant of "
                              f"{exp.family} ({list(family.variants)})")
        if spec["variant"] not in setups:
            setups[spec["variant"]] = family.setup(spec["variant"], exp.base_seed, who="needle")
        layers = setups[spec["variant"]].model_config.fwpkm_layers
        if not set(spec.get("writes") or []) <= set(layers):
            raise ConfigError(f"needle config field 'models.{name}.writes': {spec['writes']} are not all FwPKM layers of "
                              f"variant {spec['variant']!r} ({list(layers)})")
        try:
            reach_config(setups[spec["variant"]].model_config, spec)
        except ConfigError as err:
            raise ConfigError(f"needle config field 'models.{name}.model': {err}") from None
    scenario = next(iter(setups.values())).scenario
    if exp.haystack_domain not in scenario.domains:
        raise ConfigError(f"needle config field 'haystack_domain': {exp.haystack_domain!r} is not a domain of "
                          f"the family's stream ({list(scenario.domains)})")
    return setups


def reach_config(model_config, spec: dict[str, Any]):
    """The variant's architecture with the model's attention-reach changes (`spec["model"]`)."""
    return dataclasses.replace(model_config, **(spec.get("model") or {}))


def study_identity(exp: NeedleExperiment, family: Family) -> dict[str, Any]:
    """What a result folder is keyed by: the experiment's settings (not its models, seeds or runs
    root: members are cached one per file) and the family's base run config, not its variants
    (each member records its own variant's definition and base key, as `clp eval` and `clp repeat`)."""
    identity = {k: v for k, v in dataclasses.asdict(exp).items()
                if k not in ("models", "seeds", "runs_root", "family", "reference")}
    # A field at its default, said or not, keys the folder as before the field existed.
    for fields, key, default in ((identity["needles"], "form", "name_first"), (identity, "haystack_source", None),
                                 (identity, "split", "eval"), (identity, "memory", "reset")):
        if fields.get(key, default) == default:
            fields.pop(key, None)
    identity["family"] = family.identity()["base"]
    return identity


class Needles(Study):
    """Members: every (model, fine-tuning seed), a zero-shot model on the first seed only."""

    prefix = "niah"

    def prepare(self) -> None:
        from experiments.setup import base_key

        exp, family = self.exp, needle_family(self.exp)
        self.setups = check_models(exp)  # every name checked, the stream loaded once
        # What a member's result depends on beyond its spec: its variant's definition and its base.
        self.keys = {variant: {"variant_config": family.variants[variant], "base_key": base_key(setup)}
                     for variant, setup in self.setups.items()}
        self.facts = {variant: episode_facts(exp, setup) for variant, setup in self.setups.items()}
        if exp.reference is not None:
            ref = self.facts[exp.models[exp.reference]["variant"]][1]
            other = [name for name, spec in exp.models.items() if self.facts[spec["variant"]][1] != ref]
            check(not other, exp, "reference", f"models {other} read other episodes than {exp.reference!r} "
                  f"(their variants' {exp.haystack_domain} eval split or tokenizer differ): no paired comparison")

    def folder(self) -> Path:
        family = needle_family(self.exp)
        return study_folder(family.resolved_runs_root(), self.prefix, study_identity(self.exp, family))

    def members(self) -> list[tuple[str, int]]:
        return [(name, seed) for name, spec in self.exp.models.items()
                for seed in (self.exp.seeds if spec.get("finetune") else self.exp.seeds[:1])]

    def fresh(self, name: str, seed: int, result: dict[str, Any]) -> bool:
        """The same model spec (variant, fine-tuning, write rule), variant definition and base, and,
        if fine-tuned, the same episode memory."""
        spec = self.exp.models[name]
        return (result.get("spec") == spec and all(result.get(k) == v for k, v in self.keys[spec["variant"]].items())
                and (not spec.get("finetune") or result.get("finetune_memory") == FINETUNE_MEMORY))

    def score(self, name: str, seed: int, say: Callable[[str], None]) -> dict[str, Any]:
        """One model scored (fine-tuned first if asked)."""
        from experiments.base import resolve_base
        from experiments.setup import build_model

        exp, spec = self.exp, self.exp.models[name]
        setup = self.setups[spec["variant"]]
        weights = resolve_base(setup, say, progress_bar=False).weights
        rule, precision = dataclasses.replace(setup.config.pretrain.fwpkm, **(spec.get("rule") or {})), \
            setup.config.pretrain.precision
        model_config = reach_config(setup.model_config, spec)
        model = build_model(model_config, 0, rule)
        model.load_state_dict(weights)  # reach fields hold no parameters: the base loads unchanged
        tokenizer, splits = setup.scenario.tokenizer, setup.scenario.domains[exp.haystack_domain].splits
        loss = None
        if spec.get("finetune"):
            say(f"{name}, seed {seed}: fine-tuning {exp.finetune_steps} steps on needle episodes")
            loss = finetune(model, exp, rule, split_tokens(splits["pretrain"]), tokenizer, seed, precision)
        say(f"{name}, seed {seed}: scoring {exp.episodes} episodes")
        result = read_episodes(model, exp, rule, self.facts[spec["variant"]][2], tokenizer, precision,
                               spec.get("writes"), seed, bool(spec.get("patch")))
        return {"model": name, "seed": seed, "spec": spec, "finetune_loss": loss,
                "finetune_memory": FINETUNE_MEMORY if spec.get("finetune") else None, "window": model_config.window,
                "mixer": model_config.mixer, "fwpkm_layers": setup.model_config.fwpkm_layers, **result,
                **self.keys[spec["variant"]]}

    def summarise(self, results: list[dict]) -> dict[str, Any]:
        return summarise(self.exp, results, {name: self.facts[spec["variant"]][0] for name, spec in self.exp.models.items()})

    def table(self, summary: dict[str, Any]) -> str:
        return table(self.exp, summary)


def summarise(exp: NeedleExperiment, results: list[dict], counts: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """Per model: exact match per reading (mean over seeds, Wilson over every episode), by asked
    needle, candidate match, answer-token rates; with `counts` (per episode: how many needles have
    the asked one's attribute), exact match where it is unique / shared, and `name_guess`."""
    out: dict[str, Any] = {"episodes": exp.episodes, "models": {}}
    for name in exp.models:
        runs = [r for r in results if r["model"] == name]
        n = exp.episodes * len(runs)
        settings = list(runs[0]["accuracy"])
        entry: dict[str, Any] = {"seeds": [r["seed"] for r in runs], "finetuned": bool(exp.models[name].get("finetune"))}
        for s in settings:
            mean, std = mean_and_std([r["accuracy"][s] for r in runs])
            entry[s] = {"mean": mean, "std": std, "wilson": wilson(sum(sum(r["hits"][s]) for r in runs), n),
                        "by_needle": [statistics.fmean(v) for v in zip(*(r["by_needle"][s] for r in runs))]}
        entry["distance_by_needle"] = runs[0]["distance_by_needle"]
        if all("ranks" in r for r in runs):  # members scored before candidate match have none
            hits = {s: sum(sum(rank == 1 for rank in r["ranks"][s]) for r in runs) for s in runs[0]["ranks"]}
            entry["candidate_match"] = {s: {"mean": k / n, "wilson": wilson(k, n)} for s, k in hits.items()}
        if all("token_hits" in r for r in runs):  # members scored before it have none
            entry["token_accuracy"] = {s: token_accuracy([h for r in runs for h in r["token_hits"][s]])
                                       for s in runs[0]["token_hits"]}
        flags = None if counts is None else [c > 1 for c in counts[name]]
        if all(r.get("address") for r in runs):  # members scored before it (or without an FwPKM) have none
            entry.update(address_summary(runs, flags))
        if flags is not None:
            entry["by_attribute"] = {s: {kind: by_flag([r["hits"][s] for r in runs], flags, kind == "shared")
                                         for kind in ("unique", "shared")} for s in settings}
            entry["name_guess"] = name_guess(counts[name])
        if exp.reference not in (None, name):
            ref = [r for r in results if r["model"] == exp.reference]
            entry["paired"] = {s: paired_bootstrap([r["hits"][s] for r in ref], [r["hits"][s] for r in runs])
                               for s in settings}
        out["models"][name] = entry
    return out


def table(exp: NeedleExperiment, summary: dict) -> str:
    settings, cfg, models = exp.settings, exp.needle_config, summary["models"]
    lines = [f"needle in a haystack: exact match over {exp.episodes} episodes ({cfg.needles} {cfg.style} needles in "
             f"{cfg.haystack_tokens} tokens of {exp.haystack_source or exp.haystack_domain}, {exp.split}; memory "
             f"{exp.memory}); mean ± std over seeds "
             f"[95 % Wilson interval over all episodes]", row("", settings, 26, 24)]
    for name, entry in models.items():
        cells = [f"{entry[s]['mean']:.2f}" + (f" ± {entry[s]['std']:.2f}" if len(entry['seeds']) > 1 else "")
                 + f" [{entry[s]['wilson'][0]:.2f}, {entry[s]['wilson'][1]:.2f}]" for s in settings]
        lines.append(row(f"{name} ({'fine-tuned' if entry['finetuned'] else 'zero-shot'})", cells, 26, 24))
    lines.append(f"candidate match: the asked needle's number is the likeliest of the {cfg.needles} "
                 f"(chance {1 / cfg.needles:.2f}) [95 % Wilson interval]")
    for name, entry in models.items():
        match = entry.get("candidate_match")
        lines.append(row(name, [interval_text(match[s]["mean"], *match[s]["wilson"]) if match and s in match else "n/a"
                                for s in settings], 26, 24))
    if any("token_accuracy" in entry for entry in models.values()):
        lines.append("answer tokens: top-1 rate of the answer's 1st, 2nd, ... token (teacher forced; exact match "
                     "needs every one)")
        for name, entry in models.items():
            acc = entry.get("token_accuracy")
            lines.append(f"{name:>26s}  " + ("n/a (scored before token rates)" if acc is None else "   ".join(
                f"{s} " + " ".join(f"{a:.2f}" for a in acc[s]) for s in settings)))
    if exp.reference is not None:
        lines.append(f"paired against {exp.reference}: exact match difference, the same episodes [95 % paired "
                     f"bootstrap over the episodes, within this base]")
        lines += [row(name, [interval_text(entry["paired"][s]["value"], entry["paired"][s]["low"],
                                           entry["paired"][s]["high"], "+.2f") for s in settings], 26, 24)
                  for name, entry in models.items() if "paired" in entry]
    if any("address" in entry for entry in models.values()):
        lines.append(f"addresses, in-pass, per FwPKM layer: the weight the question's read shares with the asked "
                     f"needle's write / with the other needles' (mean) / two needles' writes with each other; match: "
                     f"the asked needle's is the largest (chance {1 / cfg.needles:.2f})")
        lines += [f"{name:>26s}  " + address_text(entry) for name, entry in models.items()]
    first = next(iter(models.values()))
    if "by_attribute" in first:
        counts, guess = first["by_attribute"][settings[0]], first.get("name_guess")
        lines.append(f"by the asked needle's attribute: unique among the needles ({counts['unique']['episodes']} "
                     f"episodes) / shared with another ({counts['shared']['episodes']}; only the name or ID tells them "
                     f"apart" + ("" if guess is None else f"; a pick among the episode's values of the asked attribute, "
                                 f"no name needed, is right {guess:.2f} there") + ")")
        for name, entry in models.items():
            cells = ["/".join("n/a" if c["mean"] is None else f"{c['mean']:.2f}"
                              for c in (entry["by_attribute"][s]["unique"], entry["by_attribute"][s]["shared"]))
                     for s in settings]
            lines.append(f"{name:>26s}  " + "   ".join(f"{s} {c}" for s, c in zip(settings, cells)))
    lines.append("by asked needle (mean tokens from needle to answer: "
                 + ", ".join(f"{d:.0f}" for d in first["distance_by_needle"]) + "):")
    for name, entry in models.items():
        lines.append(f"{name:>26s}  " + "   ".join(f"{s} " + " ".join(f"{a:.2f}" for a in entry[s]["by_needle"])
                                                for s in settings))
    return "\n".join(lines)


def run_over_bases(exp: NeedleExperiment, base_seeds: list[int],
                   say: Callable[[str], None] = print) -> tuple[Path, dict[str, Any]]:
    """`run` once per base seed (each in its own folder, its members reused), then every model's
    exact and candidate match per base, their mean and 95 % t-interval over the bases (a Wilson
    interval over one base's episodes is within-base). Every base is checked before any is scored."""
    per_base = each_base(lambda seed: Needles(dataclasses.replace(exp, base_seed=seed)), base_seeds, say)
    summary = over_bases(per_base, exp.reference)
    family = needle_family(exp)
    identity = {k: v for k, v in study_identity(exp, family).items() if k != "base_seed"}
    identity.update(base_seeds=base_seeds, models=sorted(exp.models))
    folder = study_folder(family.resolved_runs_root(), "niah-bases", identity)
    folder.mkdir(parents=True, exist_ok=True)
    publish(folder, summary, bases_table(exp, summary), say)
    return folder, summary


def over_bases(per_base: dict[int, dict[str, Any]], reference: str | None = None) -> dict[str, Any]:
    """{"base_seeds", "models": {name: {"exact": {setting: mean_std}, "candidate": {...}}}} from
    each base's `summarise` output (a base's value: its mean over fine-tuning seeds); with a
    `reference` model, every other model's "paired": the bases' differences to it (mean_std)."""
    seeds = list(per_base)
    out: dict[str, Any] = {"base_seeds": seeds, "models": {}}
    for name, entry in per_base[seeds[0]]["models"].items():
        def stat(value: Callable[[dict[str, Any]], float]) -> dict[str, Any]:  # value: a base's models -> a number
            return mean_std([value(per_base[b]["models"]) for b in seeds])

        settings = [k for k in entry if k.endswith("-iter") or k == "in-pass"]
        rows = {"exact": {s: stat(lambda m: m[name][s]["mean"]) for s in settings}}
        if all("candidate_match" in per_base[b]["models"][name] for b in seeds):
            rows["candidate"] = {s: stat(lambda m: m[name]["candidate_match"][s]["mean"]) for s in entry["candidate_match"]}
        if reference is not None and name != reference:
            rows["paired"] = {s: stat(lambda m: m[name][s]["mean"] - m[reference][s]["mean"]) for s in settings}
        out["models"][name] = rows
    return out


def bases_table(exp: NeedleExperiment, summary: dict[str, Any]) -> str:
    settings = exp.settings
    lines = [f"needle in a haystack over base seeds {summary['base_seeds']}: mean [95 % t-interval over the bases] "
             f"(each base's value, in seed order); {exp.episodes} episodes a base"]
    blocks = [("exact", "exact match"), ("candidate", f"candidate match (chance {1 / exp.needle_config.needles:.2f})")]
    if exp.reference is not None:
        blocks.append(("paired", f"exact match − {exp.reference}"))
    for what, label in blocks:
        cells = {name: [over_bases_text((stats.get(what) or {}).get(s)) for s in settings]
                 for name, stats in summary["models"].items() if what in stats}
        width = 2 + max(len(c) for c in [*settings, *(c for r in cells.values() for c in r)])
        lines.append(row(label, settings, 30, width))
        lines += [row(name, r, 30, width) for name, r in cells.items()]
    return "\n".join(lines)


def main(config: str, overrides: Sequence[str] = (), seeds: list[int] | None = None,
         models: list[str] | None = None, base_seeds: list[int] | None = None) -> int:
    exp = load(config, seeds, models, overrides)
    if base_seeds is None:
        Needles(exp).run()
    else:
        run_over_bases(exp, base_seeds)
    return 0
