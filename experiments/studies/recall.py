"""Associative recall beyond the attention window (issue 8): the same small model with and
without an FwPKM layer, trained on synthetic multi-query associative recall (`streams/recall.py`),
then scored by exact-match accuracy against the distance between the pairs and their queries.

    clp recall experiments/configs/recall.yaml                  # both variants, the file's seeds
    clp recall experiments/configs/recall.yaml --seeds 0,1,2

Training is ordinary Lightning training (`LMModule`, phase `pretrain`: slow weights trained
through the writes). The memory is episodic: the write rule's `persistence: reset_per_call`
gives every forward a freshly drawn memory, and evaluation reads one sequence per forward, so no
sequence can read another's pairs. In training, by default, the B sequences of a batch share one
memory, as in every FwPKM phase here: with 8 pairs of 64 keys their pairs collide only a little
(it costs training loss, not accuracy), with more pairs the memory holds a blur of the batch's
values and nothing is learned; `sequences_per_forward: 1` gives each its own (below).
Results: `<runs_root>/recall-<hash>/results.json` and a printed table.

Scaling (issue 22, `experiments/configs/recall_scale.yaml`): `pairs: [8, 16, 32, 64]` runs the
study once per pair count (each its own folder) and prints one table; a variant named `fwpkm@1`
puts its memory at layer 1, after an attention layer (`fwpkm-no-lookahead@1`: the look-ahead
ablation where attention could stand in for it); `sequences_per_forward: 1` trains each sequence
with a memory of its own, as it is evaluated (with the default 0, the B sequences of a batch
write one memory: with 64 shared keys their pairs collide, and beyond ~8 pairs nothing is
learned); `probe_every: N` scores 16 probe sequences at the longest distance every N steps,
giving the steps each variant needs to reach 90 %.

Composite keys (issue 53, `experiments/configs/recall_keys.yaml`): `recall: {key_tokens: m,
value_tokens: L}` makes keys of m symbols of `num_keys` (16: hex, 10: digits) and values of L
tokens (`streams/recall.py`); a query is scored by exact match of its whole value. `grid:
{num_keys: [16, 10], key_tokens: [1, 2, 4]}` runs the study once per combination of those recall
fields, as `pairs` does for the pair count. The variant `fwpkm-conv` is `fwpkm` with the short
causal convolution on attention's q, k, v (`ModelConfig.conv_kernel` = CONV_KERNEL).
`iterations: [1, 2, 3]` also scores the paper's n-iter reading (`read_iteratively`): from a fresh
memory, the context before the queries (pairs and filler) is read n − 1 times, each read ending
with one write over the whole context, then the whole sequence is read with writes off and its
queries scored; in-pass (the training mode, a write every `chunk` tokens) is scored as before.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from analysis.intervals import mean_and_std, mean_std
from cl_platform.atomic import atomic_write_json
from cl_platform.check import check, is_int, is_number
from experiments.studies.study import Study, check_seeds, load_study, study_folder
from streams.recall import RecallConfig

# fwpkm: the same model with an FwPKM layer at `fwpkm_layer`. The paper's ablations, one change
# each: -no-lookahead (value target y_t = v_t, not v_{t+1}), -no-gate (g = 1), -no-target-norm
# (values not z-scored), -no-addr-loss (λ = 0: the keys are never written).
ABLATIONS = {
    "fwpkm-no-lookahead": ("rule", {"lookahead": False}),
    "fwpkm-no-gate": ("arch", {"gate": False}),
    "fwpkm-no-target-norm": ("arch", {"target_norm": False}),
    "fwpkm-no-addr-loss": ("rule", {"addr_weight": 0.0}),
}
# Additions to the fwpkm variant, one each: -conv (the short convolution of GDN's token mixer).
CONV_KERNEL = 4  # GDN's
ADDITIONS = {
    "fwpkm-conv": ("model", {"conv_kernel": CONV_KERNEL}),
}
CHANGES = {**ABLATIONS, **ADDITIONS}
VARIANTS = ("attention", "fwpkm", *ABLATIONS, *ADDITIONS)
DEFAULT_VARIANTS = ("attention", "fwpkm", *ABLATIONS)  # what a config without `variants` runs, as before
PROBE_SEQUENCES = 16  # scored every `probe_every` steps at the longest distance


@dataclass
class RecallExperiment:
    recall: dict[str, Any] = field(default_factory=dict)  # RecallConfig fields
    variants: list[str] = field(default_factory=lambda: list(DEFAULT_VARIANTS))
    n_layer: int = 2
    d_model: int = 64
    n_head: int = 2
    window: int = 8  # attention window (tokens): every eval distance below is beyond it but 0
    fwpkm_layer: int = 0  # where the memory sits (a variant "name@L" puts its own at layer L)
    fwpkm: dict[str, Any] = field(default_factory=lambda: {"num_subkeys": 64, "d_key": 32, "d_value": 64})
    chunk: int = 16  # tokens per write
    steps: int = 400
    batch_size: int = 32
    lr: float = 3e-3
    eval_distances: list[int] = field(default_factory=lambda: [0, 16, 48, 96])
    eval_sequences: int = 64  # per distance
    seeds: list[int] = field(default_factory=lambda: [0])
    runs_root: str = "runs"
    sequences_per_forward: int = 0  # 0: a batch is one forward, one memory; k: k sequences a memory
    probe_every: int = 0  # steps between probes of accuracy during training; 0: none
    pairs: list[int] = field(default_factory=list)  # a grid over recall.num_pairs: one study each
    grid: dict[str, list] = field(default_factory=dict)  # recall field -> values: one study per combination
    iterations: list[int] = field(default_factory=list)  # n-iter readings scored beside in-pass; []: none

    def __post_init__(self) -> None:
        self.recall_config = RecallConfig(**self.recall)  # its own errors name recall.<field>
        bad = [v for v in self.variants if split_variant(v, self.fwpkm_layer)[0] not in VARIANTS or v.startswith("attention@")]
        check(not bad and bool(self.variants), self, "variants",
              f"has {bad or 'nothing'}; the variants are {list(VARIANTS)}, a memory variant with @<layer> to place it")
        for name in ("n_layer", "d_model", "n_head", "window", "chunk", "steps", "batch_size", "eval_sequences"):
            check(is_int(getattr(self, name), 1), self, name, "must be a positive int")
        check(is_int(self.fwpkm_layer, 0) and self.fwpkm_layer < self.n_layer, self, "fwpkm_layer",
              f"must be a layer index in 0..{self.n_layer - 1}")
        for v in self.variants:
            layer = split_variant(v, self.fwpkm_layer)[1]
            check(layer is not None and 0 <= layer < self.n_layer, self, "variants",
                  f"{v!r} places its memory at layer {layer}; the layers are 0..{self.n_layer - 1}")
        check(is_number(self.lr, 0, strict=True), self, "lr", "must be a number > 0")
        check_seeds(self)
        check(is_int(self.sequences_per_forward, 0) and self.sequences_per_forward <= self.batch_size, self,
              "sequences_per_forward", f"must be an int in 0..batch_size ({self.batch_size})")
        check(is_int(self.probe_every, 0), self, "probe_every", "must be an int >= 0")
        check(all(is_int(p, 1) for p in self.pairs) and len(set(self.pairs)) == len(self.pairs), self, "pairs",
              "must be a list of distinct positive ints")
        fields = [f.name for f in dataclasses.fields(RecallConfig)]
        check(isinstance(self.grid, dict) and all(k in fields for k in self.grid), self, "grid",
              f"must map recall fields ({fields}) to lists of values")
        check("num_pairs" not in self.grid or not self.pairs, self, "grid", "names num_pairs; give it there or in `pairs`, not both")
        check(all(isinstance(v, list) and v and len(set(map(repr, v))) == len(v) for v in self.grid.values()), self, "grid",
              "must give each field a non-empty list of distinct values")
        check(isinstance(self.iterations, list) and all(is_int(n, 1) for n in self.iterations)
              and len(set(self.iterations)) == len(self.iterations), self, "iterations", "must be a list of distinct ints >= 1")
        for config in [self.recall_config] + [p.recall_config for p in self.points()]:  # each raises naming recall.<field>
            for d in self.eval_distances:
                config.check_distance(d)

    def points(self) -> list["RecallExperiment"]:
        """The grid's experiments (`pairs` and `grid` crossed, in order), each with no grid of its
        own; [] without a grid."""
        axes = ({"num_pairs": self.pairs} if self.pairs else {}) | self.grid
        if not axes:
            return []
        combos = [{}]
        for name, values in axes.items():
            combos = [{**c, name: v} for c in combos for v in values]
        return [dataclasses.replace(self, recall={**self.recall, **c}, pairs=[], grid={}) for c in combos]

    def grid_axes(self) -> list[str]:
        return (["num_pairs"] if self.pairs else []) + list(self.grid)

    def at_pairs(self, num_pairs: int) -> "RecallExperiment":
        """The same experiment with `num_pairs` pairs: one point of the `pairs` grid."""
        return dataclasses.replace(self, recall={**self.recall, "num_pairs": num_pairs}, pairs=[], grid={})

    def identity(self) -> dict[str, Any]:
        """What names the results folder: every setting that changes a member's result. The
        fields added for the scaling study leave the identity unchanged at their defaults, so
        earlier results keep their folders."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("variants", "seeds", "runs_root", "pairs", "grid")}
        for name in ("sequences_per_forward", "probe_every", "iterations"):
            if not out[name]:
                del out[name]
        return out


