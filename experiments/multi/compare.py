"""`clp compare COMPARE.yaml`: strategies side by side on the same stream, base and seeds.

    clp compare experiments/configs/compare_strategies.yaml
    clp compare experiments/configs/compare_strategies.yaml --entries naive,replay --seeds 0
    clp compare experiments/configs/compare_strategies.yaml 'orders=[[math,law,code,web],[code,web,math,law]]'
    clp compare experiments/configs/compare_strategies.yaml runs_root=/scratch/runs cl.batch_size=4   # every member

The file names a run config (`run`), the seeds, and the entries: each a list of dotted overrides
of that run config (`strategy.name=replay`, `cl.mode=finetune`, ...). A command-line override
whose key is not a field of this file is the run config's, applied to every member first
(`run_overrides`). Every (entry, seed) is an
ordinary run (`experiments/run.py:execute`, its own folder, TensorBoard events and resume), all
on the run config's cached base; a re-run finds finished members and continues killed ones, so
the same command resumes a stopped comparison. Then per entry: mean ± std over seeds of the
headline metrics (`analysis.metrics.summary`), the extra compute (training + evaluation wall time
relative to the first entry of the same mode) and the strategy's state size and the training data it keeps (replay's tokens); and, with more than
one member an entry, each entry's paired difference from the first entry (member by member: the
same base and seed), mean and 95 % t-interval over the pairs. The pairs are what tell strategies
apart when the bases differ more than the strategies do (over `base_seeds`, the interval is
between bases). Every pair also gets a paired bootstrap over the evaluation documents both runs
scored (`vs_first_documents`, within one base), which is the printed interval when an entry has
one member. Printed and written as `comparison.json` / `comparison.csv` / `comparison.txt`
under `<runs_root>/compare-<name>-<hash>/`.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from analysis.bootstrap import few_documents_note
from analysis.metrics import COMPARISON_TABLE, METRICS as REGISTRY
from analysis.paired import (FRACTIONS, difference_cells, fraction_cells, interval_label, is_within, paired_rows,
                             percent_cell)
from analysis.table import ONE_SEED, interval, number
from cl_platform.atomic import atomic_write_json, atomic_write_text
from cl_platform.check import ConfigError, apply_overrides, check, from_mapping, is_int, read_yaml, split_overrides

# The table's metric columns, in order: the registry's comparison subset (analysis.metrics).
METRICS = COMPARISON_TABLE


@dataclass
class Comparison:
    run: str = "default.yaml"  # the run config every entry starts from, relative to this file
    entries: dict[str, list[str]] = field(default_factory=dict)  # name -> dotted overrides
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    # Base models (`pretrain.seed`), each pretrained once and cached; null = the run config's own
    # base. With a fixed base most strategies are deterministic (naive, slot freezing, distill:
    # the run seed changes nothing), so the spread worth quoting comes from the base.
    base_seeds: list[int] | None = None
    # Domain orders (each a permutation of the run config's stream order), a dimension of the
    # comparison like the bases: every entry runs every order, and pairs are matched on it, so the
    # paired interval covers how a strategy's effect depends on the order. null = the run's order.
    orders: list[list[str]] | None = None
    name: str = "strategies"
    # Run-config overrides every member gets, before its entry's (`clp compare FILE runs_root=DIR`:
    # a command-line key that is not a field of this file), as if written into the run config.
    run_overrides: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check(isinstance(self.entries, dict) and bool(self.entries), self, "entries",
              "must map entry names to lists of dotted overrides (e.g. [strategy.name=replay])")
        for entry, overrides in self.entries.items():
            check(isinstance(overrides, list) and all(isinstance(o, str) and "=" in o for o in overrides), self,
                  "entries", f"entry {entry!r} must be a list of 'key=value' overrides, got {overrides!r}")
        check(bool(self.seeds) and all(is_int(s) for s in self.seeds) and len(set(self.seeds)) == len(self.seeds),
              self, "seeds", "must be a non-empty list of distinct ints")
        check(self.base_seeds is None or (isinstance(self.base_seeds, list) and bool(self.base_seeds)
                                          and all(is_int(s) for s in self.base_seeds)
                                          and len(set(self.base_seeds)) == len(self.base_seeds)),
              self, "base_seeds", "must be null or a non-empty list of distinct ints")
        check(self.orders is None or (isinstance(self.orders, list) and bool(self.orders) and all(
            isinstance(o, list) and o and all(isinstance(d, str) for d in o) for o in self.orders)
            and len({tuple(o) for o in self.orders}) == len(self.orders)),
              self, "orders", "must be null or a non-empty list of distinct domain orders (lists of domain names)")
        check(isinstance(self.run_overrides, list) and all(isinstance(o, str) and "=" in o for o in self.run_overrides),
              self, "run_overrides", "must be a list of 'key=value' run-config overrides")

    def members(self) -> list[tuple[int | None, tuple[str, ...] | None, int]]:
        """(base seed or None, domain order or None, run seed) of every member of an entry, in run order."""
        orders = [tuple(o) for o in self.orders] if self.orders is not None else [None]
        return [(b, o, s) for b in (self.base_seeds or [None]) for o in orders for s in self.seeds]


def member_overrides(base: int | None, order: tuple[str, ...] | None, seed: int) -> list[str]:
    return ([f"seed={seed}"] + ([] if base is None else [f"pretrain.seed={base}"])
            + ([] if order is None else [f"order=[{','.join(order)}]"]))


def member_key(m: dict) -> tuple:
    """What pairs two entries' members: the same base, order and seed."""
    return m.get("base_seed"), tuple(m["order"]) if m.get("order") else None, m["seed"]


