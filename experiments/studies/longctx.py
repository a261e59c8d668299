"""Long-context perplexity of the baseline family (issue 8): the same backbone with no memory,
a static PKM, an FwPKM, or both, pretrained on the same tokens, steps and seeds; each domain's
loss by position in the document, with the FwPKM writing while it reads and with writes off.

    clp eval experiments/configs/longctx.yaml                 # pretrains the missing bases, then evaluates
    clp eval experiments/configs/longctx.yaml --seeds 0,1,2 --variants attention,fwpkm

The bases are ordinary cached bases (`experiments/base.py`): the family config names a run config
(`base`) and, per variant, the model fields that differ (where the memories sit). Evaluation:

- writes off: every segment reads the base's memory as it is (the memory contributes what it
  learned in pretraining, nothing of this segment);
- writes on: every segment starts from the base's memory and writes it chunk by chunk as it reads
  (the pretraining write rule), so later positions read what earlier chunks of the same segment
  wrote: the memory's in-context role. One segment per forward, memory restored after each, so
  no segment reads another's writes.
- doc (`settings: [off, on, doc]`): writes on, but each document of the segment read on its own
  from the base's memory, so the memory holds only what this document wrote: recall within a
  document, apart from the adaptation carried across documents of a segment ("on" − "doc").
  Attention then starts at the document too, so positions below the window see less than "on"
  (the previous document's end); past the window the two differ by the memory alone.

A token's position is the number of tokens of its own document before it in the segment
(`context_positions`); with the 128-token attention window, positions ≥ 128 are where only a
memory can bring back the start of the document. Results: `<runs_root>/longctx-<key>/`
(`results.json`, `table.txt`, `positions.png`), one JSON per (variant, seed) so a re-run or a
new seed evaluates only what is missing.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from analysis.intervals import interval_text, mean_std
from cl_platform.check import ConfigError, check, is_int
from experiments.config_files import relative_to
from experiments.studies.family import Family, FamilyStudy, check_variants
from experiments.studies.study import check_family_study, load_study, row, study_folder

SETTINGS = ("off", "on", "doc")


@dataclass
class LongContextExperiment:
    base: str = "longctx_base.yaml"  # run config of the bases, relative to this file
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {fwpkm_layers, pkm_layers}
    reference: str = "attention"  # the variant every difference is taken against
    buckets: list[int] = field(default_factory=lambda: [0, 128, 512, 1024, 2048])  # position bucket edges
    split: str = "eval"  # "dev" to choose settings
    settings: list[str] = field(default_factory=lambda: ["off", "on"])  # of SETTINGS; "off" always
    seeds: list[int] = field(default_factory=lambda: [0])  # pretraining seeds of the bases
    runs_root: str | None = None  # default: the base run config's runs_root
    bootstrap_samples: int = 1000

    def __post_init__(self) -> None:
        check_variants(self, self.variants)
        check(self.reference in self.variants, self, "reference", f"is not one of the variants {list(self.variants)}")
        b = self.buckets
        check(isinstance(b, list) and len(b) >= 2 and all(is_int(x, 0) for x in b) and b[0] == 0
              and all(x < y for x, y in zip(b, b[1:])), self, "buckets",
              "must be increasing ints starting at 0 (bucket edges in tokens)")
        check(isinstance(self.settings, list) and "off" in self.settings and set(self.settings) <= set(SETTINGS)
              and len(set(self.settings)) == len(self.settings), self, "settings",
              f"must be distinct names of {list(SETTINGS)}, 'off' among them")
        check_family_study(self)


def load(path: str | Path, seeds: list[int] | None = None, variants: list[str] | None = None,
         overrides: Sequence[str] = ()) -> LongContextExperiment:
    """The experiment in a YAML file with `key=value` overrides; `base` becomes a path relative to
    it; `seeds` replaces the file's; `variants` keeps only those of the file's variants (the
    reference among them)."""
    exp = load_study(LongContextExperiment, path, "long-context config", overrides, seeds,
                     subset=("variants", variants, "--variants"))
    exp.base = relative_to(path, exp.base)
    if not Path(exp.base).is_file():
        raise ConfigError(f"{path}: field 'base': run config {exp.base} does not exist")
    return exp


def family(exp: LongContextExperiment) -> Family:
    return Family(base=exp.base, variants=exp.variants, runs_root=exp.runs_root)


def context_positions(doc_start):
    """(B, T) bool (True at a document's first token, its <eot>) -> (B, T) long: tokens of the same
    document before each position in the segment (a document begun before the segment counts
    from the segment's start, as that is all the model reads of it)."""
    import torch

    t = torch.arange(doc_start.shape[1], device=doc_start.device).expand_as(doc_start)
    start = torch.where(doc_start, t, torch.zeros_like(t)).cummax(dim=1).values
    return t - start


def score(setup, weights: dict, split: str, edges: list[int], settings: Sequence[str] = ("off", "on")
          ) -> dict[str, dict[str, Any]]:
    """Per domain of `split`: {setting: (Σ loss, tokens) per (document, bucket)} for writes off
    and (if the model has an FwPKM) the other `settings`, plus the split's mean loss per setting."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from analysis.positions import bucket_document_sums
    from cl_platform.constants import IGNORE_INDEX
    from experiments.studies.family import reading_model

    model, base_memory, autocast = reading_model(setup, weights)
    has_memory = bool(model.fwpkm_layers())
    out: dict[str, dict[str, Any]] = {}
    for name, data in setup.scenario.domains.items():
        segments = data.splits[split].segments
        n_docs = int(segments.doc_index.max()) + 1
        result: dict[str, Any] = {}
        for setting in settings if has_memory else ["off"]:
            model.set_writes(setting != "off")
            sums = np.zeros((n_docs, len(edges) - 1))
            counts = np.zeros((n_docs, len(edges) - 1), dtype=np.int64)
            for i in range(len(segments)):  # one segment per forward ("doc": one document): its own writes only
                item = segments[i]
                x, y = item["input_ids"][None], item["targets"][None]
                pieces = document_pieces(item["doc_start"]) if setting == "doc" else [(0, x.shape[1])]
                losses = []
                for a, b in pieces:
                    model.restore_memory(base_memory)
                    with torch.no_grad(), autocast:
                        logits = model(x[:, a:b])
                    losses.append(F.cross_entropy(logits.float().flatten(0, 1), y[:, a:b].flatten(),
                                                  ignore_index=IGNORE_INDEX, reduction="none"))
                losses = torch.cat(losses)
                s, c = bucket_document_sums(losses.numpy(), context_positions(item["doc_start"][None]).numpy(),
                                            item["doc_index"].numpy(), (y != IGNORE_INDEX).numpy(), edges, n_docs)
                sums += s
                counts += c
            result[setting] = {"sums": sums.tolist(), "counts": counts.tolist(),
                               "mean": float(sums.sum() / max(counts.sum(), 1))}
        model.restore_memory(base_memory)
        out[name] = result
    return out


def document_pieces(doc_start) -> list[tuple[int, int]]:
    """[start, end) of each document's tokens in a segment ((T,) bool, True at a document's first
    token; a document begun before the segment is its first piece)."""
    starts = [0] + [int(t) for t in doc_start.nonzero().flatten().tolist() if t > 0]
    return list(zip(starts, starts[1:] + [int(doc_start.shape[0])]))


def prepare(exp: LongContextExperiment, variant: str, seed: int):
    """The variant's setup, checked against the experiment before any pretraining or scoring."""
    setup = family(exp).setup(variant, seed, who="long-context")
    seq_len = setup.scenario.config.seq_len
    if seq_len > exp.buckets[-1]:
        raise ConfigError(f"long-context config field 'buckets': ends at {exp.buckets[-1]} but {exp.base} reads "
                          f"{seq_len}-token segments; make the last edge at least {seq_len}")
    return setup


class LongContext(FamilyStudy):
    """Members: every (variant, base seed); one is reused only for the same base (a rebuilt or
    changed base is scored again). The summary: means over seeds, paired document-bootstrap
    intervals of the differences."""

    prefix = "longctx"

    def prepare(self) -> None:
        self.setups = {(v, s): prepare(self.exp, v, s) for v, s in self.members()}  # every error first

    def folder(self) -> Path:
        fam = family(self.exp)
        extra = {} if self.exp.settings == ["off", "on"] else {"settings": self.exp.settings}  # the default keys as before
        return study_folder(fam.resolved_runs_root(), self.prefix,
                            {"base": fam.identity()["base"], "buckets": self.exp.buckets, "split": self.exp.split, **extra})

    def score(self, name: str, seed: int, say: Callable[[str], None]) -> dict[str, Any]:
        """The variant's base (cached, or pretrained now), scored by position bucket."""
        from cl_platform.base_file import describe

        setup, record, weights, first = self.base(name, seed, say)
        say(f"{name}, seed {seed}: scoring the {self.exp.split} split by position")
        scores = score(setup, weights, self.exp.split, self.exp.buckets, self.exp.settings)
        return {**first,
                "base_record": {k: record.get(k) for k in ("final_eval_mean", "unigram_mean", "steps", "tokens", "seconds")},
                "base_summary": describe(record), "window": setup.model_config.window, "scores": scores}

    def summarise(self, results: list[dict]) -> dict[str, Any]:
        return summarise(self.exp, results)

    def table(self, summary: dict[str, Any]) -> str:
        return table(self.exp, summary)

    def finish(self, folder: Path, summary: dict[str, Any]) -> str:
        from analysis.positions import positions_figure

        fig = positions_figure({d: {v: summary["means"][v][d] for v in self.exp.variants} for d in summary["domains"]},
                               self.exp.buckets, summary["window"])
        fig.savefig(folder / "positions.png", dpi=120)
        return f"results: {folder / 'results.json'}, plot: {folder / 'positions.png'}"


def run(exp: LongContextExperiment, say: Callable[[str], None] = print) -> tuple[Path, dict[str, Any]]:
    """Every (variant, seed), each saved as it finishes; finished ones are read back."""
    return LongContext(exp).run(say)


def summarise(exp: LongContextExperiment, results: list[dict]) -> dict[str, Any]:
    """means[variant][domain][setting] = per-bucket mean over seeds; differences (seed exp.seeds[0]'s
    documents, paired bootstrap): writes on − off per variant, and each variant − the reference
    (both writing where they have an FwPKM)."""
    import numpy as np

    from analysis.positions import bucket_means, paired_difference

    by = {(r["variant"], r["seed"]): r for r in results}
    domains = list(results[0]["scores"])
    means: dict[str, Any] = {}
    for variant in exp.variants:
        means[variant] = {}
        for d in domains:
            means[variant][d] = {}
            for setting in by[(variant, exp.seeds[0])]["scores"][d]:
                rows = [bucket_means(np.array(by[(variant, s)]["scores"][d][setting]["sums"]),
                                     np.array(by[(variant, s)]["scores"][d][setting]["counts"])) for s in exp.seeds]
                means[variant][d][setting] = np.mean(rows, axis=0).tolist()
                if len(exp.seeds) > 1:
                    means[variant][d][setting + "_std"] = np.std(rows, axis=0, ddof=1).tolist()

    def arrays(variant, seed, d, setting):
        s = by[(variant, seed)]["scores"][d][setting]
        return np.array(s["sums"]), np.array(s["counts"])

    diffs: dict[str, Any] = {"on_minus_off": {}, "on_minus_doc": {}, "minus_reference": {}}
    for seed in exp.seeds:
        for variant in exp.variants:
            for d in domains:
                scores = by[(variant, seed)]["scores"][d]
                for name, (a, b) in {"on_minus_off": ("off", "on"), "on_minus_doc": ("doc", "on")}.items():
                    if a in scores and b in scores:
                        diffs[name].setdefault(variant, {}).setdefault(d, []).append(paired_difference(
                            *arrays(variant, seed, d, a), *arrays(variant, seed, d, b), samples=exp.bootstrap_samples))
                if variant != exp.reference:
                    # each side as it is used: writing while it reads if it has an FwPKM (an
                    # attention reference has only "off"; a memory reference, e.g. the plain base
                    # against the knob base, writes too)
                    best = "on" if "on" in scores else "off"
                    ref = "on" if "on" in by[(exp.reference, seed)]["scores"][d] else "off"
                    diffs["minus_reference"].setdefault(variant, {}).setdefault(d, []).append(paired_difference(
                        *arrays(exp.reference, seed, d, ref), *arrays(variant, seed, d, best),
                        samples=exp.bootstrap_samples))
    tokens = {d: np.array(by[(exp.reference, exp.seeds[0])]["scores"][d]["off"]["counts"]).sum(0).tolist()
              for d in domains}
    docs = {d: int((np.array(by[(exp.reference, exp.seeds[0])]["scores"][d]["off"]["counts"]).sum(1) > 0).sum())
            for d in domains}
    # The base-to-base spread: each seed's loss over the whole split (token-weighted), per setting.
    whole = {variant: {setting: {d: [by[(variant, s)]["scores"][d][setting]["mean"] for s in exp.seeds]
                                 for d in domains}
                       for setting in by[(variant, exp.seeds[0])]["scores"][domains[0]]}
             for variant in exp.variants}
    window = results[0]["window"]
    return {"buckets": exp.buckets, "split": exp.split, "seeds": exp.seeds, "reference": exp.reference,
            "window": window, "domains": domains, "tokens": tokens, "documents": docs,
            "means": means, "whole": whole, "differences": diffs, "beyond": beyond_window(diffs["minus_reference"], exp.buckets, window),
            "bases": {f"{r['variant']}-seed{r['seed']}": r["base_summary"] for r in results}}


def beyond_window(minus_reference: dict, edges: list[int], window: int) -> dict[str, dict[str, Any]]:
    """Per variant and domain: the difference to the reference on the tokens past the attention
    window (every bucket starting at or after it, token-weighted), per seed, with the mean and the
    95 % Student-t interval over seeds (`analysis.aggregate.mean_std`; NaN with one seed: the
    unit is the pretraining seed, a base-dependent effect; the per-bucket document intervals are
    within-base). Where no bucket starts at the window the entry is empty."""
    past = [i for i, lo in enumerate(edges[:-1]) if lo >= window]
    out: dict[str, dict[str, Any]] = {variant: {} for variant in minus_reference}
    for variant, by_d in minus_reference.items():
        for d, seeds in by_d.items():
            counts = [sum(cells[i]["tokens"] for i in past) for cells in seeds]
            if past and all(counts):
                out[variant][d] = mean_std([sum(cells[i]["value"] * cells[i]["tokens"] for i in past) / n
                                            for cells, n in zip(seeds, counts)])
    return out


def _fmt_diff(cells: list[list[dict]], i: int) -> str:
    """Seeds' differences in bucket i: one seed 'v [lo, hi]', more 'mean ± std (k/n exclude 0)'."""
    values = [c[i]["value"] for c in cells]
    if any(math.isnan(v) for v in values):
        return "-"
    if len(cells) == 1:
        return interval_text(cells[0][i]["value"], cells[0][i]["low"], cells[0][i]["high"], "+.3f")
    excl = sum(1 for c in cells if c[i]["high"] < 0 or c[i]["low"] > 0)
    return f"{statistics.fmean(values):+.3f} ± {statistics.stdev(values):.3f} ({excl}/{len(cells)})"


def table(exp: LongContextExperiment, summary: dict) -> str:
    edges = summary["buckets"]
    heads = [f"{lo}-{hi}" for lo, hi in zip(edges[:-1], edges[1:])]
    lines = [f"loss (nats/token) by position in the document, {summary['split']} split, attention window "
             f"{summary['window']}, mean over base seeds {summary['seeds']}; 'on': the FwPKM writes while reading, "
             f"'doc': and each document starts from the base's memory"]
    for d in summary["domains"]:
        lines.append("")
        lines.append(f"{d}  ({summary['documents'][d]} documents; tokens per bucket "
                     + ", ".join(f"{n:,}" for n in summary["tokens"][d]) + ")")
        lines.append(row("", heads, 22, 26))
        for variant in exp.variants:
            for setting, values in summary["means"][variant][d].items():
                if setting.endswith("_std"):
                    continue
                std = summary["means"][variant][d].get(setting + "_std")
                cells = [f"{v:.3f}" + (f" ± {s:.3f}" if std else "") for v, s in zip(values, std or values)]
                lines.append(row(variant + " writes " + setting, cells, 22, 26))
        for key, label in (("on_minus_off", "on−off"), ("on_minus_doc", "on−doc")):
            for variant, by_d in summary["differences"].get(key, {}).items():
                lines.append(row(f"Δ {variant} {label}", [_fmt_diff(by_d[d], i) for i in range(len(heads))], 22, 26))
        for variant, by_d in summary["differences"]["minus_reference"].items():
            lines.append(row("Δ " + variant + "−" + summary["reference"], [_fmt_diff(by_d[d], i) for i in range(len(heads))],
                             22, 26))
    for variant, by_d in summary.get("beyond", {}).items():
        if not by_d:
            continue
        lines.append("")
        lines.append(f"Δ {variant}−{summary['reference']} beyond the window (positions {summary['window']}+, "
                     f"token-weighted), per seed {summary['seeds']}, mean [95 % t-interval over seeds]:")
        for d, m in by_d.items():
            per = " / ".join(f"{v:+.3f}" for v in m["values"])
            mean = f"{m['mean']:+.3f}" if math.isnan(m["std"]) else interval_text(m["mean"], *m["t95"], spec="+.3f")
            lines.append(f"  {d:<8s} {per:<28s} {mean}")
    if len(summary["seeds"]) > 1 and "whole" in summary:
        lines.append("")
        lines.append(f"loss over the whole split (token-weighted), mean over seeds {summary['seeds']} (range: "
                     f"largest − smallest seed; the base-to-base spread)")
        lines.append(row("", [*summary["domains"], "domain mean"], 22, 16))
        for variant, by_setting in summary["whole"].items():
            for setting, by_d in by_setting.items():
                columns = list(by_d.values()) + [[statistics.fmean(x) for x in zip(*by_d.values())]]
                cells = [f"{statistics.fmean(v):.3f} ({max(v) - min(v):.3f})" for v in columns]
                lines.append(row(variant + " writes " + setting, cells, 22, 16))
    lines.append("")
    lines.append("Δ: difference of mean losses, 95 % paired bootstrap interval over documents (one seed) or mean ± "
                 "std over seeds (k/n: seeds whose interval excludes 0); Δ v−reference compares v and the "
                 "reference each with its memory writing (if it has an FwPKM).")
    return "\n".join(lines)


def main(config: str, overrides: Sequence[str] = (), seeds: list[int] | None = None,
         variants: list[str] | None = None) -> int:
    run(load(config, seeds, variants, overrides))
    return 0
