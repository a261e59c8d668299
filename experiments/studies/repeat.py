"""Verbatim recall beyond the attention window (issue 22): does the model read a passage better the
second time, when its first reading lies further back than attention reaches? A graded, paired
probe of the episodic memory the paper describes, on held-out real text of every domain.

    clp repeat experiments/configs/repeat_reference.yaml                 # the family's bases, 3 seeds
    clp repeat experiments/configs/repeat_reference.yaml --seeds 0 --variants attention,fwpkm

An episode, from one held-out segment s and the next one s' of a domain's split (L = `passage`,
G a gap of `gaps`):

    repeat:   P  F  P          P = s[0:L], F = s'[0:G]
    control:  Q  F  P          Q = s[L:2L], a passage the model has not read before P

Both sequences end with the same P after the same F; they differ only in whether P was read
before. Recall = loss(final P | control) − loss(final P | repeat), in nats per token, averaged
over the final copy's L − 1 predicted tokens (the first token of P is predicted from F in both and
is not counted). Positive: the model reads P better for having read it.

Why this control and not the first reading of P: the final P also follows F and sits deeper in the
sequence, and a memory that writes while it reads adapts to the document and the domain; the
control sequence has all of that, so what is left is recall of P itself.

Settings per variant: writes off (every FwPKM reads the base's memory as it is) and, for a variant
with an FwPKM, writes on (the pretraining write rule, chunk by chunk, from the base's memory,
restored before every sequence). What a mechanism-free model must give, and the tests check:
attention reaches `window` − 1 tokens back per layer, so n_layer · (window − 1) through the stack
(the "reach"); with G ≥ the reach, everything the final copy's tokens depend on is the same in
both sequences, so attention alone and a memory that does not write give recall exactly 0; only a
memory that writes can recall from there. With L + G < window the first copy is inside one
layer's window: that row measures in-context copying by attention (induction), the positive
control of the pipeline. (The memory writes once per `chunk` tokens, so where both copies fall in
one chunk it has not written P when the final copy reads: there writes on equal writes off.)

Statistics: each base's recall is the mean over its episodes (with a paired bootstrap interval
over episodes: within-base, labelled so); over several pretraining seeds, the mean and the 95 %
Student-t interval over the seeds (the unit of a base-dependent effect). Results:
`<runs_root>/repeat-<key>/`, one JSON per (variant, seed), reused by later runs.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from analysis.intervals import bootstrap_mean, interval_text, mean_std
from cl_platform.check import ConfigError, check, is_int
from experiments.config_files import relative_to
from experiments.studies.family import Family, FamilyStudy, load_family
from experiments.studies.study import check_family_study, load_study, row, study_folder

SETTINGS = ("off", "on")


@dataclass
class RepeatExperiment:
    family: str = "reference_family.yaml"  # the baseline family config (experiments/studies/longctx.py), relative to this file
    variants: list[str] = field(default_factory=list)  # which of the family's variants (default: all)
    reference: str | None = None  # a variant every other variant's recall is compared with (None: no comparison)
    passage: int = 64  # L: tokens of the repeated passage
    gaps: list[int] = field(default_factory=lambda: [0, 512, 1536])  # G: tokens between the two copies
    episodes: int = 32  # per domain at most (one per held-out segment, in split order)
    split: str = "eval"
    seeds: list[int] = field(default_factory=lambda: [0])  # pretraining seeds of the bases
    runs_root: str | None = None  # default: the family's
    bootstrap_samples: int = 1000

    def __post_init__(self) -> None:
        check(isinstance(self.variants, list) and all(isinstance(v, str) for v in self.variants)
              and len(set(self.variants)) == len(self.variants), self, "variants",
              "must be a list of distinct variant names of the family (empty: all of them)")
        check(self.reference is None or isinstance(self.reference, str), self, "reference", "must be a variant name or null")
        check(is_int(self.passage, 2), self, "passage", "must be an int >= 2 (tokens of the repeated passage)")
        check(isinstance(self.gaps, list) and bool(self.gaps) and all(is_int(g, 0) for g in self.gaps)
              and len(set(self.gaps)) == len(self.gaps), self, "gaps", "must be a non-empty list of distinct ints >= 0")
        check(is_int(self.episodes, 1), self, "episodes", "must be a positive int")
        check_family_study(self)


def load(path: str | Path, seeds: list[int] | None = None, variants: list[str] | None = None,
         overrides: Sequence[str] = ()) -> RepeatExperiment:
    """The experiment in a YAML file with `key=value` overrides; `family` relative to the file;
    `seeds` replaces the file's; `variants` replaces the file's list (each must be the family's)."""
    exp = load_study(RepeatExperiment, path, "repeat config", overrides, seeds)
    exp.family = relative_to(path, exp.family, "family", overrides)
    fam = load_family(exp.family)
    if variants is not None:
        exp.variants = list(variants)
    exp.variants = exp.variants or list(fam.variants)
    unknown = [v for v in exp.variants if v not in fam.variants]
    if unknown:
        raise ConfigError(f"repeat config {path}: variants {unknown} are not among the family's {list(fam.variants)}",
                          field="variants")
    if exp.reference is not None and exp.reference not in exp.variants:
        raise ConfigError(f"repeat config {path}: field 'reference': {exp.reference!r} is not among the variants "
                          f"{exp.variants}", field="reference")
    return exp


def family(exp: RepeatExperiment) -> Family:
    fam = load_family(exp.family)
    return Family(base=fam.base, variants={v: fam.variants[v] for v in exp.variants},
                  runs_root=exp.runs_root or fam.runs_root)


def episode_pair(first: Any, second: Any, passage: int, gap: int):
    """(repeat, control) token tensors (2L + G,) from two segments' input ids: P F P and Q F P."""
    import torch

    p, q, f = first[:passage], first[passage:2 * passage], second[:gap]
    return torch.cat([p, f, p]), torch.cat([q, f, p])


def final_copy_loss(model, ids, passage: int) -> float:
    """Mean loss (nats/token) of `model` on the last `passage` − 1 tokens of `ids` (1-D): the final
    copy's tokens after its first, each predicted from everything before it."""
    import torch

    logits = model(ids[None])[0].float()
    logp = torch.log_softmax(logits[-passage:-1], dim=-1)
    return float(-logp.gather(1, ids[-passage + 1:, None]).mean().detach())


def score(setup, weights: dict, exp: RepeatExperiment) -> dict[str, Any]:
    """Per domain, setting and gap: the per-episode losses of the final copy in the repeat and the
    control sequence (lists of floats, episode order). Every sequence starts from the base's
    memory, so no episode reads another's writes."""
    import torch

    from experiments.studies.family import reading_model

    model, memory, autocast = reading_model(setup, weights)
    settings = SETTINGS if model.fwpkm_layers() else SETTINGS[:1]
    out: dict[str, Any] = {}
    for name, data in setup.scenario.domains.items():
        segments = data.splits[exp.split].segments
        n = len(segments)
        by_setting: dict[str, Any] = {}
        for setting in settings:
            model.set_writes(setting == "on")
            by_gap = {}
            for gap in exp.gaps:
                repeat, control = [], []
                for k in range(min(exp.episodes, n - 1)):  # distinct segments: episodes are independent
                    rep, con = episode_pair(segments[k]["input_ids"], segments[k + 1]["input_ids"], exp.passage, gap)
                    for ids, into in ((rep, repeat), (con, control)):
                        model.restore_memory(memory)
                        with torch.no_grad(), autocast:
                            into.append(final_copy_loss(model, ids, exp.passage))
                by_gap[str(gap)] = {"repeat": repeat, "control": control}
            by_setting[setting] = by_gap
        model.restore_memory(memory)
        out[name] = by_setting
    return out


def prepare(exp: RepeatExperiment, fam: Family, variant: str, seed: int):
    """The variant's setup, checked against the experiment before any pretraining or scoring."""
    setup = fam.setup(variant, seed, who="repeat")
    seq_len = setup.scenario.config.seq_len
    longest = 2 * exp.passage + max(exp.gaps)
    if longest > seq_len:  # also what P and Q (one segment) and F (the next) need of a segment
        raise ConfigError(f"repeat config fields 'passage' and 'gaps': an episode of 2 x {exp.passage} + {max(exp.gaps)} "
                          f"= {longest} tokens is longer than the {seq_len}-token segments the base was pretrained on")
    for name, data in setup.scenario.domains.items():
        if len(data.splits[exp.split].segments) < 3:
            raise ConfigError(f"repeat config: domain {name!r} has fewer than 3 {exp.split} segments (two episodes "
                              f"need three)")
    return setup


def reach(model_config) -> int | None:
    """How far back attention reaches through the stack: n_layer · (window − 1) for sliding-window
    attention; None (no bound) for full attention."""
    return model_config.n_layer * (model_config.window - 1) if model_config.mixer == "swa" else None


def recall_of(cell: dict[str, list[float]]) -> list[float]:
    """Per-episode recall: control − repeat loss of the final copy."""
    return [c - r for c, r in zip(cell["control"], cell["repeat"])]


class Repeat(FamilyStudy):
    """Members: every (variant, base seed); one is reused only for the same base."""

    prefix = "repeat"

    def prepare(self) -> None:
        self.family = family(self.exp)
        self.setups = {(v, s): prepare(self.exp, self.family, v, s) for v, s in self.members()}  # every error first

    def folder(self) -> Path:
        exp = self.exp
        return study_folder(self.family.resolved_runs_root(), self.prefix,
                            {"base": self.family.identity()["base"], "passage": exp.passage, "gaps": exp.gaps,
                             "episodes": exp.episodes, "split": exp.split})

    def score(self, name: str, seed: int, say: Callable[[str], None]) -> dict[str, Any]:
        from cl_platform.base_file import describe

        exp = self.exp
        setup, record, weights, first = self.base(name, seed, say)
        say(f"{name}, seed {seed}: reading up to {exp.episodes} repeat/control pairs per domain and gap")
        return {**first,
                "base_summary": describe(record), "window": setup.model_config.window,
                "reach": reach(setup.model_config), "scores": score(setup, weights, exp)}

    def summarise(self, results: list[dict]) -> dict[str, Any]:
        return summarise(self.exp, results)

    def table(self, summary: dict[str, Any]) -> str:
        return table(summary)


def summarise(exp: RepeatExperiment, results: list[dict]) -> dict[str, Any]:
    """recall[variant][setting][gap][domain] = {per_seed, episode_ci (per seed), mean, std, t95};
    and, with a reference, each variant's best setting (writes on if it has them) minus the
    reference's (likewise), paired by seed."""
    by = {(r["variant"], r["seed"]): r for r in results}
    domains = list(results[0]["scores"])

    def cell(v: str, setting: str, gap: int, d: str) -> dict[str, Any]:
        scores = [by[(v, s)]["scores"][d][setting][str(gap)] for s in exp.seeds]
        per = [recall_of(c) for c in scores]
        m = mean_std([statistics.fmean(p) for p in per])
        m["episode_ci"] = [bootstrap_mean(p, exp.bootstrap_samples) for p in per]
        m["loss_repeat"] = statistics.fmean(statistics.fmean(c["repeat"]) for c in scores)
        m["loss_control"] = statistics.fmean(statistics.fmean(c["control"]) for c in scores)
        return m

    recall = {v: {setting: {str(gap): {d: cell(v, setting, gap, d) for d in domains} for gap in exp.gaps}
                  for setting in by[(v, exp.seeds[0])]["scores"][domains[0]]} for v in exp.variants}
    differences: dict[str, Any] = {}
    if exp.reference is not None:
        # each side as it is used: writing if it has an FwPKM (a memory reference, e.g. the plain
        # base against the knob base, writes too; an attention reference has only "off")
        ref = recall[exp.reference]["on" if "on" in recall[exp.reference] else "off"]
        for v in exp.variants:
            if v != exp.reference:
                best = recall[v]["on" if "on" in recall[v] else "off"]
                differences[v] = {str(gap): {d: mean_std([a - b for a, b in zip(best[str(gap)][d]["values"],
                                                                               ref[str(gap)][d]["values"])])
                                             for d in domains} for gap in exp.gaps}
    return {"reach": results[0]["reach"], "seeds": exp.seeds, "variants": exp.variants, "reference": exp.reference,
            "domains": domains, "passage": exp.passage, "gaps": exp.gaps, "episodes": exp.episodes,
            "split": exp.split, "window": results[0]["window"], "recall": recall, "minus_reference": differences}


def _cell(m: dict[str, Any]) -> str:
    """One seed: the mean over episodes [its bootstrap interval]; more: the mean [t-interval over seeds]."""
    return interval_text(m["mean"], *(m["episode_ci"][0] if len(m["values"]) == 1 else m["t95"]), spec="+.3f")


def table(summary: dict[str, Any]) -> str:
    seeds = summary["seeds"]
    how = ("95 % bootstrap interval over episodes, within one base" if len(seeds) == 1
           else f"mean over {len(seeds)} base seeds {seeds}, 95 % t-interval over the seeds")
    lines = [f"verbatim recall (nats/token): loss of a passage of {summary['passage']} tokens after a different passage "
             f"minus after the same passage, the copies a gap apart; {summary['split']} split, "
             f"up to {summary['episodes']} episodes per domain; attention window {summary['window']}, reach through "
             f"the layers {summary['reach']}; {how}"]
    for gap in summary["gaps"]:
        where = ("the first copy within the window" if summary["passage"] + gap < summary["window"] else
                 "beyond the reach of attention" if summary["reach"] is not None and gap >= summary["reach"] else
                 "beyond one window, within the layers' reach")
        lines += ["", f"gap {gap} ({where})", row("", summary["domains"], 20, 24)]
        for v, by_setting in summary["recall"].items():
            for setting, by_gap in by_setting.items():
                label = v if setting == "off" and len(by_setting) == 1 else f"{v} writes {setting}"
                lines.append(row(label, [_cell(by_gap[str(gap)][d]) for d in summary["domains"]], 20, 24))
        for v, by_gap in summary["minus_reference"].items():
            cells = [f"{m['mean']:+.3f}" if math.isnan(m["std"]) else interval_text(m["mean"], *m["t95"], spec="+.3f")
                     for m in (by_gap[str(gap)][d] for d in summary["domains"])]
            lines.append(row("Δ " + v + "−" + summary["reference"], cells, 20, 24))
    lines.append("")
    lines.append("recall 0: the second reading gains nothing from the first. Beyond the reach, attention alone and a "
                 "memory that does not write give exactly 0; Δ: a variant's recall (writing, if it has an FwPKM) "
                 "minus the reference's, paired by seed.")
    return "\n".join(lines)


def run(exp: RepeatExperiment, say: Callable[[str], None] = print) -> tuple[Path, dict[str, Any]]:
    """Every (variant, seed), each saved as it finishes; finished ones are read back."""
    return Repeat(exp).run(say)


def main(config: str, overrides: Sequence[str] = (), seeds: list[int] | None = None,
         variants: list[str] | None = None) -> int:
    run(load(config, seeds, variants, overrides))
    return 0
