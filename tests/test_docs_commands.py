"""Every `clp` command the documentation shows is a real one, and the guide stays a guide.

What counts as a shown command: in README.md and docs/*.md, a line of a fenced code block (not a
`python` block: those show code, and may name a command that a worked example adds) or of an
indented code block, and an inline code span, that contains `clp` (or `.venv/bin/clp`, or
`-m experiments.cli`) followed by its arguments. Each is checked as the CLI would take it:

- parsed by the CLI's own parser (`experiments.cli.build_parser`), so the command and its flags
  exist and their values parse (`--seeds 0,1,2` through the row's own parser);
- the config file it names loaded by that command's loader, with the dotted overrides the command
  shows (`LOADERS` below: what each command's entry function reads before any work). A run config
  is loaded with its named base's settings (`experiments.setup.load_run_config`), its strategy
  built and checked (`make_strategy`), its stream file read and fitted to the base's tokenizer and
  segment length; nothing trains and no stream is tokenised.

Two small, explicit rules, and no error is swallowed:

- a **template** (a token that is a placeholder: an upper-case word such as `CONFIG`, `SWEEP.yaml`,
  `runs/NAME`, `journal:PATH`, `N`; `<...>`; `[...]`; `...`; `key=value`; `a|b`; a `my_*` file)
  is checked for its command name and flag names only;
- a **mention** (the command's name and flags without their values or config: `clp run --resume`,
  `clp niah`) is checked the same way;
- where the command word itself is a placeholder (`clp <command> --help`, `clp ...`) there is
  nothing to check; `clp --help` is checked as the top-level help.

A failure names the file and line of the command. The other tests keep the README a guide (at most
300 lines, "how to add a strategy" one link from its first screen, no lab-notebook references) and
the example configs the docs show equal to the shipped files.
"""
from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# The guide pages (written as a user guide, not a notebook: no "stop N", issue numbers or dates).
GUIDE = [ROOT / "README.md", *(ROOT / "docs" / f"{name}.md" for name in (
    "running", "own-data", "bases", "compare", "sweeps", "reports", "scaling", "studies", "extending"))]
# Shipped files the docs show verbatim: a YAML block whose first line is `# <path>` must be the file.
SHOWN_FILES = ("experiments/configs/examples/own_domain.yaml", "experiments/configs/examples/own_domain_run.yaml")

FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
CLP = re.compile(r"(?:^|(?<=[\s#(]))((?:\S*/)?clp|-m experiments\.cli)\s+\S")
SHELL_END = {"|", "||", "&&", ";", "&", ">", ">>", "2>", "2>&1"}
UPPER = re.compile(r"[A-Z][A-Z0-9_]*")


@dataclasses.dataclass(frozen=True)
class Shown:
    file: str  # relative to the repository root
    line: int
    argv: tuple[str, ...]  # what follows `clp`

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: clp {' '.join(self.argv)}"


# --- finding the commands -------------------------------------------------------------------------
def command_argv(text: str) -> tuple[str, ...] | None:
    """The arguments after `clp` in one command line (its shell comment and any pipe cut off), or
    None when the text shows no command."""
    match = CLP.search(text)
    if match is None:
        return None
    tokens = shlex.split(text[match.start(1):], comments=True)
    tokens = tokens[2:] if tokens[0] == "-m" else tokens[1:]
    for i, token in enumerate(tokens):
        if token in SHELL_END:
            tokens = tokens[:i]
            break
    return tuple(tokens) or None


def code_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, command text) of every line of a fenced (non-Python) or indented code block,
    lines continued with a trailing backslash joined to the line they start."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[tuple[int, str]] = []
    fence: str | None = None
    language = ""
    pending: tuple[int, str] | None = None
    previous_blank_or_code = True
    for number, line in enumerate(lines, start=1):
        opened = FENCE.match(line)
        if fence is None and opened:
            fence, language = opened.group(1), opened.group(2).lower()
            continue
        if fence is not None:
            if line.strip().startswith(fence) and line.strip().strip(fence[0]) == "":
                fence = None
                continue
            if language == "python":
                continue
            if pending is not None:
                start, text = pending
                text += " " + line.strip()
            else:
                start, text = number, line
            if text.rstrip().endswith("\\"):
                pending = (start, text.rstrip()[:-1])
                continue
            pending = None
            out.append((start, text))
            continue
        indented = line.startswith("    ") and bool(line.strip())
        if indented and previous_blank_or_code and re.match(r"\s*(?:\.venv/bin/)?clp\s", line):
            out.append((number, line))
            previous_blank_or_code = True
            continue
        previous_blank_or_code = not line.strip()
    return out


