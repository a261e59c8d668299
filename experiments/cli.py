"""`clp`: the platform's command line, one table of commands.

    clp run CONFIG [key=value ...] [--resume] [--run-dir DIR]    the main job: stream the domains, results matrix
    clp run CONFIG [key=value ...] --seeds 0,1,2 [--base-seeds 0,1,2]   one run per seed, mean ± std
    clp pretrain CONFIG [key=value ...]                  train (or find cached) the base model of a run config
    clp recall CONFIG [key=value ...] [--seeds 0,1,2]    associative recall beyond the attention window
    clp eval CONFIG [key=value ...] [--variants a,b]     long-context loss by position, writes on / off
    clp repeat CONFIG [key=value ...] [--variants a,b]   verbatim recall of a passage read again beyond the window
    clp niah CONFIG [key=value ...] [--models a,b] [--base-seeds 0,1,2]   needle in a haystack with n-iter reading
    clp compare CONFIG [key=value ...] [--entries a,b] [--base-seeds 0,1,2]   strategies side by side
    clp sweep SWEEP [key=value ...] [--trials N] [--workers N] [--storage URL]   Optuna study (dev split)
    clp data stats CONFIG [key=value ...]                documents / tokens / segments per domain and split
    clp report PATH... [--out DIR]                       HTML + Markdown report of run, comparison or sweep folders
    clp tokenizer build [--out PATH]                     retrain the shipped byte-level BPE on the shipped corpora
    clp bench layer|step [--quick]                       benchmark tables (BENCHMARKS.md)
    clp bench device [--dry-run]                         the prepared GPU check, one table
    clp bench speed [--dry-run] [--out DIR]              the GPU speed check in capped stages, JSON + table
    clp run|pretrain CONFIG --reuse-stale-base           use a base built by other code instead of rebuilding it

Every command that reads a config file takes `CONFIG [key=value ...]`: `key` is a dotted field
path (`cl.fwpkm.lr_values=0.3`, `seed=1`, `order=[math,law]`, `recall.num_pairs=16`,
`trials=20`), the value is YAML, and it is checked by the same typed loader and checks as the
file itself. `--seeds 0,1,2` is sugar for `seeds=[0,1,2]` (`--base-seeds` for a run's
`pretrain.seed`, one base each).

One error boundary (`main`): every error a user can fix — a missing file, bad YAML, an unknown
key, a bad value, a run folder in use or of another config, a full disk, a run stopped on a
non-finite loss — is one line `clp CMD: error: ...` naming the file or field, exit 2, no
traceback. A run stopped by SIGTERM (preemption) writes its checkpoint first, prints one line
naming it and exits 143, like a process SIGTERM ended: `--resume` continues from that step.

The CLI lives in `experiments/` because it is the composition root: it wires `streams`,
`strategies` and `analysis` to `cl_platform`, which must not import them (see docs/architecture.md).
A command is a row of `COMMANDS`: the function that does the work (imported only when the command
runs, so `clp --help` is instant) is called with the parsed arguments its signature names.
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable


def seed_list(flag: str) -> Callable[[str], list[int]]:
    def parse(text: str) -> list[int]:
        from experiments.config_files import parse_seeds

        return parse_seeds(text, flag)
    return parse


def name_list(text: str) -> list[str]:
    return [part for part in text.split(",") if part]


def positive_int(text: str) -> int:
    """argparse type: an int >= 1 (a bad value is refused with argparse's usage line, exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be >= 1")
    return value


@dataclass(frozen=True)
class Arg:
    """One argparse argument; `parse` (if given) turns its text into the function's value inside
    the error boundary, so a bad value is a one-line error like a bad config value."""
    flags: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)
    parse: Callable[[str], Any] | None = None


def arg(*flags: str, parse: Callable[[str], Any] | None = None, **options: Any) -> Arg:
    return Arg(flags, options, parse)