def check_orders(comp: Comparison, stream_order: list[str]) -> None:
    """Every order streams the run's domains, each as often: otherwise the entries' metrics would
    average over different experiences and the pairs would compare nothing."""
    for i, order in enumerate(comp.orders or []):
        if sorted(order) != sorted(stream_order):
            raise ConfigError(f"comparison config field 'orders': orders[{i}] {order} is not a permutation of the "
                              f"stream's domains {stream_order} (run config {comp.run})", field="orders")


def load(path: str | Path, seeds: list[int] | None = None, entries: list[str] | None = None,
         base_seeds: list[int] | None = None, overrides: Sequence[str] = ()) -> Comparison:
    path = Path(path)
    overrides, run_overrides = split_overrides(overrides, Comparison)
    data = apply_overrides(read_yaml(path, "comparison config"), overrides, "comparison config")
    data.setdefault("run_overrides", [])
    data["run_overrides"] = [*data["run_overrides"], *run_overrides]
    if seeds is not None:
        data["seeds"] = seeds
    if base_seeds is not None:
        data["base_seeds"] = base_seeds
    from experiments.config_files import keep_named, relative_to

    keep_named(data, "entries", entries, "--entries", path)
    comp = from_mapping(Comparison, data, f"comparison config {path}", whole_file=True)
    comp.run = relative_to(path, comp.run, "run", overrides)
    return comp


def state_bytes(folder: Path) -> int | None:
    """Size of the strategy's saved state in the run's last checkpoint (None without one). Read as
    every checkpoint is (cl_platform.checkpoint: tensors, numbers, strings and containers only),
    since sweep workers and colleagues share run folders: a pickled object is refused, never run."""
    import torch

    from cl_platform.checkpoint import load_checkpoint

    ckpt = folder / "checkpoints" / "last.ckpt"
    if not ckpt.is_file():
        return None
    state = load_checkpoint(ckpt, "run").get("strategy", {})
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.tell()


def stored_tokens(folder: Path) -> int:
    """Tokens of training data the run's strategy keeps (replay's buffer), summed over the
    `stored_tokens` its `strategy.json` reports (a composite nests them); 0 when none does:
    the model's own samples, slot masks and slow banks are not data."""
    path = folder / "strategy.json"
    if not path.is_file():
        return 0

    def total(node: Any) -> int:
        if isinstance(node, dict):
            return sum(int(v) if k == "stored_tokens" else total(v) for k, v in node.items())
        return 0

    return total(json.loads(path.read_text(encoding="utf-8")))


