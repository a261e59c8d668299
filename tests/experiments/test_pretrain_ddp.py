"""Data-parallel pretraining (`pretrain.devices` > 1, Lightning DDP, gloo on two CPU processes): the
ranks of a step read together the batch one process reads, hold the same weights and memory, rank
0 alone writes, and a pretraining killed after a checkpoint resumes to the uninterrupted weights."""
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from cl_platform.check import ConfigError
from experiments.setup import base_key, build_model, load_setup

WORLD = 2
SMALL = {"steps": 6, "batch_size": 4, "checkpoint_every": 2, "eval_every": 3, "log_every": 1}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank: int, config: str, out_dir: str, port: int, die_after: int) -> None:
    # What Lightning's launcher (or torchrun) sets for each process it starts.
    os.environ.update(LOCAL_RANK=str(rank), NODE_RANK="0", WORLD_SIZE=str(WORLD),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from cl_platform.pretrain import Pretrainer
    from experiments.base import resolve_base

    if die_after:
        after_step = Pretrainer._after_step

        def die(self, step):
            after_step(self, step)
            if step == die_after:
                os._exit(9)  # as SIGKILL: no handler, no clean-up, right after the checkpoint

        Pretrainer._after_step = die
    base = resolve_base(load_setup(config), progress_bar=False, say=lambda _: None)
    record, weights = base.record, base.weights
    torch.save({"weights": weights, "record": record}, os.path.join(out_dir, f"rank{rank}.pt"))


def spawn(config, out_dir, die_after=0):
    mp.spawn(worker, args=(str(config), str(out_dir), free_port(), die_after), nprocs=WORLD, join=True)
    return [torch.load(out_dir / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]


def test_the_step_is_split_over_the_ranks_and_not_part_of_the_key(tiny, tmp_path):
    one = load_setup(tiny.config(tmp_path / "one.yaml", pretrain=SMALL))
    two = load_setup(tiny.config(tmp_path / "two.yaml", pretrain={**SMALL, "devices": 2}))
    assert base_key(one) == base_key(two)  # where it runs is not what it is
    with pytest.raises(ConfigError, match=r"pretrain\.batch_size.*multiple of devices × num_nodes = 3"):
        load_setup(tiny.config(tmp_path / "bad.yaml", pretrain={**SMALL, "devices": 3}))

    from cl_platform.pretrain import Pretrainer
    from streams import PretrainDataModule

    cfg = one.config
    data = PretrainDataModule(one.scenario, cfg.pretrain.batch_size, seed=cfg.pretrain.seed)
    pre = Pretrainer(model=build_model(one.model_config, 0, cfg.pretrain.fwpkm), data=data, eval_loaders={},
                     config=cfg.pretrain, out_dir=tmp_path / "p", key="k", progress_bar=False)

    def ids(loader):  # the segments of each batch, by their tokens
        return [[tuple(row.tolist()) for row in batch["input_ids"]] for batch in loader]

    # Steps 3..5 of a resumed pretraining, the second epoch's order included (512 segments, 4 a step).
    whole = ids(pre._loader(127, 3))
    shards = [ids(pre._loader(127, 3, rank=r, world=WORLD)) for r in range(WORLD)]
    assert all(len(batches) == 3 and all(len(b) == 2 for b in batches) for batches in shards)
    for k in range(3):
        assert sorted(shards[0][k] + shards[1][k]) == sorted(whole[k])
        assert shards[0][k] == whole[k][0::2] and shards[1][k] == whole[k][1::2]


@pytest.mark.slow
def test_two_ranks_pretrain_one_base_and_resume_after_a_kill_bit_for_bit(tiny, tmp_path):
    ddp = tiny.config(tmp_path / "ddp.yaml", runs_root=str(tmp_path / "ddp"), pretrain={**SMALL, "devices": WORLD})
    r0, r1 = spawn(ddp, tmp_path)
    for key in r0["weights"]:  # slow weights synchronised by DDP, fast memory by the summed writes
        assert torch.equal(r0["weights"][key], r1["weights"][key]), key
    assert r0["record"]["loss_curve"] == r1["record"]["loss_curve"]  # the ranks' mean, on every rank
    assert [s for s, _ in r0["record"]["loss_curve"]] == list(range(1, 7))
    folder = next((tmp_path / "ddp").glob("pretrain-*"))
    assert (folder / "base.ckpt").is_file() and (folder / "probe.json").is_file()
    assert not (folder / "last.ckpt").exists()
    base = torch.load(folder / "base.ckpt", weights_only=True)["model"]
    assert all(torch.equal(base[k], r0["weights"][k]) for k in base)

    # One process on the same 4 segments a step: the first step starts from the same weights and
    # reads the same tokens, so its loss is the two ranks' mean up to float summation order.
    one = load_setup(tiny.config(tmp_path / "one.yaml", runs_root=str(tmp_path / "one"), pretrain=SMALL))
    from experiments.base import resolve_base

    base = resolve_base(one, progress_bar=False, say=lambda _: None)
    single = base.record
    assert single["loss_curve"][0][1] == pytest.approx(r0["record"]["loss_curve"][0][1], rel=1e-5)

    # Killed (both ranks, no clean-up) right after the checkpoint of step 4, then started again.
    cut = tiny.config(tmp_path / "cut.yaml", runs_root=str(tmp_path / "cut"), pretrain={**SMALL, "devices": WORLD})
    out = tmp_path / "cut-out"
    out.mkdir()
    with pytest.raises(Exception, match="exit"):
        spawn(cut, out, die_after=4)
    assert not (out / "rank0.pt").exists()
    resumed = spawn(cut, out)
    for key in r0["weights"]:
        assert torch.equal(resumed[0]["weights"][key], r0["weights"][key]), key
    assert resumed[0]["record"]["loss_curve"] == r0["record"]["loss_curve"]