@dataclass(frozen=True)
class Command:
    name: str        # "run", or "bench layer" for a command with a verb
    target: str      # "module:function", imported when the command runs
    help: str
    config: str | None = None  # the config file's kind: takes CONFIG [key=value ...]
    args: tuple[Arg, ...] = ()


SEEDS = arg("--seeds", default=None, metavar="0,1,2", parse=seed_list("--seeds"),
            help="comma-separated seeds, replacing the file's (sugar for seeds=[0,1,2])")
REUSE = arg("--reuse-stale-base", action="store_true",
            help="use the base (cached, or base_checkpoint) even if it was built by other code than this "
                 "checkout's (default: rebuild a cached one, refuse a given one); run.json records it")
QUICK = arg("--quick", action="store_true", help="fewer sizes and repeats (smoke run)")
THREADS = arg("--threads", type=positive_int, default=None, help="torch threads (default: all cores)")

COMMANDS = (
    Command("run", "experiments.cli:run_command",
            "the main job: pretrain (or reuse) the base, stream the domains, results matrix",
            config="run YAML, e.g. experiments/configs/default.yaml",
            args=(arg("--resume", action="store_true", help="continue a killed run from its last checkpoint"),
                  arg("--run-dir", default=None, help="run folder (default: <runs_root>/<name>-<config hash>)"),
                  arg("--seeds", default=None, metavar="0,1,2", parse=seed_list("--seeds"),
                      help="one run per continual-phase seed, then mean ± std (experiments/multi/seeds.py)"),
                  arg("--base-seeds", default=None, metavar="0,1,2", parse=seed_list("--base-seeds"),
                      help="one base model per seed (pretrain.seed), each with every --seeds seed"),
                  REUSE)),
    Command("pretrain", "experiments.pretrain:main", "train (or find cached) the base model of a run config",
            config="run YAML, e.g. experiments/configs/default.yaml", args=(REUSE,)),
    Command("recall", "experiments.studies.recall:main", "associative recall beyond the attention window",
            config="recall YAML, e.g. experiments/configs/recall.yaml", args=(SEEDS,)),
    Command("eval", "experiments.studies.longctx:main", "long-context loss by position of the baseline family",
            config="family YAML, e.g. experiments/configs/longctx.yaml",
            args=(arg("--seeds", default=None, metavar="0,1,2", parse=seed_list("--seeds"),
                      help="comma-separated base seeds, replacing the file's"),
                  arg("--variants", default=None, parse=name_list,
                      help="comma-separated subset of the file's variants (e.g. attention,fwpkm)"))),
    Command("repeat", "experiments.studies.repeat:main", "verbatim recall of a passage read again beyond the attention window",
            config="repeat YAML, e.g. experiments/configs/repeat_reference.yaml",
            args=(arg("--seeds", default=None, metavar="0,1,2", parse=seed_list("--seeds"),
                      help="comma-separated base seeds, replacing the file's"),
                  arg("--variants", default=None, parse=name_list,
                      help="comma-separated variants of the family, replacing the file's list"))),
    Command("niah", "experiments.studies.niah:main", "needle in a haystack with n-iter reading",
            config="needle YAML, e.g. experiments/configs/niah.yaml",
            args=(SEEDS, arg("--models", default=None, parse=name_list, help="comma-separated subset of the file's models"),
                  arg("--base-seeds", default=None, metavar="0,1,2", parse=seed_list("--base-seeds"),
                      help="comma-separated base seeds (the family's pretraining seeds): one run each, "
                           "t-intervals over the bases"))),
    Command("compare", "experiments.multi.compare:main", "strategies side by side on the same stream, base and seeds",
            config="comparison YAML, e.g. experiments/configs/compare_strategies.yaml",
            args=(SEEDS, arg("--entries", default=None, parse=name_list, help="comma-separated subset of the file's entries"),
                  arg("--base-seeds", default=None, parse=seed_list("--base-seeds"),
                      help="comma-separated base seeds (pretrain.seed), replacing the file's"))),
    Command("sweep", "experiments.multi.sweep:main", "Optuna study over run-config settings, measured on the dev split",
            config="sweep YAML, e.g. experiments/configs/sweeps/fast_lr_chunk.yaml",
            args=(arg("--trials", type=positive_int, default=None, help="COMPLETE + PRUNED trials to reach, replacing the file's"),
                  arg("--workers", type=positive_int, default=1, help="processes optimizing the study together (this one + N-1)"),
                  arg("--storage", default=None, help="SQLAlchemy URL or journal:PATH, replacing the file's (default: sqlite in the sweep folder)"),
                  # Set on the extra processes --workers starts: they only run trials; the first reports.
                  arg("--worker-index", type=int, default=0, help=argparse.SUPPRESS))),
    Command("data stats", "streams.stats:main", "per-domain, per-split statistics of a stream config",
            config="stream YAML, e.g. experiments/configs/streams/default.yaml"),
    Command("data build-general", "streams.general_corpus:main",
            "build the general pretraining corpus (Gutenberg books + Wikipedia) into streams/corpora/general",
            args=(arg("--gutenberg", required=True, metavar="DIR", help="clone of github.com/rcdm-uga/Gutenberg_Text"),
                  arg("--wikipedia", required=True, metavar="DIR", help="clone of github.com/ZhouYii/PatchedDistro"),
                  arg("--out", default=None, metavar="DIR", help="corpus folder (default: streams/corpora/general)"))),
    Command("report", "experiments.report:main", "self-contained HTML (+ Markdown) report of run, comparison or sweep folders",
            args=(arg("paths", nargs="+", metavar="PATH", help="run folders, a comparison folder or a sweep folder"),
                  arg("--out", default=None, help="output folder (default: <first PATH>/report)"))),
    Command("tokenizer build", "streams.tokenizer_build:main", "retrain the shipped BPE tokenizer",
            args=(arg("--out", default=None, help="output tokenizer.json (default: the shipped file)"),
                  arg("--vocab-size", type=positive_int, default=4096),
                  arg("--stream", default=None, help="train on this stream YAML's pretraining domains instead "
                                                     "(e.g. experiments/configs/streams/reference.yaml)"))),
    Command("bench layer", "experiments.studies.bench_layer:main", "FwPKM layer tokens/s and peak memory", args=(QUICK, THREADS)),
    Command("bench step", "experiments.studies.bench_step:main", "model step time, float32 vs bf16-mixed",
            args=(QUICK, THREADS, arg("--variants", action="store_true",
                                      help="the baseline family: attention only, + PKM, + FwPKM, + both"),
                  arg("--seq-len", type=positive_int, default=512, help="tokens per sequence (B = 8)"))),
    Command("bench device", "experiments.studies.bench_device:main", "the prepared GPU check: one table",
            args=(arg("--dry-run", action="store_true", help="the same code on the CPU at toy sizes"),)),
    Command("bench speed", "experiments.studies.gpu_speed_check:main", "the GPU speed check in capped stages (≤ 5 min): JSON + table",
            args=(arg("--dry-run", action="store_true", help="stages 2–6 on the CPU at toy sizes"),
                  arg("--out", default=None, metavar="DIR", help="output folder (default: $OUT)"))),
)

