"""The skeleton every study (`clp recall`, `clp eval`, `clp repeat`, `clp niah`) is built on, as
a strategy is built on its hooks (after nanochat's `tasks/common.py` `Task`): a study is a config
dataclass plus a `Study` subclass that says what to run (`members`) and how to run one (`score`),
and how the members read together (`summarise`, `table`); `Study.run` does the rest.

    class Domainloss(Study):
        prefix = "domainloss"
        def members(self): return [("fwpkm", s) for s in self.exp.seeds]
        def score(self, name, seed, say): return {"loss": ...}
        def summarise(self, results): return {"mean": mean_and_std([r["loss"] for r in results])}
        def table(self, summary): return row("fwpkm", [f"{summary['mean'][0]:.3f}"], 10, 8)

    folder, summary = Domainloss(load_study(DomainLoss, path, "domainloss config")).run()

What the skeleton owns: typed loading with `key=value` overrides (`load_study`: the same checks as
the file), the members' results cached one JSON file each in the study's folder (`cached`: adding
a member computes only what is new, a killed study keeps every finished one), the folder keyed by
`cl_platform.config.config_hash` of what determines the members' results (`study_folder`; never
the YAML's text: a comment is not a setting), the outputs rebuilt from the members at every run
and written atomically (`write_results`), the loop over the family's base seeds (`each_base`),
the seeds check every config makes (`check_seeds`) and the one row layout of every table (`row`).
The intervals are `analysis/intervals.py`'s.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from cl_platform.atomic import atomic_write_json, atomic_write_text
from cl_platform.check import ConfigError, apply_overrides, check, from_mapping, is_int, read_yaml
from cl_platform.config import config_hash
from experiments.config_files import keep_named


def load_study(cls: type, path: str | Path, what: str, overrides: Sequence[str] = (), seeds: list[int] | None = None,
               subset: tuple[str, Sequence[str] | None, str] | None = None) -> Any:
    """Dataclass `cls` from the YAML file `path` (a `what`, for messages): file, then `key=value`
    overrides, then `seeds` (the `--seeds` sugar), then `subset` = (field, names, flag) keeping
    only those entries of a mapping field (`--variants a,b`); every error names the file."""
    path = Path(path)
    data = apply_overrides(read_yaml(path, what), overrides, what)
    if seeds is not None:
        data["seeds"] = seeds
    if subset is not None:
        keep_named(data, *subset, path)
    return from_mapping(cls, data, f"{what} {path}", whole_file=True)


def study_folder(runs_root: str | Path, prefix: str, identity: dict[str, Any]) -> Path:
    """`<runs_root>/<prefix>-<config_hash(identity)[:12]>`: one folder per setting of a study."""
    return Path(runs_root) / f"{prefix}-{config_hash(identity)[:12]}"


def cached(folder: Path, name: str, seed: int, compute: Callable[[], dict[str, Any]],
           fresh: Callable[[dict[str, Any]], bool] = lambda result: True) -> dict[str, Any]:
    """Member (name, seed)'s result: read from `<folder>/<name>-seed<seed>.json` if it is there
    and `fresh(result)` (e.g. made from the same base), else computed and written atomically."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-seed{seed}.json"
    if path.is_file():
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except ValueError:
            result = None  # unreadable (written by hand?): computed again
        if result is not None and fresh(result):
            return result
    result = compute()
    atomic_write_json(path, result)
    return result


def write_results(folder: Path, results: dict[str, Any], table: str) -> None:
    """The study's outputs, rebuilt from its members at every run: results.json and table.txt."""
    atomic_write_json(folder / "results.json", results)
    atomic_write_text(folder / "table.txt", table + "\n")


def check_seeds(owner: Any, name: str = "seeds", what: str = "a non-empty list of distinct ints") -> None:
    """The check every study config makes of its seeds list (errors name `owner`'s field)."""
    seeds = getattr(owner, name)
    check(isinstance(seeds, list) and bool(seeds) and all(is_int(s) for s in seeds) and len(set(seeds)) == len(seeds),
          owner, name, f"must be {what}")