def split_variant(variant: str, default_layer: int) -> tuple[str, int | None]:
    """("fwpkm-no-gate", 1) for "fwpkm-no-gate@1"; the experiment's `fwpkm_layer` without "@";
    layer None when the suffix is not an int."""
    name, at, layer = variant.partition("@")
    if not at:
        return name, default_layer
    return name, int(layer) if layer.isdigit() else None


def load(path: str | Path, seeds: list[int] | None = None, overrides: Sequence[str] = ()) -> RecallExperiment:
    """The experiment in a YAML file (fields of RecallExperiment) with `key=value` overrides;
    `seeds` replaces the file's."""
    return load_study(RecallExperiment, path, "recall config", overrides, seeds)


def model_config(exp: RecallExperiment, variant: str):
    from cl_platform.memory.fwpkm import FwPKMConfig
    from cl_platform.model import ModelConfig

    name, layer = split_variant(variant, exp.fwpkm_layer)
    kind, change = CHANGES.get(name, ("", {}))
    arch = {**exp.fwpkm, **(change if kind == "arch" else {})}
    return ModelConfig(vocab_size=exp.recall_config.vocab_size, n_layer=exp.n_layer, d_model=exp.d_model,
                       n_head=exp.n_head, window=exp.window, fwpkm=FwPKMConfig(**arch),
                       fwpkm_layers=[] if name == "attention" else [layer], **(change if kind == "model" else {}))