def run(comp: Comparison, say: Callable[[str], None] = print, progress_bar: bool = False) -> tuple[Path, dict]:
    from analysis.metrics import summary
    from cl_platform.config import load_config
    from experiments.run import execute
    from experiments.setup import load_setup, make_strategy

    # Every entry's config and strategy, and every order, are checked before anything trains.
    common = list(comp.run_overrides)
    for entry, overrides in comp.entries.items():
        try:
            setup = load_setup(comp.run, [*common, *overrides])
            make_strategy(setup)
        except ConfigError as err:
            raise ConfigError(f"comparison entry {entry!r}: {err}") from None
        check_orders(comp, setup.scenario.config.experience_domains)
    from experiments.multi.seeds import check_given_bases

    check_given_bases(comp.run, common, comp.base_seeds)
    members: dict[str, list[dict[str, Any]]] = {}
    outcomes: dict[str, list[Any]] = {}  # each member's RunResults, in member order
    for entry, overrides in comp.entries.items():
        for base, order, seed in comp.members():
            extra = member_overrides(base, order, seed)
            say(f"--- {entry}, seed {seed}" + ("" if base is None else f", base seed {base}")
                + ("" if order is None else f", order {' -> '.join(order)}"))
            folder, results, _ = execute(comp.run, [*common, *overrides, *extra], resume=True,
                                         progress_bar=progress_bar, say=say)
            record = json.loads((folder / "run.json").read_text())
            timings = record.get("timings", {})
            seconds = sum(e.get("train", 0.0) + e.get("eval", 0.0) for e in timings.get("experiences", []))
            cfg = load_config(comp.run, [*common, *overrides, *extra])
            member = {"seed": seed, "folder": str(folder), "mode": cfg.cl.mode, "strategy": cfg.strategy_name,
                      "summary": summary(results), "seconds": seconds, "state_bytes": state_bytes(folder),
                      "stored_tokens": stored_tokens(folder)}
            if base is not None:
                member["base_seed"] = base
            if order is not None:
                member["order"] = list(order)
            members.setdefault(entry, []).append(member)
            outcomes.setdefault(entry, []).append(results)
    document_differences(members, outcomes)
    table = summarise(comp, members)
    digest = hashlib.sha256("\0".join(m["folder"] for ms in members.values() for m in ms).encode()).hexdigest()[:12]
    out = Path(load_config(comp.run, common).runs_root) / f"compare-{comp.name}-{digest}"
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "comparison.json", {"entries": table, "members": members, "seeds": comp.seeds,
                                                "base_seeds": comp.base_seeds, "orders": comp.orders})
    atomic_write_text(out / "comparison.csv", to_csv(table))
    text = format_table(table, comp.seeds, comp.base_seeds, comp.orders)
    first = next(iter(outcomes.values()))[0]
    note = few_documents_note({d: len(docs) for d, docs in first.doc_losses.get("0", {}).items()})
    if note is not None and is_within(table):  # the printed intervals are over these documents
        text += f"\n  intervals {note}"
    atomic_write_text(out / "comparison.txt", text + "\n")
    say(text)
    say(f"comparison: {out}/comparison.json (+ .csv, .txt)")
    say(f"report: clp report {out}   (HTML + Markdown into {out / 'report'}/)")
    return out, table


def document_differences(members: dict[str, list[dict]], outcomes: dict[str, list[Any]]) -> None:
    """Each member of every entry but the first gets `vs_first_documents`: its difference from the
    first entry's member of the same base and seed, with a paired bootstrap over the evaluation
    documents both scored (analysis/bootstrap.py) — the interval within one base, which is all a
    single-base comparison has."""
    from analysis.bootstrap import difference_bootstrap

    first, *others = members
    for entry in others:
        for ref, m, a, b in zip(members[first], members[entry], outcomes[first], outcomes[entry]):
            if member_key(ref) != member_key(m):
                raise ValueError(f"compare: entries {first!r} and {entry!r} ran their members in another order")
            diff = difference_bootstrap(a, b)["metrics"]
            m["vs_first_documents"] = {k: {"vs": first, **diff[k]} for k in METRICS if k in diff}


def _stat(values: list[float]) -> dict[str, float]:
    values = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not values:
        return {"mean": math.nan, "std": math.nan}
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else math.nan}


def summarise(comp: Comparison, members: dict[str, list[dict]]) -> dict[str, dict[str, Any]]:
    """Per entry: mean ± std over seeds of METRICS, final perplexity, seconds relative to the
    first entry of the same mode, and the strategy state size."""
    reference: dict[str, float] = {}
    out: dict[str, dict[str, Any]] = {}
    for entry, ms in members.items():
        row: dict[str, Any] = {"mode": ms[0]["mode"], "strategy": ms[0]["strategy"], "seeds": [m["seed"] for m in ms]}
        if any("base_seed" in m for m in ms):
            row["base_seeds"] = [m.get("base_seed") for m in ms]
        if any("order" in m for m in ms):
            row["orders"] = [m.get("order") for m in ms]
        for metric in METRICS:
            row[metric] = _stat([m["summary"][metric] for m in ms])
        row["final_perplexity"] = _stat([math.exp(m["summary"]["average_final"]) for m in ms])
        seconds = statistics.fmean(m["seconds"] for m in ms)
        reference.setdefault(row["mode"], seconds)
        row["seconds"] = seconds
        row["relative_compute"] = seconds / reference[row["mode"]] if reference[row["mode"]] else math.nan
        sizes = [m["state_bytes"] for m in ms if m["state_bytes"] is not None]
        row["state_bytes"] = max(sizes) if sizes else None  # None: no member kept a checkpoint
        row["stored_tokens"] = max(m.get("stored_tokens", 0) for m in ms)
        out[entry] = row
    first, *others = members
    for entry in others:
        out[entry]["vs_first"] = paired(members[first], members[entry], first, entry)
        if len(members[entry]) == 1 and "vs_first_documents" in members[entry][0]:
            out[entry]["vs_first_documents"] = members[entry][0]["vs_first_documents"]
        out[entry]["relative"] = relative(members[first], members[entry])
    return out