VERBS = {"bench": "benchmarks", "data": "domain data", "tokenizer": "tokenizer"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clp", description=__doc__.split("\n\n")[0])
    top = parser.add_subparsers(dest="command", required=True)
    groups: dict[str, Any] = {}
    for cmd in COMMANDS:
        verb, _, what = cmd.name.partition(" ")
        if what:
            if verb not in groups:
                groups[verb] = top.add_parser(verb, help=VERBS[verb]).add_subparsers(dest="what", required=True)
            sub = groups[verb].add_parser(what, help=cmd.help)
        else:
            sub = top.add_parser(cmd.name, help=cmd.help)
        if cmd.config is not None:
            sub.add_argument("config", help=cmd.config)
            sub.add_argument("overrides", nargs="*", metavar="key=value",
                             help="config overrides by dotted path, values in YAML (e.g. seed=1)")
        for a in cmd.args:
            sub.add_argument(*a.flags, **a.options)
        sub.set_defaults(command_row=cmd)
    return parser


def dispatch(cmd: Command, args: argparse.Namespace) -> int:
    """Call the command's function with the arguments its signature names."""
    values = vars(args)
    for a in cmd.args:
        dest = a.options.get("dest") or a.flags[0].lstrip("-").replace("-", "_")
        if a.parse is not None and values.get(dest) is not None:
            values[dest] = a.parse(values[dest])
    module, _, name = cmd.target.partition(":")
    function = getattr(importlib.import_module(module), name)
    params = inspect.signature(function).parameters
    return int(function(**{k: v for k, v in values.items() if k in params}) or 0)


def run_command(config: str, overrides: list[str], resume: bool = False, run_dir: str | None = None,
                reuse_stale_base: bool = False, seeds: list[int] | None = None,
                base_seeds: list[int] | None = None) -> int:
    """`clp run`: one run (experiments/run.py), or with `--seeds` / `--base-seeds` one run per seed
    and their aggregate (experiments/multi/seeds.py; members always resume where they stopped)."""
    if seeds is None and base_seeds is None:
        from experiments.run import main

        return main(config, overrides, resume=resume, run_dir=run_dir, reuse_stale_base=reuse_stale_base)
    from cl_platform.check import ConfigError
    from experiments.multi.seeds import run_seeds

    if run_dir is not None:
        raise ConfigError("--run-dir cannot be combined with --seeds: every member run has its own folder")
    run_seeds(config, overrides, seeds, base_seeds, reuse_stale_base=reuse_stale_base)
    return 0


def user_errors() -> tuple[type[BaseException], ...]:
    """Errors a user can fix — a bad config (missing file, bad YAML, unknown key, bad value), a bad
    checkpoint, a run folder in use or of another config, a full disk or any other OS error, a run
    stopped on a non-finite loss: every command reports them as `clp CMD: error: ...`, exit 2, no
    traceback. Anything else is a bug and keeps its traceback."""
    from analysis.report_inputs import ReportInputError
    from cl_platform.check import ConfigError
    from cl_platform.checkpoint import CheckpointError
    from cl_platform.file_lock import FolderBusy
    from cl_platform.run_dir import RunDirError
    from cl_platform.trainer import RunStopped
    from experiments.multi.sweep import SweepError
    from streams.errors import StreamDataError

    return (ConfigError, CheckpointError, RunDirError, RunStopped, StreamDataError, SweepError, ReportInputError,
            FolderBusy, OSError)


def describe_error(err: BaseException) -> str:
    """The error's own message; an OS error without one made readable ("[Errno 13] ...: 'path'"
    becomes "Permission denied: path")."""
    if isinstance(err, OSError) and type(err).__str__ is OSError.__str__ and err.strerror:
        return err.strerror + (f": {err.filename}" if err.filename is not None else "")
    return str(err)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cmd = args.command_row
    del args.command_row
    from cl_platform.preemption import EXIT_CODE, RunPreempted

    if not sys.stderr.isatty():
        # In a log file a bar's carriage returns make one endless line: HF datasets' bars (building
        # a stream cache) are off; training prints plain lines instead of its bar (cl_platform/trainer.py).
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    try:
        return dispatch(cmd, args)
    except RunPreempted as err:  # not an error: the scheduler's requeue runs the same command with --resume
        print(f"clp {cmd.name}: {err}", file=sys.stderr)
        return EXIT_CODE
    except user_errors() as err:
        print(f"clp {cmd.name}: error: {describe_error(err)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