def accuracy_at(model, exp: RecallExperiment, distance: int, n: int, seed: int, health: dict | None = None) -> float:
    """Exact match of the queries' whole values (`streams.recall.exact_match`) in `n` fresh
    sequences with their queries `distance` tokens after their pairs, one sequence per forward
    (its own fresh memory), read in-pass."""
    import torch

    from streams.recall import exact_match, recall_batch

    test = recall_batch(exp.recall_config, n, [distance] * n, seed=seed)
    hits = total = 0
    with torch.no_grad():
        for i in range(n):
            ids, tgt = test["input_ids"][i:i + 1], test["targets"][i:i + 1]
            for layer in model.fwpkm_layers():
                layer.reset_read_counts()
            right, asked = exact_match(model(ids).argmax(-1), tgt, exp.recall_config.value_tokens)
            hits, total = hits + right, total + asked
            if health is not None:
                for layer in model.fwpkm_layers():  # addressing health of this sequence's reads
                    for name, value in layer.usage_stats().items():
                        health.setdefault(name, []).append(value)
    return hits / total


def read_iteratively(model, ids, context: int, iterations: Sequence[int], generator=None,
                     trace: list | None = None) -> dict[int, Any]:
    """The paper's n-iter reading of one sequence `ids` (1, T) for each n in `iterations`: from a
    fresh memory (drawn from `generator`), n − 1 reads of the first `context` tokens, each ending
    with one write over all of them (chunk = context), then a read of the whole sequence with
    writes off. Returns {n: logits (1, T, V)}. One chain serves every n: the n-iter read is taken
    at the state the (n − 1)-th write left, which the next write starts from. `trace` (a list)
    receives (kind, snapshot of the memory as the read starts) for every read, kind "write" or
    "read". The model's write rules and write switches are put back afterwards."""
    import torch

    layers = model.fwpkm_layers()
    rules, writing = model.write_rules(), [layer.writes_enabled for layer in layers]
    first = next(iter(rules.values()))
    model.set_write_rules(dataclasses.replace(first, chunk=max(context, 2), persistence="persist"),
                          {name: dataclasses.replace(rule, chunk=max(context, 2), persistence="persist")
                           for name, rule in rules.items()})
    model.reset_memory(generator)
    for layer in layers:  # the state is the memory and its read counts (since this sequence began)
        layer.reset_counters()
        layer.reset_read_counts()
    out = {}
    try:
        with torch.no_grad():
            for r in range(1, max(iterations) + 1):
                if r in iterations:
                    model.set_writes(False)
                    if trace is not None:
                        trace.append(("read", model.snapshot_memory()))
                    out[r] = model(ids)
                if r < max(iterations):
                    model.set_writes(True)
                    if trace is not None:
                        trace.append(("write", model.snapshot_memory()))
                    model(ids[:, :context])
    finally:
        model.set_write_rules(first, rules)
        for layer, on in zip(layers, writing):
            layer.writes_enabled = on
    for layer in layers:  # one write per extra read: the context is one chunk
        if layer.writes != max(iterations) - 1:
            raise AssertionError(f"{layer.name}: {max(iterations)}-iter reading wrote {layer.writes} times")
    return out


