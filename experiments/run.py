"""`clp run CONFIG [key=value ...]`: the platform's main job — learn a stream of domains, measure forgetting.

    clp run experiments/configs/default.yaml                      # pretrain (or reuse) the base, then the stream
    clp run experiments/configs/default.yaml cl.fwpkm.lr_values=0.3 seed=1   # dotted overrides (same base)
    clp run experiments/configs/default.yaml --resume             # continue a killed run from its last checkpoint
    clp run other.yaml --run-dir runs/NAME --resume       # refused if that folder holds another config
    clp run experiments/configs/default.yaml --reuse-stale-base   # keep a base built by other code (experiments/base.py)

The composition root: builds the stream (streams), the strategy (strategies) and the base model
(experiments/setup.py, experiments/base.py), hands them to `cl_platform.engine.ContinualRunner`,
then prints the results matrix, the forgetting summary (analysis) and where everything is. The
run folder is named from the hash of the run's identity (`experiments.setup.run_identity`);
running the same config again finds the finished run and prints it, and `clp run` on a run
folder's `config.yaml` finds that run.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Callable, Sequence

from cl_platform.base_file import BaseFile
from cl_platform.checkpoint import latest_checkpoint
from cl_platform.config import config_hash, to_yaml
from cl_platform.engine import ContinualRunner
from cl_platform.file_lock import FileLock
from cl_platform.lm_module import precision_note
from cl_platform.provenance import session
from cl_platform.results import ResultsMatrix, RunResults, perplexity
from cl_platform.run_dir import CHECKPOINT, LOCK, RunDirError, create_run_dir, inspect_run_dir, record_resume
from experiments.base import resolve_base
from experiments.callbacks import default_callbacks
from experiments.setup import Setup, base_key, build_model, load_setup, make_strategy, run_identity


def is_child_rank() -> bool:
    """True in the processes of a DDP run other than global rank 0: the ones Lightning starts by
    re-running this command (LOCAL_RANK), the other nodes' (NODE_RANK, torchrun's RANK, SLURM's
    SLURM_PROCID: cl_platform.device.launch_rank); rank 0 decides about the run folder and prints."""
    from cl_platform.device import launch_rank

    return launch_rank() > 0


def resolved_yaml(setup: Setup, run_hash: str, name: str) -> str:
    cfg = dataclasses.replace(setup.config, name=name, order=[exp.domain for exp in setup.scenario])
    header = (f"# Resolved configuration of run {run_hash[:12]} (full hash {run_hash}),\n"
              f"# from {setup.config_path}. `clp run` on this file finds the same run.\n")
    return header + to_yaml(cfg)


def execute(
    config: str | Path,
    overrides: Sequence[str] = (),
    resume: bool = False,
    run_dir: str | Path | None = None,
    progress_bar: bool = True,
    say: Callable[[str], None] = print,
    callbacks: list | None = None,
    reuse_stale_base: bool = False,
) -> tuple[Path, RunResults, Any]:
    """Everything `clp run` does but printing the final report: (run folder, results, runner or
    None when the run was already complete). `reuse_stale_base`: use a base built by other code
    instead of rebuilding (cached) or refusing (base_checkpoint) it; run.json records it."""
    child = is_child_rank()  # rank 0 decides about the run folder and prints; the others follow
    if child:
        say = _silent
    setup = load_setup(config, overrides)
    warn_few_documents(setup, say)
    strategy = make_strategy(setup)  # an unknown strategy fails before anything is trained
    cfg = setup.config
    # Identity needs the base's key, not its weights: a finished run is found without loading
    # (or pretraining) its base.
    fields = run_identity(setup, base_identity(setup))
    run_hash = config_hash(fields)
    name = cfg.name or setup.config_path.stem
    folder = Path(run_dir) if run_dir is not None else Path(cfg.runs_root) / f"{name}-{run_hash[:12]}"
    if folder.exists() and not folder.is_dir():
        raise RunDirError(f"{folder} is a file, not a run folder; choose another --run-dir")
    if not child and inspect_run_dir(folder, run_hash, fields, resume)[0] == "complete":  # reads only; final once complete
        say(f"run {folder} is already complete (same configuration hash {run_hash[:12]})")
        if cfg.cl.inspect and not (folder / "inspect").is_dir():
            # Recording is not part of a run's identity (it changes no result), so an earlier run
            # without it is this run; its records can only come from streaming it again.
            say(f"  it ran without cl.inspect, so it has no slot or gate records; to record them run it again "
                f"into another folder: clp run {setup.config_path} --run-dir <new folder>")
        return folder, RunResults.from_json(folder / "results.json"), None
    # The one question to the base cache, before the run folder exists: a given base that this
    # run cannot use is refused with nothing written. A DDP child rank takes the base rank 0 has
    # settled on; it never moves or rebuilds one.
    base = resolve_base(setup, say, reuse_stale=reuse_stale_base or child, progress_bar=progress_bar)
    if child:  # rank 0 holds the folder's lock and has made the folder decision; the others only read
        return _execute(setup, strategy, base, fields, run_hash, name, folder, "resume",
                        latest_checkpoint(folder / CHECKPOINT) if resume else None, progress_bar, say, callbacks)
    # One process runs a folder: the lock is taken before the folder is looked at again, so two
    # commands started together cannot both decide to create, or to resume, the same run.
    with FileLock(folder / LOCK, f"run folder {folder}", on_takeover=say):
        state, resume_from = inspect_run_dir(folder, run_hash, fields, resume)
        return _execute(setup, strategy, base, fields, run_hash, name, folder, state, resume_from,
                        progress_bar, say, callbacks)


def base_identity(setup: Setup) -> dict[str, str]:
    """The base in the run's identity: the pretraining key of the given checkpoint (from its
    record), or of the base this config pretrains."""
    if setup.config.base_checkpoint is None:
        return {"source": "pretrain", "key": base_key(setup)}
    return {"source": "checkpoint", "key": setup.base_record.key}


def _execute(setup: Setup, strategy: Any, base: BaseFile, fields: dict, run_hash: str, name: str, folder: Path,
             state: str, resume_from: Path | None, progress_bar: bool, say: Callable[[str], None],
             callbacks: list | None) -> tuple[Path, RunResults, Any]:
    cfg = setup.config
    if state == "complete":  # finished between the first look and the lock
        return folder, RunResults.from_json(folder / "results.json"), None
    resolved = resolved_yaml(setup, run_hash, name)
    callbacks = default_callbacks() + list(callbacks or []) + ([memory_recorder(setup)] if cfg.cl.inspect else [])
    model = build_model(setup.model_config, cfg.seed, cfg.pretrain.fwpkm)
    model.load_state_dict(base.weights)
    if (note := precision_note(cfg.cl.precision, "cl.precision")) is not None:  # pretraining's: experiments/base.py
        say(note)
    entry = base.entry()
    if state == "new":
        # The base's wall time counts for this run only if this run pretrained it.
        seconds = entry["pretraining_seconds"] if base.how == "pretrained" else base.how
        create_run_dir(folder, run_hash, fields, resolved,
                       record={**session(), "base": entry, "timings": {"base_pretraining": seconds}})
    runner = ContinualRunner(
        model=model,
        stream=setup.scenario,
        strategy=strategy,
        config=cfg,
        run_dir=folder,
        config_hash=run_hash,
        callbacks=callbacks,
        progress_bar=progress_bar,
        say=say,
    )
    say(f"run {folder}: {cfg.cl.mode} mode, {len(setup.scenario)} experiences "
        f"({' -> '.join(exp.domain for exp in setup.scenario)}), strategy {cfg.strategy_name}, "
        f"eval memory policy {cfg.cl.eval_memory}, evaluated on the {cfg.cl.eval_split} split")
    def restored() -> None:
        # A resume is recorded once its checkpoint has loaded: a refused one leaves the folder as it was.
        if resume_from is not None:
            say(f"resuming {folder} from {runner.saved_path} (step {runner.saved_step})")
        if state != "new" and not is_child_rank():
            record_resume(folder, {**session(), "base": entry})

    results = runner.run(resume_from=resume_from, on_restored=restored)
    return folder, results, runner


def warn_few_documents(setup: Setup, say: Callable[[str], None]) -> None:
    """One line per domain whose evaluated split holds too few documents for the document bootstrap
    (the printed intervals) to mean anything: an interval over one document has zero width."""
    from analysis.bootstrap import EVAL_DOCS_REMEDY, MIN_DOCUMENTS, few_documents

    split = setup.config.cl.eval_split
    documents = {name: setup.scenario.domains[name].splits[split].n_docs for name in setup.scenario.eval_domains}
    for name, n in few_documents(documents).items():
        say(f"warning: domain {name!r} has {n} {split} document{'' if n == 1 else 's'}, too few for its "
            f"intervals to mean anything (fewer than {MIN_DOCUMENTS}); "
            + EVAL_DOCS_REMEDY.format(stream=setup.config.stream))


def memory_recorder(setup: Setup):
    """`cl.inspect`'s recorder, with the tokenizer's text of each id and the base model's
    pretraining token counts (what is frequent or rare for the slow weights)."""
    import torch

    from cl_platform.memory_recorder import MemoryRecorder

    scenario = setup.scenario
    tok = scenario.tokenizer
    parts = [d.splits["pretrain"].segments.tokens.flatten() for d in scenario.domains.values()
             if d.splits["pretrain"].n_docs]
    counts = torch.bincount(torch.cat(parts), minlength=tok.vocab_size) if parts else None
    return MemoryRecorder(lambda i: tok.decode([i]), pretrain_counts=counts)


def _silent(_: str) -> None:
    pass


def perplexity_matrix(matrix: ResultsMatrix) -> ResultsMatrix:
    values = [[perplexity(v) for v in row] for row in matrix.values.tolist()]
    return ResultsMatrix(matrix.domains, matrix.experiences, values, "perplexity", True)


def report(folder: Path, results: RunResults) -> str:
    from analysis.bootstrap import few_documents, few_documents_note
    from analysis.metrics import report_order, summary
    from analysis.table import format_table, interval

    s = summary(results)
    lines = [
        f"results matrix, loss per token (row t = after experience t, * = domain it trained; "
        f"mode {results.mode}, eval memory {results.memory_policy}, strategy {results.strategy}):",
        format_table(results),
        "",
        format_table(perplexity_matrix(results.matrix), precision=1),
        "",
        "forgetting summary (loss; positive forgetting = worse than the best seen, positive "
        "gain/BWT/FWT/plasticity = better; retention is a fraction of the gain):",
    ]
    ci = _intervals(results)
    for metric in report_order():  # the registry (analysis.metrics.METRICS), headline numbers first
        key, label = metric.name, metric.label
        value = s.get(key, math.nan)
        if math.isnan(value):  # e.g. retention 2 experiences later on a 2-domain stream
            lines.append(f"  {label:<34} {metric.undefined_text}")
            continue
        extra = f"  (ppl {math.exp(value):.1f})" if key == "average_final" else ""
        if ci is not None and key in ci["metrics"]:
            extra += "  " + interval(ci["metrics"][key]["low"], ci["metrics"][key]["high"])
        lines.append(f"  {label:<34} {value:+.4f}{extra}")
    if ci is not None:
        few = few_documents(ci["documents"])

        def gain(domain: str, g: dict) -> str:
            if domain in few:  # a resample of one or two documents: its interval means nothing
                n = few[domain]
                return f"{g['value']:+.4f} [n/a: {n} document{'' if n == 1 else 's'}]"
            return f"{g['value']:+.4f} {interval(g['low'], g['high'])}"

        gains = "  ".join(f"{t} {d} {gain(d, g)}" for t, (d, g) in
                          enumerate(zip(results.matrix.experiences, ci["adaptation_gain_per_experience"]), start=1))
        docs = ", ".join(f"{d} {n}" for d, n in ci["documents"].items())
        lines += [f"  [low, high]: {ci['level']:.0%} intervals, paired bootstrap over evaluation documents ({docs}; "
                  f"{ci['samples']} draws); base-to-base spread not included (--base-seeds)"]
        if few:
            lines.append(f"  {few_documents_note(ci['documents'])}")
        lines.append(f"  adaptation gain per experience: {gains}")
    speed = _gain_speed(results)
    if speed:
        lines.append(f"  steps into each experience until half / 90% of its final gain (forgetting-curve segments): {speed}")
    lines += [
        "",
        f"run folder   {folder}/",
        "  config.yaml          resolved configuration (run.json: its hash and data fingerprints, code,",
        "                       versions, machine, the base used, wall seconds per phase)",
        "  results.json         results matrix, forgetting curves, seed, mode, memory policy, versions",
        *(["  checkpoints/last.ckpt  model, fast weights, optimiser, strategy state at the end (cl.keep_checkpoints)"]
          if (folder / "checkpoints" / "last.ckpt").is_file() else []),
        "  tensorboard/         curves eval/<domain>/loss, training losses, FwPKM statistics, matrix heatmap, hparams",
        # TensorBoard names a run by the path of its event folder under --logdir: pointed at the
        # folder of run folders, this run is `<run folder name>/tensorboard` (pointed at the run's
        # own tensorboard/ it would be '.'), beside every other run there.
        f"TensorBoard: tensorboard --logdir {folder.parent}   (this run: {folder.name}/tensorboard)",
        f"report: clp report {folder}   (HTML + Markdown into {folder / 'report'}/)",
    ]
    return "\n".join(lines)


def _gain_speed(results: RunResults) -> str | None:
    """How fast each experience reached its gain, read off the forgetting curves (None for runs
    made before rows recorded their steps)."""
    from analysis.curves import fraction_reached, gain_curve

    if not results.matrix.is_complete or not results.row_steps:
        return None
    parts = []
    for t, domain in enumerate(results.matrix.experiences, start=1):
        reached = fraction_reached(gain_curve(results, t))
        parts.append(f"{t} {domain} " + "/".join("-" if reached[f] is None else str(reached[f]) for f in (0.5, 0.9)))
    return "  ".join(parts)


def _intervals(results: RunResults) -> dict | None:
    """Document-bootstrap intervals, when the run recorded per-document losses (runs made before
    they were recorded have none)."""
    from analysis.bootstrap import bootstrap

    try:
        return bootstrap(results) if results.matrix.is_complete else None
    except ValueError:
        return None


def main(config: str, overrides: Sequence[str] = (), resume: bool = False, run_dir: str | None = None,
         reuse_stale_base: bool = False) -> int:
    folder, results, _ = execute(config, overrides, resume=resume, run_dir=run_dir, reuse_stale_base=reuse_stale_base)
    if not is_child_rank():
        print()
        print(report(folder, results))
    return 0
