"""`clp run` end to end on the tiny 2-domain stream: pretraining, both rows of the protocol,
results.json, TensorBoard events read back, the printed report, and a second invocation."""
import math
import re
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from analysis.metrics import summary
from analysis.table import format_table
from analysis.curves import gain_curve
from cl_platform.results import RunResults


def events(folder: Path) -> EventAccumulator:
    acc = EventAccumulator(str(folder / "tensorboard"), size_guidance={"scalars": 0, "images": 0, "tensors": 0})
    acc.Reload()
    return acc


def tiny_split_docs(cfg, domain: str) -> list[int]:
    from experiments.setup import load_setup

    return load_setup(cfg).scenario.domains[domain].document_ids("eval")


@pytest.mark.slow
def test_tiny_stream_end_to_end(tiny):
    cfg = tiny.config(tiny.root / "e2e" / "e2e.yaml", runs_root=str(tiny.root / "e2e" / "runs"))
    # What a wall-time bound would stand for, counted instead: one pretraining of 150 steps,
    # 6 steps per experience, and a second run that trains nothing (end of this test).
    proc = tiny.run_cli(["run", str(cfg)])
    out = proc.stdout
    assert out.count("base model: pretraining 150 steps") == 1
    folder = Path(re.search(r"run folder\s+(\S+)/", out).group(1))
    assert folder.name.startswith("e2e-") and (folder / "config.yaml").is_file()

    results = RunResults.from_json(folder / "results.json")
    matrix = results.matrix
    assert matrix.is_complete and matrix.domains == ["math", "code"] and matrix.experiences == ["math", "code"]
    assert (results.mode, results.memory_policy, results.strategy, results.seed) == ("fast", "frozen", "naive", 0)
    assert results.config_hash.startswith(folder.name.split("-")[-1])
    assert {"torch", "lightning"} <= set(results.versions)
    assert format_table(results) in out
    # Per-document losses add up to every cell (so document intervals resample the same numbers).
    for t in range(3):
        for j, d in enumerate(matrix.domains):
            docs = np.array(results.doc_losses[str(t)][d])
            assert docs[:, 0].sum() / docs[:, 1].sum() == pytest.approx(matrix.values[t, j], rel=1e-6)
            assert len(docs) == len(set(tiny_split_docs(cfg, d)))
    s = summary(results)
    assert f"{s['average_forgetting']:+.4f}" in out and f"{s['plasticity']:+.4f}" in out
    assert f"TensorBoard: tensorboard --logdir {folder.parent}   (this run: {folder.name}/tensorboard)" in out
    assert f"report: clp report {folder}" in out
    assert re.search(r"\[1/2 math\] 6 steps, train loss \d\.\d+ \| eval loss math", out)
    # Captured output is a log file, not a terminal: plain progress lines, no carriage return (the
    # bar's, or a data bar's while the stream cache is built), and no `nan` anywhere.
    assert "\r" not in out and "\r" not in proc.stderr
    assert re.search(r"^pretrain: 150/150 batches \(100%\), step 150, loss \d+\.\d{3}, \d+ s$", out, re.M)
    assert re.search(r"^exp 2/2 code: 6/6 batches \(100%\), step 12, loss \d+\.\d{3}, \d+ s$", out, re.M)
    assert not re.search(r"\bnan\b", out)
    assert sorted(p.name for p in (folder / "checkpoints").iterdir()) == ["last.ckpt"]  # cl.keep_checkpoints: final

    # Forgetting curves: every domain at steps 0, 2, 4, 6 (end of math) ... 12 (end of code).
    steps = [0, 2, 4, 6, 8, 10, 12]
    assert all([p[0] for p in results.curves[d]] == steps for d in matrix.domains)
    assert results.row_steps == {"0": 0, "1": 6, "2": 12}  # the experience boundaries
    assert [s_ for s_, _ in gain_curve(results, 2)] == [0, 2, 4, 6]  # code's own experience, steps 6..12

    acc = events(folder)
    scalars = set(acc.Tags()["scalars"])
    for d in matrix.domains:
        logged = [(e.step, e.value) for e in acc.Scalars(f"eval/{d}/loss")]
        assert [s_ for s_, _ in logged] == steps
        np.testing.assert_allclose([v for _, v in logged], [v for _, v in results.curves[d]], rtol=1e-6)
        rows = [e.value for e in acc.Scalars(f"results/{d}/loss")]
        np.testing.assert_allclose(rows, matrix.values[:, matrix.domains.index(d)], rtol=1e-6)
        assert f"eval/{d}/ppl" in scalars
    assert [e.step for e in acc.Scalars("train/lm")] == list(range(1, 13))
    for stat in ("gate_mean", "coverage", "collision_rate", "kl_uniform", "value_update_norm", "key_update_norm"):
        assert f"fwpkm/fwpkm1/{stat}" in scalars
    coverage = [e.value for e in acc.Scalars("fwpkm/fwpkm1/coverage")]
    assert 0 < min(coverage) and max(coverage) <= 1
    assert len(acc.Images("results/matrix")) == 3  # rows 0, 1, 2
    assert "_hparams_/session_start_info" in acc.PluginTagToContent("hparams")
    final = [e.value for e in acc.Scalars("final/average_final")]
    assert final == pytest.approx([s["average_final"]])

    # Fast mode rewrites the memory, so rows differ (whether that helps: experiments/LOG.md).
    assert not np.array_equal(matrix.values[0], matrix.values[1])
    assert not np.array_equal(matrix.values[1], matrix.values[2])
    # ... and only the memory: with it put back to the base's every row is row 0 (nothing of the
    # gain is in the slow weights), in results.json and in TensorBoard.
    reset = results.memory_reset
    assert reset is not None and np.array_equal(reset.values, np.tile(matrix.values[:1], (3, 1)))
    # Kept: 0 of the gain, so the fraction is 0 where there is a gain to take a fraction of (the
    # tiny base's gains can be negative: then it is undefined).
    gain = matrix.values[0, 0] - matrix.values[1, 0] + matrix.values[0, 1] - matrix.values[2, 1]
    assert s["consolidated_fraction"] == pytest.approx(0.0 if gain > 0 else math.nan, nan_ok=True)
    for d in matrix.domains:
        rows = [e.value for e in acc.Scalars(f"results_memory_reset/{d}/loss")]
        np.testing.assert_allclose(rows, reset.values[:, matrix.domains.index(d)], rtol=1e-6)

    again = tiny.run_cli(["run", str(cfg)])
    assert "already complete" in again.stdout and "pretraining" not in again.stdout
    assert format_table(results) in again.stdout
    resolved = tiny.run_cli(["run", str(folder / "config.yaml")])  # the resolved config is the same run
    assert f"run {folder} is already complete" in resolved.stdout


