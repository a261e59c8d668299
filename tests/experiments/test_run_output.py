"""What a finished `clp run` says and leaves, on the tiny 2-domain stream: no `nan` in the printed
report (a metric the stream cannot define reads as what it needs), a warning for evaluation splits
too small to resample, the commands that make the report and open TensorBoard (checked against
what TensorBoard itself lists), and a run folder holding one checkpoint once the run is done."""
import re
from pathlib import Path

from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer

from cl_platform.callbacks import RunCallback
from cl_platform.checkpoint import load_checkpoint
from cl_platform.results import RunResults
from experiments.multi.compare import state_bytes
from experiments.run import execute, report
from experiments.setup import load_setup


def quiet(_):
    pass


def checkpoints(folder: Path) -> list[str]:
    return sorted(p.name for p in (folder / "checkpoints").iterdir())


class FilesAtTheEnd(RunCallback):
    """The checkpoint files as the run ends (every row measured), before it tidies up."""

    def __init__(self):
        self.names: list[str] = []

    def on_run_end(self, runner) -> None:
        self.names = checkpoints(runner.run_dir)


def test_a_finished_run_keeps_one_checkpoint_by_default_both_with_all_and_none_with_none(tiny, tiny_base, tmp_path):
    path = tiny.config(tmp_path / "keep.yaml")
    seen = FilesAtTheEnd()
    folder, results, _ = execute(path, progress_bar=False, say=quiet, callbacks=[seen])
    assert seen.names == ["last.ckpt", "prev.ckpt"]  # until the last row is in, a run keeps both
    assert checkpoints(folder) == ["last.ckpt"]
    final = load_checkpoint(folder / "checkpoints" / "last.ckpt", "run")  # the end of the stream
    assert final["position"]["step"] == results.row_steps["2"] == 12
    assert RunResults.from_dict(final["results"]).matrix.is_complete

    # The setting is not part of the run's identity: the same run, found complete, nothing retrained.
    said = []
    again, found, runner = execute(path, ["cl.keep_checkpoints=all"], progress_bar=False, say=said.append)
    assert again == folder and runner is None and f"run {folder} is already complete (same configuration hash " \
        f"{folder.name[-12:]})" in said
    assert found.matrix.values.tolist() == results.matrix.values.tolist()

    # `all` keeps the previous checkpoint too (what every run kept before the setting); `none`
    # neither, and the folder still reads as a complete run.
    kept, kept_results, _ = execute(path, ["cl.keep_checkpoints=all"], run_dir=tmp_path / "all", progress_bar=False,
                                    say=quiet)
    assert checkpoints(kept) == ["last.ckpt", "prev.ckpt"]
    previous = load_checkpoint(kept / "checkpoints" / "prev.ckpt", "run")  # the one before the last row
    assert RunResults.from_dict(previous["results"]).matrix.last_complete_row == 1
    bare, bare_results, _ = execute(path, ["cl.keep_checkpoints=none"], run_dir=tmp_path / "none", progress_bar=False,
                                    say=quiet)
    assert not (bare / "checkpoints").exists() and (bare / "results.json").is_file()
    assert state_bytes(bare) is None and state_bytes(folder) > 0  # `clp compare` prints n/a (no checkpoint)
    assert kept_results.matrix.values.tolist() == bare_results.matrix.values.tolist() == results.matrix.values.tolist()
    said = []
    execute(path, ["cl.keep_checkpoints=none"], run_dir=bare, progress_bar=False, say=said.append)
    assert any(line.startswith(f"run {bare} is already complete") for line in said), said


def test_the_report_prints_no_nan_and_says_how_to_make_the_report_and_open_tensorboard(tiny, tiny_base, tmp_path):
    path = tiny.config(tmp_path / "said.yaml")
    said = []
    folder, results, _ = execute(path, progress_bar=False, say=said.append)
    # The tiny stream's eval budget (256 tokens) holds a document or two per domain: each is named.
    docs = {d: s.splits["eval"].n_docs for d, s in load_setup(path).scenario.domains.items()}
    assert docs == {"math": 2, "code": 1}
    assert said[:2] == [
        f"warning: domain 'math' has 2 eval documents, too few for its intervals to mean anything (fewer than 5); "
        f"set token_budget.eval_docs: N in {tiny.stream} to cut each domain's eval budget into N documents",
        f"warning: domain 'code' has 1 eval document, too few for its intervals to mean anything (fewer than 5); "
        f"set token_budget.eval_docs: N in {tiny.stream} to cut each domain's eval budget into N documents",
    ]

    text = report(folder, results)
    assert not re.search(r"\bnan\b", text), text
    # Two experiences: nothing is two experiences later.
    assert "  gain left 2 experiences later      n/a (needs ≥ 3 experiences and a gain to retain)\n" in text
    assert ("  not meaningful for math, code: fewer than 5 evaluation documents to resample (set "
            "token_budget.eval_docs: N in the stream YAML to cut each domain's eval budget into N documents)") in text
    assert re.search(r"adaptation gain per experience: 1 math [+-]\d\.\d{4} \[n/a: 2 documents\]  "
                     r"2 code [+-]\d\.\d{4} \[n/a: 1 document\]", text), text
    assert f"\nreport: clp report {folder}   (HTML + Markdown into {folder / 'report'}/)" in text
    assert f"\nTensorBoard: tensorboard --logdir {folder.parent}   (this run: {folder.name}/tensorboard)" in text

    # What TensorBoard lists under that logdir: each run by the folder holding its events.
    mux = EventMultiplexer()
    mux.AddRunsFromDirectory(str(folder.parent))
    assert f"{folder.name}/tensorboard" in mux.Runs()

    # The printed report command makes the report.
    from experiments.report import main as clp_report

    assert clp_report([str(folder)]) == 0
    assert (folder / "report" / "report.html").is_file() and (folder / "report" / "report.md").is_file()
