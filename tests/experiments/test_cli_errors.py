"""Every `clp` command that reads a file answers a bad one — missing, not YAML, an unknown key, a
bad value — with one line `clp CMD: error: ...` naming the file (or the field), exit 2, no
traceback, before any work starts. Run in-process through `experiments.cli.main`, the function
the `clp` script calls, so the error boundary under test is the one users meet."""
from pathlib import Path

import pytest
import yaml

from experiments.cli import main

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments" / "configs"

# command, shipped file, its fields holding paths relative to it, a bad value, words the error must hold
COMMANDS = [
    ("run", "default.yaml", ["stream"], {"seed": "abc"}, ["'seed'"]),
    ("pretrain", "default.yaml", ["stream"], {"pretrain": {"steps": -5}}, ["'pretrain.steps'"]),
    ("recall", "recall.yaml", [], {"lr": -1}, ["lr"]),
    ("eval", "longctx.yaml", ["base"], {"split": "evall"}, ["split", "'evall'"]),
    ("niah", "niah.yaml", ["family"], {"episodes": -3}, ["episodes"]),
    ("compare", "compare_strategies.yaml", ["run"], {"seeds": "abc"}, ["seeds"]),
    ("sweep", "sweeps/fast_lr_chunk.yaml", ["run"], {"trials": -2}, ["trials"]),
    ("data stats", "streams/default.yaml", [], {"seq_len": -4}, ["seq_len"]),
]


def shipped_with(tmp_path: Path, name: str, relative: list[str], change: dict) -> Path:
    """A copy of a shipped config with `change` applied (its relative paths made absolute)."""
    src = EXPERIMENTS / name
    data = yaml.safe_load(src.read_text())
    for key in relative:
        data[key] = str((src.parent / data[key]).resolve())
    for key, value in change.items():
        if isinstance(value, dict):
            data.setdefault(key, {}).update(value)
        else:
            data[key] = value
    path = tmp_path / Path(name).name
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def error_line(capsys, argv: list[str], command: str) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert code == 2, (code, captured.out[-2000:], captured.err[-2000:])
    assert len(lines) == 1 and lines[0].startswith(f"clp {command}: error: "), captured.err
    assert "Traceback" not in captured.err
    return lines[0]


@pytest.mark.parametrize("command, name, relative, bad, words", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_config_command_answers_each_bad_file_with_one_line(capsys, tmp_path, command, name, relative, bad, words):
    argv = command.split()
    missing = tmp_path / "missing.yaml"
    assert f"{missing} does not exist" in error_line(capsys, [*argv, str(missing)], command)

    broken = tmp_path / "broken.yaml"
    broken.write_text("seeds: [0, 1\nname: x\n", encoding="utf-8")
    line = error_line(capsys, [*argv, str(broken)], command)
    assert f"{broken}: not valid YAML" in line and "line 2" in line, line

    unknown = shipped_with(tmp_path, name, relative, {"no_such_key": 1})
    line = error_line(capsys, [*argv, str(unknown)], command)
    assert str(unknown) in line and "no_such_key" in line, line

    # A near miss of a real field is answered with it. The typo replaces the field, so the file
    # would be refused for it even without the hint; the hint is what is asserted.
    (tmp_path / "t").mkdir()
    data = yaml.safe_load((EXPERIMENTS / name).read_text())
    real = sorted(k for k in data if k not in relative)[0]
    typo = shipped_with(tmp_path / "t", name, relative, {real[:-1]: data[real]})
    raw = yaml.safe_load(typo.read_text())
    del raw[real]
    typo.write_text(yaml.safe_dump(raw), encoding="utf-8")
    line = error_line(capsys, [*argv, str(typo)], command)
    assert f"did you mean '{real}'" in line, line

    (tmp_path / "v").mkdir()
    valued = shipped_with(tmp_path / "v", name, relative, bad)
    line = error_line(capsys, [*argv, str(valued)], command)
    assert str(valued) in line and all(w in line for w in words), line


def test_the_shipped_files_themselves_are_accepted_by_the_same_loaders(tmp_path):
    """The control for the test above: the copies differ from a good file only by the change
    (otherwise every case could fail for one shared reason, e.g. a path the copy broke)."""
    from cl_platform.config import load_config
    from experiments.multi import compare, sweep_config
    from experiments.studies import longctx, niah, recall
    from streams.stream import load_stream_config

    loaders = {"run": load_config, "pretrain": load_config, "recall": recall.load, "eval": longctx.load,
               "niah": niah.load, "compare": compare.load, "sweep": sweep_config.load, "data stats": load_stream_config}
    for command, name, relative, _, _ in COMMANDS:
        folder = tmp_path / command.replace(" ", "_")
        folder.mkdir()
        assert loaders[command](shipped_with(folder, name, relative, {})) is not None


def test_report_and_tokenizer_refuse_bad_paths_with_one_line(capsys, tmp_path):
    line = error_line(capsys, ["report", str(tmp_path / "nothing-here")], "report")
    assert str(tmp_path / "nothing-here") in line
    line = error_line(capsys, ["tokenizer", "build", "--out", str(tmp_path / "no" / "tok.json")], "tokenizer build")
    assert f"its folder {tmp_path / 'no'} does not exist" in line


def test_a_bad_number_argument_is_refused_by_argparse(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "layer", "--threads", "0"])
    assert exit_.value.code == 2 and "--threads: 0 must be >= 1" in capsys.readouterr().err