def iterative_accuracy(model, exp: RecallExperiment, distance: int, n: int, seed: int) -> dict[str, float]:
    """Exact match of n-iter reading for each n in `exp.iterations`, on the same `n` fresh sequences
    as `accuracy_at` with this seed; each sequence's fresh memory drawn from a generator seeded by
    `seed` and its index. {str(n): accuracy}."""
    import torch

    from streams.recall import exact_match, recall_batch

    cfg = exp.recall_config
    test = recall_batch(cfg, n, [distance] * n, seed=seed)
    hits = {k: 0 for k in exp.iterations}
    total = 0
    for i in range(n):
        ids, tgt = test["input_ids"][i:i + 1], test["targets"][i:i + 1]
        logits = read_iteratively(model, ids, cfg.queries_at(distance), exp.iterations,
                                  generator=torch.Generator().manual_seed(seed * 100_003 + i))
        for k, lg in logits.items():
            right, asked = exact_match(lg.argmax(-1), tgt, cfg.value_tokens)
            hits[k] += right
        total += asked
    return {str(k): hits[k] / total for k in exp.iterations}


def train_and_score(exp: RecallExperiment, variant: str, seed: int) -> dict[str, Any]:
    """Train one variant from seed `seed`; accuracy per eval distance on fresh sequences."""
    import lightning as L
    import torch
    from torch.utils.data import DataLoader

    from cl_platform.lm_module import LMModule, OptimSettings
    from cl_platform.memory.fwpkm import WriteRule
    from cl_platform.model import FwPKMLM
    from cl_platform.device import Placement
    from cl_platform.trainer import make_trainer, quiet_lightning
    from streams.recall import recall_batch

    quiet_lightning()
    cfg = exp.recall_config
    torch.manual_seed(seed)
    kind, change = CHANGES.get(split_variant(variant, exp.fwpkm_layer)[0], ("", {}))
    rule = WriteRule(chunk=exp.chunk, persistence="reset_per_call", **(change if kind == "rule" else {}))
    model = FwPKMLM(model_config(exp, variant), rule)
    # Training sequences put their queries at the end of the segment (the longest distance);
    # evaluation asks at other distances too. Training at uniformly drawn distances did not learn
    # in 300 steps (loss stayed at ln 64; experiments/LOG.md).
    n = exp.steps * exp.batch_size
    data = recall_batch(cfg, n, [cfg.max_distance] * n, seed=1000 + seed)
    rows = [{"input_ids": data["input_ids"][i], "targets": data["targets"][i]} for i in range(n)]
    # A model without a memory has nothing to keep apart: one forward a batch, the same gradient.
    grouped = exp.sequences_per_forward if model.fwpkm_layers() else 0
    module = LMModule(model, phase="pretrain", seed=seed, sequences_per_forward=grouped,
                      optim=OptimSettings(lr=exp.lr, weight_decay=0.0, grad_clip=1.0,
                                          warmup_steps=exp.steps // 20, decay_steps=exp.steps))
    curve: list[list[float]] = []

    class Probe(L.Callback):
        # Scores the probe set every `probe_every` steps (and after the last); eval mode, no
        # gradient and a fresh memory per sequence, so training is not changed by it.
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            step = pl_module.position.step
            if step % exp.probe_every == 0 or step == exp.steps:
                model.eval()
                curve.append([step, accuracy_at(model, exp, cfg.max_distance, PROBE_SEQUENCES, seed=20_000 + seed)])
                model.train()

    callbacks = [Probe()] if exp.probe_every else []
    make_trainer(Placement(), callbacks, logger=False, progress_bar=False).fit(module, DataLoader(rows, batch_size=exp.batch_size))
    train_loss = module.last_losses["lm"]
    model.eval()
    health: dict[str, list[float]] = {}
    accuracy = {str(d): accuracy_at(model, exp, d, exp.eval_sequences, seed=10_000 + 7 * seed + d, health=health)
                for d in exp.eval_distances}
    out = {"variant": variant, "seed": seed, "final_train_loss": train_loss, "accuracy": accuracy,
           "addressing": {name: statistics.fmean(values) for name, values in health.items()}}
    if exp.iterations and model.fwpkm_layers():  # the same sequences as `accuracy` (its seeds)
        out["iterations"] = {str(d): iterative_accuracy(model, exp, d, exp.eval_sequences, seed=10_000 + 7 * seed + d)
                             for d in exp.eval_distances}
    if exp.probe_every:
        out["probe_curve"] = curve
        out["steps_to_90"] = next((step for step, acc in curve if acc >= 0.9), None)
    return out


def run(exp: RecallExperiment, say: Callable[[str], None] = print) -> tuple[Path, dict[str, Any]]:
    """Every (variant, seed), each saved as it finishes; a re-run skips the finished ones. With a
    `pairs` grid: every pair count in turn; returns the last folder and {pairs: summary}."""
    points = exp.points()
    if points:
        summaries = {}
        for point in points:
            values = tuple(point.recall[name] for name in exp.grid_axes())
            key = values[0] if len(values) == 1 else values  # a `pairs` grid keys by the pair count
            folder, summaries[key] = run_one(point, say=lambda line: None if line.startswith("results") else say(line))
        say(grid_table(exp, summaries))
        return folder, summaries
    return run_one(exp, say)


class Recall(Study):
    """Members: every (variant, seed), trained from scratch; one folder per setting, so adding a
    variant or a seed trains only what is new."""

    prefix = "recall"

    def folder(self) -> Path:
        identity = self.exp.identity()
        folder = study_folder(self.exp.runs_root, self.prefix, identity)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(folder / "config.json", identity)  # what the folder's hash is of, readable
        return folder

    def members(self) -> list[tuple[str, int]]:
        return [(v, s) for v in self.exp.variants for s in self.exp.seeds]

    def score(self, name: str, seed: int, say: Callable[[str], None]) -> dict[str, Any]:
        exp = self.exp
        say(f"training {name}, seed {seed} ({exp.recall_config.num_pairs} pairs; {exp.steps} steps of {exp.batch_size} sequences)")
        return train_and_score(exp, name, seed)

    def summarise(self, results: list[dict]) -> dict[str, dict[str, Any]]:
        """{variant: {distance: [mean, std]}} over seeds (std 0 for one seed); with probes, also
        "steps_to_90": [per seed, None where the probe never reached 90 %]."""
        out: dict[str, dict[str, Any]] = {}
        for variant in self.exp.variants:
            runs = [r for r in results if r["variant"] == variant]
            out[variant] = {d: list(mean_and_std([r["accuracy"][d] for r in runs])) for d in map(str, self.exp.eval_distances)}
            if self.exp.probe_every:
                out[variant]["steps_to_90"] = [r.get("steps_to_90") for r in runs]
            if self.exp.iterations and all("iterations" in r for r in runs):
                # n-iter exact match by distance (mean, std), and every reading's t-interval over seeds.
                readings = {"in-pass": lambda r, d: r["accuracy"][d]}
                readings |= {f"{n}-iter": (lambda r, d, n=n: r["iterations"][d][str(n)]) for n in self.exp.iterations}
                for name, value in list(readings.items())[1:]:
                    out[variant][name] = {d: list(mean_and_std([value(r, d) for r in runs])) for d in map(str, self.exp.eval_distances)}
                out[variant]["over_seeds"] = {name: {d: _finite(mean_std([value(r, d) for r in runs]))
                                                     for d in map(str, self.exp.eval_distances)}
                                              for name, value in readings.items()}
        return out

    def table(self, summary: dict[str, Any]) -> str:
        cfg, exp = self.exp.recall_config, self.exp
        head = (f"recall accuracy (exact match at the query positions; chance {_chance(cfg)}; attention window "
                f"{exp.window}; {cfg.num_pairs} pairs; mean ± std over seeds {exp.seeds})")
        lines = [head, f"{'distance':>22s} {_columns(exp)}"]
        for variant, by_d in summary.items():
            lines.append(f"{variant:>22s} {_cells(exp, by_d)}")
            lines += [f"{f'{n}-iter':>22s} {_cells(exp, by_d[f'{n}-iter'], probes=False)}" for n in exp.iterations if f"{n}-iter" in by_d]
        return "\n".join(lines)

    def outputs(self, results: list[dict], summary: dict[str, Any]) -> dict[str, Any]:
        return {"runs": results, "summary": summary}


def run_one(exp: RecallExperiment, say: Callable[[str], None]) -> tuple[Path, dict[str, Any]]:
    return Recall(exp).run(say)


def _columns(exp: RecallExperiment) -> str:
    return " ".join(f"{d:>13d}" for d in exp.eval_distances) + ("   steps to 90 %" if exp.probe_every else "")


def _chance(cfg) -> str:
    """Exact match by guessing a value: 1 / num_values per token (printed as before for one token)."""
    p = cfg.num_values ** -cfg.value_tokens
    return f"{p:.3f}" if cfg.value_tokens == 1 else f"{p:.1e}"


def _finite(stat: dict[str, Any]) -> dict[str, Any]:
    """A `mean_std` with its NaNs (one seed) as None, for JSON."""
    def fix(x):
        return [fix(v) for v in x] if isinstance(x, list) else (None if isinstance(x, float) and x != x else x)
    return {k: fix(v) for k, v in stat.items()}


def _cells(exp: RecallExperiment, by_d: dict[str, Any], probes: bool = True) -> str:
    """One variant's accuracy by distance (mean ± std), then the steps to 90 % per seed ("-": never)."""
    cells = " ".join(f"{by_d[str(d)][0]:6.3f} ± {by_d[str(d)][1]:4.3f}" for d in exp.eval_distances)
    if exp.probe_every and probes:
        cells += "   " + "/".join("-" if v is None else str(v) for v in by_d["steps_to_90"])
    return cells


def grid_table(exp: RecallExperiment, summaries: dict[int, dict]) -> str:
    """One row per (variant, grid point): accuracy by distance, and the steps to 90 % per seed;
    with `iterations`, a row per n-iter reading under each."""
    cfg = exp.recall_config
    axes = exp.grid_axes()
    labels = ["pairs" if a == "num_pairs" else a for a in axes]
    what = "the number of pairs" if axes == ["num_pairs"] else ", ".join(labels)
    keys = "" if "num_keys" in axes else f"{cfg.num_keys} keys, "  # a grid's own values are in the rows
    lines = [f"recall against {what} (seq_len {cfg.seq_len}, {keys}chance "
             f"{_chance(cfg)}, window {exp.window}, {exp.steps} steps of {exp.batch_size}, sequences per "
             f"forward {exp.sequences_per_forward or exp.batch_size}; mean ± std over seeds {exp.seeds})",
             f"{'variant':>22s} " + " ".join(f"{a:>5s}" for a in labels) + f" {_columns(exp)}"]
    for variant in exp.variants:
        for key, summary in summaries.items():
            values = key if isinstance(key, tuple) else (key,)
            point = " ".join(f"{str(v):>{max(5, len(a))}s}" for v, a in zip(values, labels))
            lines.append(f"{variant:>22s} {point} {_cells(exp, summary[variant])}")
            lines += [f"{f'{n}-iter':>22s} {' ' * len(point)} {_cells(exp, summary[variant][f'{n}-iter'], probes=False)}"
                      for n in exp.iterations if f"{n}-iter" in summary[variant]]
    return "\n".join(lines)


def main(config: str, overrides: Sequence[str] = (), seeds: list[int] | None = None) -> int:
    run(load(config, seeds, overrides))
    return 0
