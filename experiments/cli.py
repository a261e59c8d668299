"""`clp`: the platform's command line.

    clp bench layer [--quick]            FwPKM layer throughput / memory table (BENCHMARKS.md)
    clp bench step [--quick]             training / evaluation step, float32 vs bf16-mixed (BENCHMARKS.md)
    clp recall CONFIG [--seeds 0,1,2]    associative recall beyond the attention window, with and without FwPKM
    clp eval CONFIG [--seeds 0,1,2] [--variants a,b]   long-context loss by position of the baseline family, writes on / off
    clp niah CONFIG [--seeds 0,1,2] [--models a,b]   needle in a haystack with n-iter reading on the family's bases
    clp compare CONFIG [--seeds 0,1,2] [--entries a,b]   strategies side by side, mean ± std over seeds
    clp sweep SWEEP [--trials N] [--workers N] [--storage URL]   Optuna study over run settings (dev split)
    clp report PATH... [--out DIR]       HTML + Markdown report of run, comparison or sweep folders
    clp tokenizer build [--out PATH]     retrain the shipped byte-level BPE on the shipped corpora
    clp data stats CONFIG                documents / tokens / segments per domain and split
    clp pretrain CONFIG [key=value ...]  train (or find cached) the base model of a run config
    clp run CONFIG [key=value ...] [--resume] [--run-dir DIR]   the main job: stream the domains,
                                         results matrix
    clp run CONFIG [key=value ...] --seeds 0,1,2 [--base-seeds 0,1,2]   one run per seed, mean ± std
    clp run|pretrain CONFIG --reuse-stale-base   use a base built by other code instead of rebuilding it

`key=value` overrides a config field by its dotted path (`cl.fwpkm.lr_values=0.3`, `seed=1`,
`order=[math,law]`, `cl.fwpkm.lookahead=false`); values are YAML, checked against the field's type.

The CLI lives in `experiments/` because it is the composition root: it wires `streams`,
`strategies` and `analysis` to `cl_platform`, which must not import them (see docs/architecture.md).
Each subcommand is a thin call into the module that owns the work; imports are lazy so that
`clp --help` is instant.
"""
from __future__ import annotations

import argparse
import sys


def _bench_layer(args: argparse.Namespace) -> int:
    from experiments.bench_layer import main

    return main(quick=args.quick, threads=args.threads)


def _bench_step(args: argparse.Namespace) -> int:
    from experiments.bench_step import main

    return main(quick=args.quick, threads=args.threads, variants=args.variants)


def _recall(args: argparse.Namespace) -> int:
    from experiments.recall import main
    from experiments.seeds import parse_seeds

    return main(args.config, parse_seeds(args.seeds) if args.seeds is not None else None)


def _eval(args: argparse.Namespace) -> int:
    from experiments.longctx import main
    from experiments.seeds import parse_seeds

    return main(args.config, parse_seeds(args.seeds) if args.seeds is not None else None,
                args.variants.split(",") if args.variants else None)


def _niah(args: argparse.Namespace) -> int:
    from experiments.niah import main
    from experiments.seeds import parse_seeds

    return main(args.config, parse_seeds(args.seeds) if args.seeds is not None else None,
                args.models.split(",") if args.models else None)


def _compare(args: argparse.Namespace) -> int:
    from experiments.compare import main
    from experiments.seeds import parse_seeds

    return main(args.config, parse_seeds(args.seeds) if args.seeds is not None else None,
                args.entries.split(",") if args.entries else None,
                parse_seeds(args.base_seeds, "--base-seeds") if args.base_seeds is not None else None)


def _sweep(args: argparse.Namespace) -> int:
    from experiments.sweep import main

    return main(args.config, trials=args.trials, workers=args.workers, storage=args.storage,
                worker_index=args.worker_index)


def _report(args: argparse.Namespace) -> int:
    from experiments.report import main

    return main(args.paths, args.out)


def _tokenizer_build(args: argparse.Namespace) -> int:
    from streams.tokenizer_build import main

    return main(out=args.out, vocab_size=args.vocab_size)