@pytest.mark.parametrize("command, name, relative, bad, words", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_every_config_command_takes_the_same_bad_value_as_a_dotted_override(capsys, tmp_path, command, name, relative,
                                                                             bad, words):
    """`CONFIG key=value` goes through the loader's own checks: the bad value of the test above,
    given on the command line instead of in the file, is refused the same way."""
    good = shipped_with(tmp_path, name, relative, {})
    key, value = next(iter(bad.items()))
    if isinstance(value, dict):
        key, value = f"{key}.{next(iter(value))}", next(iter(value.values()))
    line = error_line(capsys, [*command.split(), str(good), f"{key}={value}"], command)
    assert all(w in line for w in words), line
    line = error_line(capsys, [*command.split(), str(good), "no_such_key=1"], command)
    assert "no_such_key" in line, line
    line = error_line(capsys, [*command.split(), str(good), "seed"], command)
    assert "override 'seed': expected key=value" in line, line


def test_overrides_reach_every_loader(tmp_path):
    from cl_platform.config import load_config
    from experiments.multi import compare, sweep_config
    from experiments.studies import longctx, niah, recall
    from streams.stream import load_stream_config

    def copy(name, relative):
        folder = tmp_path / name.replace("/", "_")
        folder.mkdir(exist_ok=True)
        return shipped_with(folder, name, relative, {})

    exp = recall.load(copy("recall.yaml", []), overrides=["seeds=[5]", "recall.num_pairs=4"])
    assert exp.seeds == [5] and exp.recall["num_pairs"] == 4
    assert longctx.load(copy("longctx.yaml", ["base"]), overrides=["buckets=[0, 64]"]).buckets == [0, 64]
    assert niah.load(copy("niah.yaml", ["family"]), overrides=["episodes=7"]).episodes == 7
    assert compare.load(copy("compare_strategies.yaml", ["run"]), overrides=["seeds=[3]"]).seeds == [3]
    sweep = sweep_config.load(copy("sweeps/fast_lr_chunk.yaml", ["run"]),
                              overrides=["trials=3", "space.cl.fwpkm.chunk.choices=[64, 128]"])
    assert sweep.trials == 3 and sweep.space["cl.fwpkm.chunk"].choices == [64, 128]
    assert load_stream_config(copy("streams/default.yaml", []), overrides=["seq_len=256"]).seq_len == 256
    assert load_config(copy("default.yaml", ["stream"]), ["seed=4"]).seed == 4


def test_a_list_given_without_brackets_is_one_line_naming_the_field_and_the_bracketed_form(capsys, tmp_path):
    good = shipped_with(tmp_path, "default.yaml", ["stream"], {})
    line = error_line(capsys, ["run", str(good), "order=math,law"], "run")
    assert line == ("clp run: error: command line: run config field 'order': expects a list, got 'math,law'; "
                    "write a list in brackets: order=[math,law] on the command line, [math,law] in a YAML file")
    line = error_line(capsys, ["run", str(good), "model.fwpkm_layers=1,3"], "run")
    assert "'model.fwpkm_layers'" in line and "model.fwpkm_layers=[1,3]" in line, line
