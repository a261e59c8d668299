"""The study skeleton: a toy `Study` (members and score only) is prepared once, caches every member
and reuses it, rebuilds its outputs, and `each_base` checks every base before running any."""
import json

import pytest

from cl_platform.check import ConfigError
from experiments.studies.study import Study, check_seeds, each_base, row, study_folder


class Toy(Study):
    prefix = "toy"

    def __init__(self, exp, root, log):
        super().__init__(exp)
        self.root, self.log = root, log

    def prepare(self):
        self.log.append(("prepare", self.exp["base"]))

    def folder(self):
        return study_folder(self.root, self.prefix, {"base": self.exp["base"]})

    def members(self):
        return [(name, seed) for name in ("a", "b") for seed in self.exp["seeds"]]

    def score(self, name, seed, say):
        self.log.append(("score", name, seed))
        return {"name": name, "seed": seed, "value": 10 * seed + len(name)}

    def summarise(self, results):
        return {"total": sum(r["value"] for r in results)}

    def table(self, summary):
        return row("total", [str(summary["total"])], 8, 6)


def test_members_are_scored_once_and_the_outputs_rebuilt(tmp_path):
    log, said = [], []
    folder, summary = Toy({"base": 0, "seeds": [0]}, tmp_path, log).run(said.append)
    assert summary == {"total": 2} and said == ["   total     2", f"results: {folder / 'results.json'}"]
    assert json.loads((folder / "results.json").read_text()) == summary and (folder / "a-seed0.json").is_file()
    log.clear()
    _, summary = Toy({"base": 0, "seeds": [0, 1]}, tmp_path, log).run(lambda _: None)  # a new seed: only it is scored
    assert log == [("prepare", 0), ("score", "a", 1), ("score", "b", 1)] and summary == {"total": 2 + 22}
    assert (folder / "table.txt").read_text() == "   total    24\n"


def test_each_base_prepares_every_base_before_running_any(tmp_path):
    log, said = [], []
    per_base = each_base(lambda seed: Toy({"base": seed, "seeds": [0]}, tmp_path, log), [3, 4], said.append)
    assert [e for e in log if e[0] == "prepare"] == [("prepare", 3), ("prepare", 4)]  # once each, both first
    assert log.index(("prepare", 4)) < log.index(("score", "a", 0)) and set(per_base) == {3, 4}
    assert "--- base seed 3" in said and "--- base seed 4" in said
    with pytest.raises(ConfigError, match="--base-seeds must be distinct"):
        each_base(lambda seed: None, [1, 1])


def test_check_seeds_names_the_field():
    class Exp:
        seeds = [0, 0]

    with pytest.raises(ConfigError, match="seeds"):
        check_seeds(Exp())