def _data_stats(args: argparse.Namespace) -> int:
    from streams.stats import main

    return main(config=args.config)


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors a user can fix — a bad config (missing file, bad YAML, unknown key, bad value), a bad
    checkpoint, a run folder in use or of another config, a full disk or any other OS error, a run
    stopped on a non-finite loss: every command reports them as `clp CMD: error: ...`, exit 2, no
    traceback. Anything else is a bug and keeps its traceback."""
    from analysis.report_inputs import ReportInputError
    from cl_platform.check import ConfigError
    from cl_platform.checkpoint import CheckpointError
    from cl_platform.engine import RunDirError
    from cl_platform.file_lock import FolderBusy
    from cl_platform.trainer import RunStopped
    from experiments.sweep import SweepError
    from streams.errors import StreamDataError

    return (ConfigError, CheckpointError, RunDirError, RunStopped, StreamDataError, SweepError, ReportInputError,
            FolderBusy, OSError)


def _run(args: argparse.Namespace) -> int:
    from experiments.run import main

    if args.seeds is not None or args.base_seeds is not None:
        return _run_seeds(args)
    return main(config=args.config, overrides=args.overrides, resume=args.resume, run_dir=args.run_dir,
                reuse_stale_base=args.reuse_stale_base)


def _run_seeds(args: argparse.Namespace) -> int:
    from cl_platform.check import ConfigError
    from experiments.seeds import parse_seeds, run_seeds

    if args.run_dir is not None:
        raise ConfigError("--run-dir cannot be combined with --seeds: every member run has its own folder")
    seeds = parse_seeds(args.seeds) if args.seeds is not None else None
    base_seeds = parse_seeds(args.base_seeds, "--base-seeds") if args.base_seeds is not None else None
    run_seeds(args.config, args.overrides, seeds, base_seeds,  # members always resume where they stopped
              reuse_stale_base=args.reuse_stale_base)
    return 0


def _pretrain(args: argparse.Namespace) -> int:
    from experiments.pretrain import main

    return main(config=args.config, overrides=args.overrides, reuse_stale_base=args.reuse_stale_base)


REUSE_HELP = ("use the base (cached, or base_checkpoint) even if it was built by other code than this "
              "checkout's (default: rebuild a cached one, refuse a given one); run.json records it")


def positive_int(text: str) -> int:
    """argparse type: an int >= 1 (a bad value is refused with argparse's usage line, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clp", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="what", required=True)
    layer = bench.add_parser("layer", help="FwPKM layer tokens/s and peak memory")
    layer.add_argument("--quick", action="store_true", help="fewer sizes and repeats (smoke run)")
    layer.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: all cores)")
    layer.set_defaults(func=_bench_layer)
    step = bench.add_parser("step", help="model step time, float32 vs bf16-mixed")
    step.add_argument("--quick", action="store_true", help="fewer repeats (smoke run)")
    step.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: all cores)")
    step.add_argument("--variants", action="store_true", help="the baseline family: attention only, + PKM, + FwPKM, + both")
    step.set_defaults(func=_bench_step)

    recall = sub.add_parser("recall", help="associative recall beyond the attention window (issue 8)")
    recall.add_argument("config", help="recall YAML, e.g. experiments/recall.yaml")
    recall.add_argument("--seeds", default=None, help="comma-separated seeds, replacing the file's (e.g. 0,1,2)")
    recall.set_defaults(func=_recall)

    ev = sub.add_parser("eval", help="long-context loss by position of the baseline family (issue 8)")
    ev.add_argument("config", help="family YAML, e.g. experiments/longctx.yaml")
    ev.add_argument("--seeds", default=None, help="comma-separated base seeds, replacing the file's (e.g. 0,1,2)")
    ev.add_argument("--variants", default=None, help="comma-separated subset of the file's variants (e.g. attention,fwpkm)")
    ev.set_defaults(func=_eval)

    ni = sub.add_parser("niah", help="needle in a haystack with n-iter reading (issue 8)")
    ni.add_argument("config", help="needle YAML, e.g. experiments/niah.yaml")
    ni.add_argument("--seeds", default=None, help="comma-separated fine-tuning seeds, replacing the file's")
    ni.add_argument("--models", default=None, help="comma-separated subset of the file's models")
    ni.set_defaults(func=_niah)

    cmp_ = sub.add_parser("compare", help="strategies side by side on the same stream, base and seeds (issue 10)")
    cmp_.add_argument("config", help="comparison YAML, e.g. experiments/compare_strategies.yaml")
    cmp_.add_argument("--seeds", default=None, help="comma-separated seeds, replacing the file's")
    cmp_.add_argument("--entries", default=None, help="comma-separated subset of the file's entries")
    cmp_.add_argument("--base-seeds", default=None, help="comma-separated base seeds (pretrain.seed), replacing the file's")
    cmp_.set_defaults(func=_compare)

    sw = sub.add_parser("sweep", help="Optuna study over run-config settings, measured on the dev split (issue 11)")
    sw.add_argument("config", help="sweep YAML, e.g. experiments/sweeps/fast_lr_chunk.yaml")
    sw.add_argument("--trials", type=positive_int, default=None, help="COMPLETE + PRUNED trials to reach, replacing the file's")
    sw.add_argument("--workers", type=positive_int, default=1, help="processes optimizing the study together (this one + N-1)")
    sw.add_argument("--storage", default=None, help="SQLAlchemy URL, replacing the file's (default: sqlite in the sweep folder)")
    # Set on the extra processes --workers starts: they only run trials; the first process reports.
    sw.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    sw.set_defaults(func=_sweep)

    rep = sub.add_parser("report", help="self-contained HTML (+ Markdown) report of run, comparison or sweep folders")
    rep.add_argument("paths", nargs="+", metavar="PATH", help="run folders, a comparison folder or a sweep folder")
    rep.add_argument("--out", default=None, help="output folder (default: <first PATH>/report)")
    rep.set_defaults(func=_report)

    tok = sub.add_parser("tokenizer", help="tokenizer").add_subparsers(dest="what", required=True)
    build = tok.add_parser("build", help="retrain the shipped BPE tokenizer")
    build.add_argument("--out", default=None, help="output tokenizer.json (default: the shipped file)")
    build.add_argument("--vocab-size", type=positive_int, default=4096)
    build.set_defaults(func=_tokenizer_build)

    data = sub.add_parser("data", help="domain data").add_subparsers(dest="what", required=True)
    stats = data.add_parser("stats", help="per-domain, per-split statistics of a stream config")
    stats.add_argument("config", help="stream YAML, e.g. experiments/streams/default.yaml")
    stats.set_defaults(func=_data_stats)

    run = sub.add_parser("run", help="the main job: pretrain (or reuse) the base, stream the domains, results matrix")
    run.add_argument("config", help="run YAML, e.g. experiments/default.yaml")
    run.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides by dotted path, e.g. seed=1")
    run.add_argument("--resume", action="store_true", help="continue a killed run from its last checkpoint")
    run.add_argument("--run-dir", default=None, help="run folder (default: <runs_root>/<name>-<config hash>)")
    run.add_argument("--seeds", default=None, metavar="0,1,2",
                     help="one run per continual-phase seed, then mean ± std (experiments/seeds.py)")
    run.add_argument("--base-seeds", default=None, metavar="0,1,2",
                     help="one base model per seed (pretrain.seed), each with every --seeds seed")
    run.add_argument("--reuse-stale-base", action="store_true", help=REUSE_HELP)
    run.set_defaults(func=_run)

    pre = sub.add_parser("pretrain", help="train (or find cached) the base model of a run config")
    pre.add_argument("config", help="run YAML, e.g. experiments/default.yaml")
    pre.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides by dotted path")
    pre.add_argument("--reuse-stale-base", action="store_true", help=REUSE_HELP)
    pre.set_defaults(func=_pretrain)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    name = " ".join(v for v in (args.command, getattr(args, "what", None)) if v)
    try:
        return int(args.func(args) or 0)
    except user_errors() as err:
        print(f"clp {name}: error: {describe_error(err)}", file=sys.stderr)
        return 2


def describe_error(err: BaseException) -> str:
    """The error's own message; an OS error without one made readable ("[Errno 13] ...: 'path'"
    becomes "Permission denied: path")."""
    if isinstance(err, OSError) and type(err).__str__ is OSError.__str__ and err.strerror:
        return err.strerror + (f": {err.filename}" if err.filename is not None else "")
    return str(err)


if __name__ == "__main__":
    sys.exit(main())