def relative(a: list[dict], b: list[dict]) -> dict[str, dict[str, Any]]:
    """B against A as fractions, the terms continual-learning targets are set in: the cut in
    average forgetting, 1 − F_B / F_A, and the adaptation gain kept, G_B / G_A.

    The unit is the base (with several): each base's ratio of its members' means, so orders and
    seeds of one base count once, and the t-interval is over the bases. With one base and several
    members (orders, seeds), each pair is a unit. With one pair, the interval is the paired
    bootstrap over the documents both runs scored (`vs_first_documents`), divided by A's value,
    which is held fixed — a within-base interval, labelled so where it is printed."""
    from analysis.aggregate import mean_std

    bases = sorted({m.get("base_seed") for m in b}, key=str)
    if len(bases) > 1:
        groups = [([m for m in a if m.get("base_seed") == base], [m for m in b if m.get("base_seed") == base])
                  for base in bases]
    else:
        by_key = {member_key(m): m for m in a}
        groups = [([by_key[member_key(m)]], [m]) for m in b]
    unit = "base" if len(bases) > 1 else "pair"

    def mean(ms: list[dict], metric: str) -> float:
        return statistics.fmean(m["summary"][metric] for m in ms)

    out: dict[str, dict[str, Any]] = {}
    for name, metric, ratio in (("forgetting_cut", "average_forgetting", lambda x, y: 1 - x / y),
                                ("gain_kept", "adaptation_gain", lambda x, y: x / y)):
        if any(mean(ga, metric) == 0 for ga, _ in groups):
            continue  # nothing to be a fraction of
        out[name] = {"unit": unit, **mean_std([ratio(mean(gb, metric), mean(ga, metric)) for ga, gb in groups])}
        docs = b[0].get("vs_first_documents", {}).get(metric) if len(b) == 1 else None
        if docs is not None:
            ref = a[0]["summary"][metric]
            ends = sorted(ratio(ref + d, ref) for d in (docs["low"], docs["high"]))
            out[name]["documents"] = {"low": ends[0], "high": ends[1]}
    return out


def paired(a: list[dict], b: list[dict], name_a: str, name_b: str) -> dict[str, dict[str, Any]]:
    """Per metric, B − A member by member (matched on base seed, order and seed): mean, std, t-interval."""
    from analysis.aggregate import mean_std

    key = member_key
    by_key = {key(m): m for m in a}
    if sorted(by_key, key=str) != sorted((key(m) for m in b), key=str):
        raise ValueError(f"compare: entries {name_a!r} and {name_b!r} do not have the same members to pair")
    out = {}
    bases = sorted({m.get("base_seed") for m in b}, key=str)
    for metric in METRICS:
        diffs = [m["summary"][metric] - by_key[key(m)]["summary"][metric] for m in b]
        if not any(math.isnan(d) for d in diffs):
            out[metric] = {"vs": name_a, **mean_std(diffs)}
            if len(bases) > 1 and len(diffs) > len(bases):
                # Several orders (or seeds) per base are not independent draws: the interval a
                # reviewer can trust is over the bases, each the mean of its own pairs.
                per_base = [statistics.fmean(d for d, m in zip(diffs, b) if m.get("base_seed") == base) for base in bases]
                out[metric]["over_bases"] = mean_std(per_base)
    return out


