"""`clp run --seeds / --base-seeds`: one ordinary run per seed, an aggregate of them, bad lists refused."""
import json

import numpy as np
import pytest

from cl_platform.check import ConfigError
from experiments.cli import main as cli_main
from experiments.multi.seeds import run_seeds
from experiments.config_files import parse_seeds


def quiet(_):
    pass


@pytest.mark.parametrize("text, words", [("", "empty seed list"), ("0,x", "not a comma-separated"),
                                         ("1,2,1", "[1] repeated")])
def test_bad_seed_lists_are_refused(text, words):
    with pytest.raises(ConfigError) as info:
        parse_seeds(text)
    assert words in str(info.value)
    assert parse_seeds(" 2, 0 ,1") == [2, 0, 1]


def test_a_bad_list_or_config_stops_before_anything_runs(tiny, tmp_path, capsys):
    runs = tmp_path / "runs"
    path = tiny.config(tmp_path / "s.yaml", runs_root=str(runs))
    assert cli_main(["run", str(path), "--seeds", "0,0"]) == 2
    assert "repeated" in capsys.readouterr().err
    assert cli_main(["run", str(path), "cl.mdoe=fast", "--seeds", "0,1"]) == 2
    assert "unknown field 'cl.mdoe'" in capsys.readouterr().err
    assert not runs.exists()


def test_a_missing_given_base_of_any_base_seed_stops_before_the_first_member(tiny, tiny_base, tmp_path):
    import shutil

    from experiments.multi.compare import Comparison, run as compare

    shutil.copy(tiny_base.path, tmp_path / "b0.ckpt")  # seed 0's base exists, seed 1's does not
    runs = tmp_path / "runs"
    path = tiny.config(tmp_path / "given.yaml", runs_root=str(runs), base_checkpoint="b${pretrain.seed}.ckpt")
    with pytest.raises(ConfigError, match=r"base seed 1: checkpoint .*b1.ckpt does not exist"):
        run_seeds(path, [], seeds=[0], base_seeds=[0, 1], progress_bar=False, say=quiet)
    with pytest.raises(ConfigError, match=r"base seed 1: checkpoint .*b1.ckpt does not exist"):
        compare(Comparison(run=str(path), entries={"naive": ["strategy.name=naive"]}, seeds=[0], base_seeds=[0, 1]),
                say=quiet)
    assert not runs.exists()


@pytest.mark.slow
def test_base_seeds_give_their_own_bases_and_an_aggregate(tiny, tmp_path):
    path = tiny.config(tmp_path / "agg.yaml", runs_root=str(tmp_path / "runs"), order=["code"],
                       pretrain={"steps": 30, "eval_every": 30, "checkpoint_every": 30})
    out, agg = run_seeds(path, [], seeds=[0], base_seeds=[0, 1], progress_bar=False, say=quiet)
    assert agg["runs"] == ["base 0 seed 0", "base 1 seed 0"] and len(set(agg["config_hashes"])) == 2
    assert len(list((tmp_path / "runs").glob("pretrain-*"))) == 2  # one base per base seed
    members = [json.loads((tmp_path / "runs" / f.split("/")[-1] / "results.json").read_text())
               for f in agg["run_folders"]]
    rows = np.array([m["matrix"]["values"] for m in members], dtype=float)
    np.testing.assert_allclose(agg["matrix_mean"], rows.mean(0))
    np.testing.assert_allclose(agg["matrix_std"], rows.std(0, ddof=1))
    assert (np.array(agg["matrix_std"]) > 0).all()  # different bases, different numbers
    assert json.loads((out / "aggregate.json").read_text())["matrix_mean"] == agg["matrix_mean"]

    # Fast mode draws nothing at random: continual-phase seeds on one base repeat the run exactly.
    said = []
    _, same = run_seeds(path, ["pretrain.seed=0"], seeds=[0, 1], progress_bar=False, say=said.append)
    assert any("already complete" in line for line in said)  # seed 0 on base 0 was run above
    assert np.all(np.array(same["matrix_std"]) == 0)