@pytest.mark.slow
def test_in_finetune_mode_the_memory_reset_rows_are_the_final_slow_weights_read_with_the_bases_memory(tiny, tiny_base):
    """The reset rows computed by the runner equal an evaluation rebuilt by hand: the final
    checkpoint's slow weights with the base checkpoint's fast memory, read under the frozen policy."""
    import torch

    from cl_platform.checkpoint import load_checkpoint
    from cl_platform.lm_module import LMModule
    from cl_platform.memory_policy import get_memory_policy
    from experiments.setup import build_model, load_setup

    cfg = tiny.config(tiny.root / "ft" / "ft.yaml", name="ft-reset", cl={"mode": "finetune"})
    out = tiny.run_cli(["run", str(cfg)]).stdout
    folder = Path(re.search(r"run folder\s+(\S+)/", out).group(1))
    results = RunResults.from_json(folder / "results.json")
    matrix, reset = results.matrix, results.memory_reset
    assert np.array_equal(reset.values[0], matrix.values[0])
    # The slow weights learned: the rows differ from row 0, and from the rows with the memory.
    assert not np.allclose(reset.values[1:], matrix.values[:1], atol=1e-4)
    assert not np.allclose(reset.values[1:], matrix.values[1:], atol=1e-4)

    setup = load_setup(cfg)
    final = load_checkpoint(folder / "checkpoints" / "last.ckpt", "run")["model"]
    base = load_checkpoint(tiny_base.path, "base")["model"]
    fast = {k for k in final if k.rsplit(".", 1)[-1] in ("keys", "values", "write_mask", "read_counts")
            and ".fwpkm" in k}
    assert fast and all(k in base for k in fast)
    model = build_model(setup.model_config, setup.config.seed, setup.config.pretrain.fwpkm)
    model.load_state_dict({**final, **{k: base[k] for k in fast}})
    module = LMModule(model, phase="fast", memory_policy=get_memory_policy("frozen"))
    loaders = setup.scenario[0].eval_loaders(setup.config.cl.eval_batch_size, split=setup.config.cl.eval_split)
    by_hand = module.evaluate({d: loaders[d] for d in matrix.domains})
    np.testing.assert_allclose([by_hand[d] for d in matrix.domains], reset.values[2], rtol=1e-6)
    s = summary(results)
    assert 0 < s["consolidated_fraction"] and s["consolidated_fraction"] == pytest.approx(
        sum(matrix.values[0, j] - reset.values[t, j] for t, j in ((1, 0), (2, 1)))
        / sum(matrix.values[0, j] - matrix.values[t, j] for t, j in ((1, 0), (2, 1))))