def check_family_study(owner: Any) -> None:
    """The checks the family's scoring studies (`clp eval`, `clp repeat`) share: the split they
    read, the base seeds, the bootstrap's draws."""
    check(owner.split in ("eval", "dev"), owner, "split", "must be 'eval' or 'dev'")
    check_seeds(owner)
    check(is_int(owner.bootstrap_samples, 1), owner, "bootstrap_samples", "must be a positive int")


def row(label: str, cells: Sequence[str], label_width: int, width: int) -> str:
    """One line of a study's table: the label right-aligned in `label_width`, each cell in `width`."""
    return f"{label:>{label_width}s}" + "".join(f"{c:>{width}s}" for c in cells)


class Study:
    """One study run over its members. A subclass sets `prefix` (its folder's name) and defines
    `folder`, `members`, `score`, `summarise` and `table`; `prepare` (check everything before any
    work), `fresh` (is a cached member still valid), `outputs` (what results.json holds) and
    `finish` (extra files, the last printed line) have defaults."""

    prefix = "study"

    def __init__(self, exp: Any):
        self.exp = exp
        self.prepared = False

    def prepare(self) -> None:
        """Check every member's setting before anything is pretrained, trained or scored."""

    def ready(self) -> "Study":
        """The study, prepared (once)."""
        if not self.prepared:
            self.prepare()
            self.prepared = True
        return self

    def folder(self) -> Path:
        raise NotImplementedError

    def members(self) -> list[tuple[str, int]]:
        """What to run: (name, seed) pairs, each cached as `<folder>/<name>-seed<seed>.json`."""
        raise NotImplementedError

    def score(self, name: str, seed: int, say: Callable[[str], None]) -> dict[str, Any]:
        """Run one member: its numbers, JSON-serialisable."""
        raise NotImplementedError

    def fresh(self, name: str, seed: int, result: dict[str, Any]) -> bool:
        return True

    def summarise(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        raise NotImplementedError

    def table(self, summary: dict[str, Any]) -> str:
        raise NotImplementedError

    def outputs(self, results: list[dict[str, Any]], summary: dict[str, Any]) -> dict[str, Any]:
        return summary

    def finish(self, folder: Path, summary: dict[str, Any]) -> str:
        return f"results: {folder / 'results.json'}"

    def run(self, say: Callable[[str], None] = print) -> tuple[Path, dict[str, Any]]:
        """Every member, each saved as it finishes (finished ones are read back), then the summary
        and the table rebuilt from all of them."""
        self.ready()
        folder = self.folder()
        results = [cached(folder, name, seed, lambda: self.score(name, seed, say),
                          fresh=lambda result: self.fresh(name, seed, result))
                   for name, seed in self.members()]
        summary = self.summarise(results)
        text = self.table(summary)
        write_results(folder, self.outputs(results, summary), text)
        say(text)
        say(self.finish(folder, summary))
        return folder, summary


def publish(folder: Path, results: dict[str, Any], table: str, say: Callable[[str], None] = print) -> None:
    """Outputs made from other studies' summaries (e.g. over base seeds): written, the table and
    where they are said."""
    write_results(folder, results, table)
    say(table)
    say(f"results: {folder / 'results.json'}")


def each_base(study_on: Callable[[int], Study], base_seeds: list[int], say: Callable[[str], None] = print
              ) -> dict[int, Any]:
    """The loop over the family's pretraining seeds: `study_on(seed)` is the study on that base;
    every one is prepared (checked) before any runs. Returns each base's summary."""
    if not (isinstance(base_seeds, list) and base_seeds and all(is_int(s, 0) for s in base_seeds)
            and len(set(base_seeds)) == len(base_seeds)):
        raise ConfigError(f"--base-seeds must be distinct ints >= 0, got {base_seeds!r}")
    studies = [study_on(seed) for seed in base_seeds]
    for study in studies:
        study.ready()
    per_base = {}
    for seed, study in zip(base_seeds, studies):
        say(f"--- base seed {seed}")
        per_base[seed] = study.run(say)[1]
    return per_base

