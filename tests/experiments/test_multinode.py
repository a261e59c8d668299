"""Two nodes × one process on this machine's loopback: two `clp run` launches with NODE_RANK 0 and
1 and MASTER_ADDR=127.0.0.1, as on two machines sharing a file system (README: "Several machines").

- The run equals a one-node two-process run bit for bit: the same two global ranks, the same
  shards, the same summed writes, whichever launcher started the processes (Lightning's own, with
  NODE_RANK set by hand, or torchrun, whose processes have RANK and no NODE_RANK).
- Both nodes killed with SIGKILL mid-experience and launched again with --resume: the same results
  as the uninterrupted two-node run. Node 1 starts before node 0 has made the run folder and holds
  no lock on it; if it took the folder decision (or acted as rank 0 before its first Trainer), the
  launches would refuse each other or write the folder twice."""
import socket
import subprocess

import numpy as np
import pytest

from cl_platform.results import RunResults


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(kill_resume, args: list[str], torchrun: bool = False) -> list[subprocess.Popen]:
    """Node 1's process, then node 0's: Lightning's own launcher (NODE_RANK set by hand) or torchrun
    (which sets RANK, LOCAL_RANK=0 and WORLD_SIZE in the process it starts, and no NODE_RANK)."""
    port = str(free_port())
    # Node 1 first: it must wait for node 0 rather than act on the folder itself.
    if torchrun:
        return [kill_resume.start(args, launcher=["-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node",
                                                  "1", "--node-rank", str(node), "--master-addr", "127.0.0.1",
                                                  "--master-port", port]) for node in (1, 0)]
    return [kill_resume.start(args, NODE_RANK=str(node), MASTER_ADDR="127.0.0.1", MASTER_PORT=port) for node in (1, 0)]


@pytest.mark.slow
def test_two_nodes_on_loopback_equal_one_node_and_resume_after_sigkill(tiny, tmp_path, kill_resume):
    from experiments.base import resolve_base
    from experiments.setup import load_setup

    common = dict(strategy={"name": "slow"}, cl={"mode": "finetune", "curve_every": 1, "checkpoint_every": 2})
    nodes = {**common, "cl": {**common["cl"], "devices": 1, "num_nodes": 2}}
    resolve_base(load_setup(tiny.config(tmp_path / "base.yaml", **common)), progress_bar=False, say=lambda _: None)
    # The slow strategy (tests/experiments/conftest.py): 0.2 s a step.
    one_node = kill_resume.start(["run", str(tiny.config(tmp_path / "one.yaml", name="nodes-one",
                                                         **{**common, "cl": {**common["cl"], "devices": 2}}))])
    kill_resume.finish(one_node)
    whole_config = tiny.config(tmp_path / "whole.yaml", name="nodes-whole", **nodes)
    whole = [kill_resume.finish(p) for p in two_nodes(kill_resume, ["run", str(whole_config)])]
    assert "average forgetting" in whole[1] and whole[0].strip() == ""  # node 0 reports, node 1 is silent
    elastic_config = tiny.config(tmp_path / "elastic.yaml", name="nodes-elastic", **nodes)
    by_torchrun = [kill_resume.finish(p) for p in two_nodes(kill_resume, ["run", str(elastic_config)], torchrun=True)]
    assert "average forgetting" in by_torchrun[1] and "average forgetting" not in by_torchrun[0]

    cut = two_nodes(kill_resume, ["run", str(tiny.config(tmp_path / "cut.yaml", name="nodes-cut", **nodes))])
    kill_resume.kill_when(lambda: kill_resume.curve_step(tiny.runs, "nodes-cut-*") >= 3, *cut, what="step 3")
    folder = next(tiny.runs.glob("nodes-cut-*"))
    assert not RunResults.from_json(folder / "results.json").matrix.is_complete
    resumed = [kill_resume.finish(p) for p in two_nodes(kill_resume, ["run", str(tmp_path / "cut.yaml"), "--resume"])]
    assert f"resuming {folder}" in resumed[1]

    results = {name: RunResults.from_json(next(tiny.runs.glob(f"nodes-{name}-*")) / "results.json")
               for name in ("one", "whole", "elastic", "cut")}
    reference = results["one"]
    assert reference.matrix.is_complete and reference.mode == "finetune"
    for name in ("whole", "elastic", "cut"):
        r = results[name]
        assert np.array_equal(r.matrix.values, reference.matrix.values), (name, r.matrix.values, reference.matrix.values)
        assert r.curves == reference.curves and r.doc_losses == reference.doc_losses, name
        assert r.row_steps == reference.row_steps, name
