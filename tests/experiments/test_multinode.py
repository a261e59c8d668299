"""Two nodes × one process on this machine's loopback: two `clp run` launches with NODE_RANK 0 and
1 and MASTER_ADDR=127.0.0.1, as on two machines sharing a file system (README: "Several machines").

- The run equals a one-node two-process run bit for bit: the same two global ranks, the same
  shards, the same summed writes, whichever launcher started the processes (Lightning's own, with
  NODE_RANK set by hand, or torchrun, whose processes have RANK and no NODE_RANK).
- Both nodes killed with SIGKILL mid-experience and launched again with --resume: the same results
  as the uninterrupted two-node run. Node 1 starts before node 0 has made the run folder and holds
  no lock on it; if it took the folder decision (or acted as rank 0 before its first Trainer), the
  launches would refuse each other or write the folder twice."""
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cl_platform.results import RunResults
from test_ddp_resume import SCRIPT, finish, last_curve_step  # the slow-strategy CLI script and its probes

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv: list[str], **env) -> subprocess.Popen:
    """`python ARGV...` in its own process group, outside any launcher's environment."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **env}
    for variable in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "SLURM_NTASKS", "SLURM_PROCID", "TORCHELASTIC_RUN_ID"):
        env.pop(variable, None)
    return subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def two_nodes(script: Path, args: list[str], torchrun: bool = False) -> list[subprocess.Popen]:
    """Node 1's process, then node 0's: Lightning's own launcher (NODE_RANK set by hand) or torchrun
    (which sets RANK, LOCAL_RANK=0 and WORLD_SIZE in the process it starts, and no NODE_RANK)."""
    port = str(free_port())
    # Node 1 first: it must wait for node 0 rather than act on the folder itself.
    if torchrun:
        return [launch(["-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                                    "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", port,
                                    str(script), *args]) for node in (1, 0)]
    return [launch([str(script), *args], NODE_RANK=str(node), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
            for node in (1, 0)]


@pytest.mark.slow
def test_two_nodes_on_loopback_equal_one_node_and_resume_after_sigkill(tiny, tmp_path):
    from experiments.base import ensure_base
    from experiments.setup import load_setup

    common = dict(strategy={"name": "slow"}, cl={"mode": "finetune", "curve_every": 1, "checkpoint_every": 2})
    nodes = {**common, "cl": {**common["cl"], "devices": 1, "num_nodes": 2}}
    ensure_base(load_setup(tiny.config(tmp_path / "base.yaml", **common)), progress_bar=False, say=lambda _: None)
    script = tmp_path / "slow_cli.py"
    script.write_text(SCRIPT, encoding="utf-8")

    one_node = launch([str(script), "run", str(tiny.config(tmp_path / "one.yaml", name="nodes-one",
                                                      **{**common, "cl": {**common["cl"], "devices": 2}}))])
    finish(one_node)
    whole = [finish(p) for p in two_nodes(script, ["run", str(tiny.config(tmp_path / "whole.yaml", name="nodes-whole", **nodes))])]
    assert "average forgetting" in whole[1] and whole[0].strip() == ""  # node 0 reports, node 1 is silent
    by_torchrun = [finish(p) for p in two_nodes(script, ["run", str(tiny.config(tmp_path / "elastic.yaml",
                                                                                name="nodes-elastic", **nodes))], torchrun=True)]
    assert "average forgetting" in by_torchrun[1] and "average forgetting" not in by_torchrun[0]

    cut = two_nodes(script, ["run", str(tiny.config(tmp_path / "cut.yaml", name="nodes-cut", **nodes))])
    deadline = time.time() + 300  # a polling limit, not a measurement
    while last_curve_step(next(iter(tiny.runs.glob("nodes-cut-*")), None)) < 3:
        assert all(p.poll() is None for p in cut), [p.communicate() for p in cut]
        if time.time() > deadline:
            pytest.fail("the run never reached step 3")
        time.sleep(0.01)
    for p in cut:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    folder = next(tiny.runs.glob("nodes-cut-*"))
    assert not RunResults.from_json(folder / "results.json").matrix.is_complete
    resumed = [finish(p) for p in two_nodes(script, ["run", str(tmp_path / "cut.yaml"), "--resume"])]
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