def to_csv(table: dict[str, dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["entry", "mode", "strategy", *[f"{m}_{s}" for m in (*METRICS, "final_perplexity") for s in ("mean", "std")],
                "seconds", "relative_compute", "state_bytes", "stored_tokens"])
    for entry, row in table.items():
        w.writerow([entry, row["mode"], row["strategy"],
                    *[row[m][s] for m in (*METRICS, "final_perplexity") for s in ("mean", "std")],
                    row["seconds"], row["relative_compute"], row["state_bytes"], row["stored_tokens"]])
    return buf.getvalue()


def format_table(table: dict[str, dict[str, Any]], seeds: list[int], base_seeds: list[int] | None = None,
                 orders: list[list[str]] | None = None) -> str:
    # The registry's column heads, "average" abbreviated to fit the 20-character columns.
    heads = [*[REGISTRY[m].column_label.replace("average", "avg") for m in METRICS], "final ppl", "compute", "state",
             "data kept"]
    over = " x ".join(([] if base_seeds is None else [f"base seeds {base_seeds}"])
                      + ([] if orders is None else [f"{len(orders)} orders"]) + [f"seeds {seeds}"])
    undefined: dict[str, str] = {}  # column head -> why a cell of it is n/a

    def cell(stat: dict[str, float], spec: str, head: str, why: str = "") -> str:
        # Printed text never reads `nan`: a metric the stream cannot define, a spread over one seed.
        if math.isnan(stat["mean"]):
            undefined[head] = why
            return "n/a"
        return f"{stat['mean']:{spec}} ± {number(stat['std'], spec.lstrip('+'), ONE_SEED)}"

    body = []
    for entry, row in table.items():
        cells = [cell(row[m], "+.4f", h, REGISTRY[m].undefined_text) for m, h in zip(METRICS, heads)]
        cells.append(cell(row["final_perplexity"], ".1f", "final ppl"))
        cells.append(f"{row['relative_compute']:.2f}x" if math.isfinite(row["relative_compute"]) else "n/a")
        # No checkpoint to measure the strategy's state in: the run kept none (cl.keep_checkpoints).
        cells.append("n/a (no checkpoint)" if row["state_bytes"] is None else f"{row['state_bytes'] / 1e6:.2f} MB")
        cells.append(f"{row['stored_tokens']:,} tokens" if row.get("stored_tokens") else "none")
        body.append((entry, row["mode"], cells))
    width = max([20, *(len(c) + 2 for _, _, cells in body for c in cells)])
    lines = [f"strategies, mean ± std over {over} (loss in nats; compute: train + eval time relative to "
             f"the first entry of the same mode)",
             f"{'entry':>18s} {'mode':>9s} " + "".join(f"{h:>{width}s}" for h in heads)]
    lines += [f"{entry:>18s} {mode:>9s} " + "".join(f"{c:>{width}s}" for c in cells) for entry, mode, cells in body]
    lines += [f"  {head}: {why}" for head, why in undefined.items() if why]
    rows = paired_rows(table)
    if rows:
        first = next(iter(table))
        within = is_within(table)
        lines += ["", f"paired differences from {first} (entry − {first}, member by member: "
                      f"{'value' if within else 'mean'} [{interval_label(table, len(base_seeds or []))}])",
                  f"{'entry':>18s} " + "".join(f"{h:>28s}" for h in heads[:len(METRICS)])]
        for entry, row in rows:
            stats = difference_cells(row, within)
            cells = [f"{stats[m][0]:+.4f} {interval(stats[m][1], stats[m][2], '+.3f')}"
                     if m in stats and not math.isnan(stats[m][0]) else "n/a" for m in METRICS]
            lines.append(f"{entry:>18s} " + "".join(f"{c:>28s}" for c in cells))
        if any(row.get("relative") for _, row in rows):
            fixed = f"; the documents' interval over {first}'s value, held fixed" if within else ""
            lines += ["", f"relative to {first} (forgetting cut = 1 − forgetting / {first}'s, gain kept = gain / "
                          f"{first}'s; with several bases each base's ratio of its members' means; "
                          f"{interval_label(table, len(base_seeds or []))}{fixed})",
                      f"{'entry':>18s} " + "".join(f"{h:>25s}" for h in FRACTIONS.values())]
            for entry, row in rows:
                fr = fraction_cells(row, within)
                cells = [percent_cell(fr[n]) if n in fr else "n/a" for n in FRACTIONS]
                lines.append(f"{entry:>18s} " + "".join(f"{c:>25s}" for c in cells))
    return "\n".join(lines)


def main(config: str, overrides: Sequence[str] = (), seeds: list[int] | None = None,
         entries: list[str] | None = None, base_seeds: list[int] | None = None) -> int:
    run(load(config, seeds, entries, base_seeds, overrides))
    return 0
