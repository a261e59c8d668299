"""Bad input: each a clear error naming the problem, and nothing overwritten."""
import dataclasses
import hashlib
from types import SimpleNamespace
from pathlib import Path

import pytest
import torch

import strategies
from cl_platform.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from cl_platform.results import RunResults
from cl_platform.run_dir import RunDirError
from cl_platform.check import ConfigError
from cl_platform.device import LAUNCHERS, check_placement
from cl_platform.strategy import Strategy
from cl_platform.trainer import RunStopped
from experiments.cli import main as cli_main
from experiments.run import execute


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` with its content hash (and so its presence)."""
    if not folder.exists():
        return {}
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def quiet(_):
    pass


def run(path, **kw):
    return execute(path, progress_bar=False, say=quiet, **kw)


class NanAt(Strategy):
    """Test strategy: its loss term turns NaN at step `step` (1-based)."""

    def __init__(self, step: int):
        self.step = step

    def extra_losses(self, batch, outputs, ctx):
        bad = ctx.global_step + 1 >= self.step
        return {"nan_at/term": outputs["lm_loss"] * 0 + (float("nan") if bad else 0.0)}


@pytest.fixture
def nan_strategy(monkeypatch):
    monkeypatch.setitem(strategies.STRATEGIES, "nan_at", NanAt)


@pytest.mark.parametrize(
    "overrides, error, words",
    [
        ({"order": ["math", "lw"]}, ConfigError, ["'order'", "'lw'"]),
        ({"strategy": {"name": "ewcc"}}, ConfigError, ["'strategy.name'", "'ewcc'", "naive"]),
        ({"strategy": {"name": "naive", "kwargs": {"alpha": 1}}}, ConfigError, ["'strategy.kwargs'", "alpha"]),
        ({"cl": {"mode": "slow"}}, ConfigError, ["cl.mode", "'slow'"]),
        # A strategy in a mode it does not support, a model without what it needs, a buffer
        # larger than the data: refused before the base is pretrained (nothing is written).
        ({"strategy": {"name": "ewc"}}, ConfigError, ["'strategy'", "cl.mode 'fast'", "finetune"]),
        ({"strategy": {"name": "distill"}, "cl": {"mode": "finetune"}}, ConfigError, ["'strategy'", "'fast' mode only"]),
        ({"strategy": {"name": "distill", "kwargs": {"params": "pkm"}}}, ConfigError, ["'strategy'", "pkm_layers"]),
        ({"strategy": [{"name": "replay", "kwargs": {"size": 100000}}]}, ConfigError, ["'strategy'", "larger than the data"]),
        ({"strategy": [{"name": "naive"}, {"name": "lwf"}]}, ConfigError, ["'strategy[1]'", "finetune"]),
        ({"strategy": {"name": "generative_replay", "kwargs": {"length": 33}}}, ConfigError,
         ["'strategy'", "length 33 is longer than the stream's segments (32 tokens)"]),
        ({"strategy": {"name": "distill", "kwargs": {"retain": 1.0, "anchor_length": 40}}}, ConfigError,
         ["'strategy'", "anchor_length 40 is longer than the stream's segments (32 tokens)"]),
        ({"model": {"fwpkm_layers": []}, "strategy": {"name": "slot_transfer"}}, ConfigError, ["no FwPKM layer"]),
        ({"cl": {"eval_memory": "keep"}}, ConfigError, ["cl.eval_memory", "'keep'"]),
        ({"cl": {"eval_memory": "reset"}, "strategy": {"name": "experts"}}, ConfigError, ["cl.eval_memory", "routing"]),
        ({"cl": {"accelerator": "tpu"}}, ConfigError, ["cl.accelerator", "'tpu'", "auto"]),
        ({"pretrain": {"accelerator": "cuda"}}, ConfigError, ["pretrain.accelerator", "'cuda'", "gpu"]),
        ({"cl": {"num_nodes": 2}}, ConfigError, ["cl.num_nodes", "finetune"]),
    ],
)
def test_bad_config_names_the_problem_and_writes_nothing(tiny, tmp_path, overrides, error, words):
    runs = tmp_path / "runs"
    path = tiny.config(tmp_path / "bad.yaml", runs_root=str(runs), **overrides)
    with pytest.raises(error) as info:
        run(path)
    for word in words:
        assert word in str(info.value)
    assert not runs.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: accelerator=gpu is valid here")
def test_an_accelerator_the_machine_lacks_is_refused_before_any_work(tiny, tmp_path, capsys):
    path = tiny.config(tmp_path / "gpu.yaml", runs_root=str(tmp_path / "runs"), cl={"accelerator": "gpu"})
    assert cli_main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'cl.accelerator'" in err[0] and "no CUDA device" in err[0]
    assert not (tmp_path / "runs").exists()


def test_several_nodes_without_a_launcher_are_refused_before_any_work(tiny, tmp_path, capsys, monkeypatch):
    for variables in LAUNCHERS.values():
        for v in variables:
            monkeypatch.delenv(v, raising=False)
    path = tiny.config(tmp_path / "nodes.yaml", runs_root=str(tmp_path / "runs"), cl={"mode": "finetune", "num_nodes": 2})
    assert cli_main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "'cl.num_nodes'" in err and "torchrun" in err and "Several machines" in err
    assert not (tmp_path / "runs").exists()
    # The same placement under a launcher's environment passes the check.
    check_placement(SimpleNamespace(accelerator="cpu", devices=1, num_nodes=2), "cl",
                    {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "NODE_RANK": "1"})


def test_a_runs_root_that_cannot_take_files_is_refused_before_any_work(tiny, tmp_path, capsys):
    blocker = tmp_path / "share"
    blocker.write_text("a file where the shared runs folder should be mounted")
    path = tiny.config(tmp_path / "root.yaml", runs_root=str(blocker / "runs"))
    assert cli_main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert "'runs_root'" in err and "is a file" in err
    assert blocker.read_text().startswith("a file")


def test_base_checkpoint_of_another_model_is_refused(tiny, tiny_base, tmp_path):
    path = tiny.config(tmp_path / "other.yaml", runs_root=str(tmp_path / "runs"), base_checkpoint=str(tiny_base.path),
                       model={"d_model": 32})
    with pytest.raises(CheckpointError, match=r"different model config: d_model is 64 in the checkpoint, 32 in this run"):
        run(path)
    assert not (tmp_path / "runs").exists()


def test_base_checkpoint_of_other_pretraining_settings_is_refused(tiny, tiny_base, tmp_path):
    # --base-seeds sets pretrain.seed: a fixed base_checkpoint must not stand in for every seed's base.
    path = tiny.config(tmp_path / "seed1.yaml", runs_root=str(tmp_path / "runs"), base_checkpoint=str(tiny_base.path))
    with pytest.raises(ConfigError, match=r"pretrain.seed is 0 in the base, 1 in this run") as info:
        run(path, overrides=["pretrain.seed=1", "pretrain.lr=0.002", "pretrain.eval_every=7"])
    assert "pretrain.lr is" in str(info.value) and "eval_every" not in str(info.value)  # reporting fields do not count
    assert not (tmp_path / "runs").exists()


def test_base_checkpoint_is_used_instead_of_pretraining(tiny, tiny_base, tmp_path):
    path = tiny.config(tmp_path / "given.yaml", runs_root=str(tmp_path / "runs"), base_checkpoint=str(tiny_base.path),
                       order=["code"])
    folder, results, _ = run(path)
    assert results.matrix.is_complete and results.matrix.experiences == ["code"]
    assert not list((tmp_path / "runs").glob("pretrain-*"))


def test_non_finite_loss_stops_at_its_step_and_keeps_the_last_good_checkpoint(tiny, tiny_base, tmp_path, nan_strategy):
    path = tiny.config(tmp_path / "nan.yaml", runs_root=str(tiny.runs), name="nan",
                       cl={"mode": "finetune", "checkpoint_every": 4},
                       strategy={"name": "nan_at", "kwargs": {"step": 9}})
    with pytest.raises(RunStopped, match=r"non-finite loss at step 9 \(experience 2: code\).*last good checkpoint: .*last.ckpt \(step 8\)"):
        run(path)
    folder = next(tiny.runs.glob("nan-*"))
    ckpt = load_checkpoint(folder / "checkpoints" / "last.ckpt", "run")
    assert ckpt["position"]["step"] == 8
    assert RunResults.from_json(folder / "results.json").matrix.last_complete_row == 1
    before = snapshot(folder)

    # Without --resume the unfinished folder is left alone; with it, corrupted checkpoints are named
    # (a corrupted last.ckpt alone falls back to prev.ckpt: tests/experiments/test_faults.py).
    with pytest.raises(RunDirError, match="unfinished run; continue it with --resume"):
        run(path)
    for name in ("last.ckpt", "prev.ckpt"):
        ckpt_path = folder / "checkpoints" / name
        data = ckpt_path.read_bytes()
        ckpt_path.write_bytes(data[: len(data) // 2])
    before = snapshot(folder)
    with pytest.raises(CheckpointError, match=r"last.ckpt cannot be read: corrupted.*; and the previous one: "
                                              r"checkpoint .*prev.ckpt cannot be read: corrupted"):
        run(path, resume=True)
    assert snapshot(folder) == before


def test_resume_on_a_folder_of_another_config_is_refused(tiny, tiny_base, tmp_path):
    first = tiny.config(tmp_path / "a.yaml", runs_root=str(tiny.runs), name="a", order=["code"])
    folder, _, _ = run(first)
    before = snapshot(folder)
    other = tiny.config(tmp_path / "b.yaml", runs_root=str(tiny.runs), name="b", order=["code"], seed=7)
    with pytest.raises(RunDirError, match=r"(?s)different configuration.*config.seed: was 0, now 7"):
        run(other, resume=True, run_dir=folder)
    assert snapshot(folder) == before


def test_run_checkpoint_of_another_model_is_refused(tiny_base, tmp_path):
    cfg = tiny_base.setup.model_config
    path = tmp_path / "last.ckpt"
    save_checkpoint(path, "run", cfg, {"model": {}})
    other = dataclasses.replace(cfg, n_layer=2, fwpkm_layers=[0])
    with pytest.raises(CheckpointError, match=r"fwpkm_layers is \[1\] in the checkpoint, \[0\] in this run"):
        load_checkpoint(path, "run", other)
    with pytest.raises(CheckpointError, match="holds a 'run' checkpoint, expected 'base'"):
        load_checkpoint(path, "base", cfg)
    torch.save({"model": {}}, tmp_path / "foreign.ckpt")
    with pytest.raises(CheckpointError, match="not a cl-platform checkpoint"):
        load_checkpoint(tmp_path / "foreign.ckpt", "run")


def test_cli_prints_one_error_line_and_exits_2(tiny, tmp_path, capsys):
    path = tiny.config(tmp_path / "bad.yaml", runs_root=str(tmp_path / "runs"), order=["math", "lw"])
    assert cli_main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("clp run: error:") and "'lw'" in err