def inline_spans(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of every inline code span outside code blocks; a span may wrap lines
    within one paragraph."""
    lines = path.read_text(encoding="utf-8").splitlines()
    prose: list[str] = []
    fence: str | None = None
    for line in lines:
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)
            prose.append("")
        elif fence is not None:
            if line.strip().startswith(fence) and line.strip().strip(fence[0]) == "":
                fence = None
            prose.append("")
        else:
            prose.append(line)
    out: list[tuple[int, str]] = []
    start = 0
    while start < len(prose):
        if not prose[start].strip():
            start += 1
            continue
        end = start
        while end < len(prose) and prose[end].strip():
            end += 1
        paragraph = "\n".join(prose[start:end])
        for match in re.finditer(r"(?<!`)`([^`]+)`(?!`)", paragraph):
            out.append((start + 1 + paragraph.count("\n", 0, match.start()), match.group(1).replace("\n", " ")))
        start = end
    return out


def shown_commands() -> list[Shown]:
    found = []
    for path in DOCS:
        rel = str(path.relative_to(ROOT))
        for number, text in [*code_lines(path), *inline_spans(path)]:
            argv = command_argv(text)
            if argv is not None:
                found.append(Shown(rel, number, argv))
    return sorted(set(found), key=lambda s: (s.file, s.line, s.argv))


# --- checking them ---------------------------------------------------------------------------------
def is_placeholder(token: str) -> bool:
    """A token that stands for something the reader fills in (see the module docstring)."""
    if token == "key=value" or token.startswith("[") or "..." in token or any(c in token for c in "<>|…"):
        return True
    value = token.split("=", 1)[-1]
    if any(UPPER.fullmatch(part) for part in re.split(r"[/.:,-]", value)):
        return True
    return Path(value).name.startswith("my_")


def command_row(argv: tuple[str, ...]):
    """The COMMANDS row the command's first words name, or None."""
    from experiments.cli import COMMANDS

    words = [a for a in argv[:2]]
    for cmd in COMMANDS:
        name = cmd.name.split()
        if words[: len(name)] == name:
            return cmd
    return None


def check_name_and_flags(shown: Shown) -> None:
    cmd = command_row(shown.argv)
    if cmd is None:
        pytest.fail(f"{shown}: no such command (experiments/cli.py COMMANDS)")
    known = {"-h", "--help", *(flag for a in cmd.args for flag in a.flags)}
    flags = [t.split("=", 1)[0] for t in shown.argv[len(cmd.name.split()):] if t.startswith("-")]
    unknown = [f for f in flags if f not in known]
    if unknown:
        pytest.fail(f"{shown}: clp {cmd.name} has no flag(s) {unknown}; it has {sorted(known)}")


def is_mention(shown: Shown, cmd) -> bool:
    """The command's name and flags only, no config or flag values: `clp run --resume`."""
    return cmd is not None and all(t.startswith("-") for t in shown.argv[len(cmd.name.split()):])


def load_run(config, overrides, base_seeds=None):
    """What `clp run` / `clp pretrain` read before any work: the run config with its named base's
    settings, its stream file fitted to that base (tokenizer, seq_len), and with --base-seeds every
    seed's base (experiments/multi/seeds.py's own check)."""
    from experiments.base_record import fit_stream
    from experiments.multi.seeds import check_given_bases
    from experiments.setup import load_run_config
    from streams.stream import load_stream_config

    cfg, base = load_run_only(config, overrides)
    fit_stream(load_stream_config(cfg.stream), base, cfg.stream)
    if base_seeds is not None:
        check_given_bases(config, overrides, base_seeds)
        for seed in base_seeds:
            load_run_config(config, [*overrides, f"pretrain.seed={seed}"])


def load_run_only(config, overrides=()):
    """The run config with its named base's settings, and its strategy built and checked against
    the model and mode (experiments/setup.py's own make_strategy; the stream is not built)."""
    from types import SimpleNamespace

    from experiments.setup import load_run_config, make_strategy

    cfg, base = load_run_config(config, overrides)
    make_strategy(SimpleNamespace(config=cfg, config_path=Path(config), model_config=cfg.model, scenario=None))
    return cfg, base


def load_recall(config, overrides, seeds=None):
    from experiments.studies import recall

    recall.load(config, seeds, overrides)


def load_eval(config, overrides, seeds=None, variants=None):
    from experiments.studies import longctx

    load_run_only(longctx.load(config, seeds, variants, overrides).base)


def load_repeat(config, overrides, seeds=None, variants=None):
    from experiments.studies import repeat
    from experiments.studies.family import load_family

    load_run_only(load_family(repeat.load(config, seeds, variants, overrides).family).base)


def load_niah(config, overrides, seeds=None, models=None, base_seeds=None):
    from experiments.studies import niah
    from experiments.studies.family import load_family

    exp = niah.load(config, seeds, models, overrides)
    family = load_family(exp.family)
    unknown = [m for m, spec in exp.models.items() if spec.get("variant") not in family.variants]
    assert not unknown, f"models {unknown} name variants the family {exp.family} does not have"
    load_run_only(family.base)


def load_compare(config, overrides, seeds=None, entries=None, base_seeds=None):
    from experiments.multi import compare
    from experiments.multi.seeds import check_given_bases

    comp = compare.load(config, seeds, entries, base_seeds, overrides)
    # A key that is not a field of the comparison file is a run-level override (`runs_root=DIR`).
    for entry, entry_overrides in comp.entries.items():
        load_run_only(comp.run, [*comp.run_overrides, *entry_overrides])
    check_given_bases(comp.run, comp.run_overrides, comp.base_seeds)


def load_sweep(config, overrides, trials=None, storage=None):
    from experiments.multi import sweep_config

    sweep = sweep_config.load(config, trials, storage, overrides)
    load_run_only(sweep.run, [*sweep.run_overrides, *sweep.overrides])  # a trial's fixed overrides


def load_stream(config, overrides):
    from streams.stream import load_stream_config

    load_stream_config(config, overrides)


def load_tokenizer_stream(stream=None, out=None):
    from cl_platform.check import ConfigError

    if stream is not None:
        if out is None:  # streams/tokenizer_build.py:main refuses it first thing
            raise ConfigError("--stream needs --out (the default --out is the shipped tokenizer)")
        load_stream(stream, [])


def parse_only(**_):
    """Commands that name no config file: `clp report PATH...` reads run folders (what runs
    write, not files of the repository), `clp bench ...`, `clp data build-general` (clones)."""


LOADERS = {
    "run": load_run,
    "pretrain": load_run,
    "recall": load_recall,
    "eval": load_eval,
    "repeat": load_repeat,
    "niah": load_niah,
    "compare": load_compare,
    "sweep": load_sweep,
    "data stats": load_stream,
    "tokenizer build": load_tokenizer_stream,
    "report": parse_only,
    "data build-general": parse_only,
    "bench layer": parse_only,
    "bench step": parse_only,
    "bench device": parse_only,
    "bench speed": parse_only,
}


def check_command(shown: Shown) -> None:
    import inspect

    from experiments.cli import build_parser

    if shown.argv[0].startswith("-"):  # `clp --help`
        if not set(shown.argv) <= {"-h", "--help"}:
            pytest.fail(f"{shown}: clp itself takes only --help")
        return
    if is_placeholder(shown.argv[0]):  # the command itself is a placeholder: `clp <command> --help`
        return
    cmd = command_row(shown.argv)
    if any(is_placeholder(t) for t in shown.argv) or is_mention(shown, cmd):
        check_name_and_flags(shown)
        return
    try:
        args = build_parser().parse_args(list(shown.argv))
    except SystemExit:
        pytest.fail(f"{shown}: the CLI's parser refuses it (see its usage line above)")
    cmd = args.command_row
    values = vars(args)
    for a in cmd.args:  # as experiments.cli.dispatch does
        dest = a.options.get("dest") or a.flags[0].lstrip("-").replace("-", "_")
        if a.parse is not None and values.get(dest) is not None:
            values[dest] = a.parse(values[dest])
    loader = LOADERS[cmd.name]
    params = inspect.signature(loader).parameters
    try:
        loader(**{k: v for k, v in values.items() if k in params})
    except Exception as err:  # noqa: BLE001 - every failure is reported with where the docs show it
        pytest.fail(f"{shown}: {type(err).__name__}: {err}")


COMMANDS_SHOWN = shown_commands()


def test_the_loader_table_covers_every_command():
    from experiments.cli import COMMANDS

    assert sorted(LOADERS) == sorted(c.name for c in COMMANDS)


def test_the_docs_show_commands():
    files = {s.file for s in COMMANDS_SHOWN}
    assert "README.md" in files and len(COMMANDS_SHOWN) > 20, files


@pytest.mark.parametrize("shown", COMMANDS_SHOWN, ids=str)
def test_every_shown_command_is_real(shown, monkeypatch):
    monkeypatch.chdir(ROOT)  # the docs' paths are relative to the repository root
    check_command(shown)


def test_the_checker_tells_templates_mentions_and_commands_apart():
    assert command_argv(".venv/bin/clp run experiments/configs/default.yaml seed=1   # a comment") == (
        "run", "experiments/configs/default.yaml", "seed=1")
    assert command_argv("srun clp run a.yaml --resume | tee log") == ("run", "a.yaml", "--resume")
    assert command_argv("torchrun --nnodes 2 -m experiments.cli run a.yaml") == ("run", "a.yaml")
    assert command_argv("clp") is None
    for token in ("CONFIG", "SWEEP.yaml", "runs/NAME", "journal:PATH", "N", "<run", "[--seeds", "...",
                  "key=value", "runs_root=DIR", "my_run.yaml", "run|pretrain", "runs/sweep-NAME/best.yaml"):
        assert is_placeholder(token), token
    for token in ("experiments/configs/default.yaml", "cl.fwpkm.lr_values=0.3", "order=[math,law]", "0,1,2",
                  "strategy.kwargs={size: 64}", "postgresql://user@host/optuna", "--base-seeds"):
        assert not is_placeholder(token), token
    run = command_row(("run",))
    assert is_mention(Shown("x", 1, ("run", "--resume")), run)
    assert not is_mention(Shown("x", 1, ("run", "a.yaml")), run)
    with pytest.raises(pytest.fail.Exception, match="no flag"):
        check_name_and_flags(Shown("x", 1, ("run", "CONFIG", "--wrong")))
    with pytest.raises(pytest.fail.Exception, match="no such command"):
        check_name_and_flags(Shown("x", 1, ("runn", "CONFIG")))


def test_a_wrong_command_fails_with_its_file_and_line(monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(pytest.fail.Exception, match=r"README.md:7: .*unknown field"):
        check_command(Shown("README.md", 7, ("run", "experiments/configs/default.yaml", "cl.nope=1")))
    with pytest.raises(pytest.fail.Exception, match=r"docs/x.md:3: .*parser refuses"):
        check_command(Shown("docs/x.md", 3, ("run", "experiments/configs/default.yaml", "--wokers", "2")))


def test_inline_spans_and_code_blocks_are_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Run `clp run\nexperiments/configs/default.yaml seed=1` now.\n\n"
                    "```bash\nclp sweep a.yaml \\\n    --workers 2   # two\n```\n\n"
                    "```python\n\"\"\"`clp domainloss CONFIG`\"\"\"\n```\n\n"
                    "    clp report runs/x\n", encoding="utf-8")
    found = [(n, command_argv(t)) for n, t in [*code_lines(page), *inline_spans(page)] if command_argv(t)]
    assert sorted(found) == [(1, ("run", "experiments/configs/default.yaml", "seed=1")),
                             (5, ("sweep", "a.yaml", "--workers", "2")),
                             (13, ("report", "runs/x"))]


# --- the shipped files the docs show, and the README as a guide -----------------------------------
def yaml_blocks(path: Path) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of every fenced block."""
    blocks, fence, start, body = [], None, 0, []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        opened = FENCE.match(line)
        if fence is None and opened:
            fence, start, body = opened.group(1), number + 1, []
        elif fence is not None and line.strip().startswith(fence) and line.strip().strip(fence[0]) == "":
            blocks.append((start, body))
            fence = None
        elif fence is not None:
            body.append(line)
    return blocks


def test_shown_example_files_equal_the_shipped_files():
    seen = set()
    for path in DOCS:
        for start, body in yaml_blocks(path):
            label = body[0].strip().lstrip("#").strip() if body else ""
            if label not in SHOWN_FILES:
                continue
            seen.add(label)
            shown = "\n".join(body[1:]) + "\n"
            shipped = (ROOT / label).read_text(encoding="utf-8")
            assert shown == shipped, (f"{path.relative_to(ROOT)}:{start}: the block labelled {label} differs from "
                                      "the shipped file; copy the file into the block")
    assert seen == set(SHOWN_FILES), f"the docs no longer show {sorted(set(SHOWN_FILES) - seen)}"


def test_the_readme_is_a_guide():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move how-to content to docs/"
    assert any("](docs/extending.md" in line for line in lines[:40]), \
        "README.md's first 40 lines must link docs/extending.md (how to add a strategy)"


NOTEBOOK = re.compile(r"\bstops? \d+|\bissues? #?\d+|(?<!\w)#\d{1,4}\b|\b20\d\d-\d\d-\d\d\b")


@pytest.mark.parametrize("path", GUIDE, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_guide_has_no_notebook_references(path):
    bad = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
           for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1) if NOTEBOOK.search(line)]
    assert not bad, "the guide says what to do, not when it was found (results: docs/results.md):\n" + "\n".join(bad)


@pytest.mark.parametrize("path", GUIDE, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_guide_links_resolve(path):
    text = path.read_text(encoding="utf-8")
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        file = target.split("#", 1)[0]
        if not (path.parent / file).exists():
            missing.append(target)
    assert not missing, f"{path.relative_to(ROOT)} links to missing files: {missing}"


def test_every_command_of_the_table_is_in_the_readme_command_list():
    """The README's command table names every row of `experiments.cli.COMMANDS` (a new command
    shows up in the first place a user looks)."""
    from experiments.cli import COMMANDS

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text[text.index("## Commands"):text.index("## The main job")]
    missing = [c.name for c in COMMANDS if f"`clp {c.name}" not in table]
    assert not missing, f"README.md's command table lacks {missing}"
