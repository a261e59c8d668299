"""`finetune` with Lightning DDP on two CPU processes (gloo): the FwPKM writes are summed over the
ranks, so after training every rank holds the same fast-weight memory."""
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from cl_platform.results import RunResults

WORLD = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank: int, config: str, out_dir: str, port: int) -> None:
    # What Lightning's launcher (or torchrun) sets for each process it starts.
    os.environ.update(LOCAL_RANK=str(rank), NODE_RANK="0", WORLD_SIZE=str(WORLD),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from experiments.run import execute

    _, _, runner = execute(config, progress_bar=False, say=lambda _: None)
    memory = {f"{layer.name}.{name}": getattr(layer, name).clone()
              for layer in runner.module.model.fwpkm_layers() for name in ("keys", "values")}
    weights = {k: v.clone() for k, v in runner.module.model.state_dict().items() if "fwpkm" not in k}
    torch.save({"memory": memory, "weights": weights}, os.path.join(out_dir, f"rank{rank}.pt"))


@pytest.mark.slow
def test_finetune_ddp_ranks_hold_the_same_memory(tiny, tiny_base, tmp_path):
    config = tiny.config(tmp_path / "ddp.yaml", name="ddp", cl={"mode": "finetune", "devices": WORLD})
    start = torch.load(tiny_base.path, weights_only=True)["model"]
    mp.spawn(worker, args=(str(config), str(tmp_path), free_port()), nprocs=WORLD, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD))
    for key in r0["memory"]:
        assert torch.equal(r0["memory"][key], r1["memory"][key]), key
        assert not torch.equal(r0["memory"][key], start[f"blocks.1.fwpkm.{key.split('.')[-1]}"]), key  # it was written
    for key in r0["weights"]:
        assert torch.equal(r0["weights"][key], r1["weights"][key]), key  # DDP keeps the slow weights in sync
    assert not torch.equal(r0["weights"]["blocks.0.attn.qkv.weight"], start["blocks.0.attn.qkv.weight"])  # trained
    folder = next(tiny.runs.glob("ddp-*"))
    results = RunResults.from_json(folder / "results.json")
    assert results.matrix.is_complete and results.mode == "finetune"
    # Data parallel: each experience's 12 segments are 3 steps of 2 per rank, not 6 of one process.
    assert [step for step, _ in results.curves["math"]] == [0, 2, 3, 4, 6]
