"""A base built by other code is named and rebuilt (or, when asked, reused and recorded); a bad
`base_checkpoint` is refused naming the file and why; run.json records the code, versions,
machine and wall seconds per phase, summed over a resume."""
import json
import shutil

import lightning as L
import pytest
import torch

from cl_platform.checkpoint import FORMAT, CheckpointError, load_checkpoint, save_checkpoint
from cl_platform.provenance import VERSIONS, all_code, base_code
from cl_platform.results import package_versions
from experiments.base import base_dir, resolve_base
from experiments.cli import main as cli_main
from experiments.run import execute
from experiments.setup import base_key, load_setup

FWPKM = "cl_platform/memory/fwpkm.py"
# What a run says of a base built by code that differs in one file (FWPKM) when this code
# reproduces its probe: in plain words, not the probe's raw difference.
SAME_FUNCTION = ("the code has changed in 1 file since it was built, and this code computes the same function with "
                 "it: its probe reproduces within 1e-4 nats")


def quiet(_):
    pass


def other_code(record: dict) -> None:
    """The record of a base whose FwPKM layer was another file."""
    record["code"] = {"modules": {**record["code"]["modules"], FWPKM: "0" * 64}, "combined": "f" * 64}


def no_code(record: dict) -> None:
    """The record of a base made before bases recorded their code."""
    del record["code"]


def rewrite_record(src, dst, change) -> dict:
    """Copy the base checkpoint `src` to `dst` with its record changed by `change`."""
    data = load_checkpoint(src, "base")
    change(data["record"])
    save_checkpoint(dst, "base", data["model_config"], {"key": data["key"], "model": data["model"], "record": data["record"]})
    return data["record"]


def stale_cache(tiny_base, runs, change, probe: bool = False):
    """A copy of the tiny base's cache folder under `runs`, its record changed by `change`; without
    its probe.json unless `probe` (a base that no probe vouches for, as those made before probes)."""
    from cl_platform.probe import PROBE_FILE

    folder = runs / tiny_base.path.parent.name
    shutil.copytree(tiny_base.path.parent, folder)
    rewrite_record(tiny_base.path, folder / "base.ckpt", change)
    if not probe:
        (folder / PROBE_FILE).unlink()
    return folder


def run_json(folder) -> dict:
    return json.loads((folder / "run.json").read_text())


def test_a_cached_base_built_by_other_code_is_named_kept_aside_and_rebuilt(tiny, tiny_base, tmp_path):
    runs = tmp_path / "runs"
    cache = stale_cache(tiny_base, runs, other_code)
    said = []
    folder, results, _ = execute(tiny.config(tmp_path / "run.yaml", runs_root=str(runs), order=["code"]),
                                 progress_bar=False, say=said.append)
    aside = runs / f"{cache.name}.stale-ffffffffffff"
    assert f"base model: cached {cache / 'base.ckpt'} was built by other code ({FWPKM} differs): moved to {aside}, " \
           f"rebuilding (--reuse-stale-base would reuse it)" in said, said
    assert load_checkpoint(aside / "base.ckpt", "base")["record"]["code"]["modules"][FWPKM] == "0" * 64  # kept
    rebuilt = load_checkpoint(cache / "base.ckpt", "base")
    assert rebuilt["record"]["code"] == base_code()
    # Same configuration, data and code: the rebuild is the session's base, bit for bit.
    original = load_checkpoint(tiny_base.path, "base")["model"]
    assert rebuilt["model"].keys() == original.keys()
    assert all(torch.equal(rebuilt["model"][k], original[k]) for k in original)
    # The base's own record: code, versions, machine, seconds.
    record = json.loads((cache / "pretrain.json").read_text())
    assert record["code"] == base_code() and record["versions"] == package_versions(VERSIONS)
    assert record["machine"]["torch_threads"] == torch.get_num_threads() and record["machine"]["cpu"]
    assert record["seconds"] >= 0
    # The run pretrained its base: run.json counts the pretraining's seconds.
    meta = run_json(folder)
    assert meta["base"] == {"path": str(cache / "base.ckpt"), "how": "pretrained", "key": rebuilt["key"],
                            "code": base_code()["combined"], "reused_stale": False, "changed_modules": [],
                            "pretraining_seconds": record["seconds"], "probe_difference": None}
    timings = meta["timings"]
    assert timings["base_pretraining"] == record["seconds"]
    phases = [timings["row0_eval"]] + [e[k] for e in timings["experiences"] for k in ("train", "eval")]
    assert timings["total"] == pytest.approx(record["seconds"] + sum(phases))
    assert results.matrix.is_complete


def test_a_cached_base_from_other_code_that_computes_the_same_function_is_used_and_one_that_does_not_is_rebuilt(
        tiny, tiny_base, tmp_path):
    from cl_platform.probe import PROBE_FILE

    runs = tmp_path / "runs"
    cache = stale_cache(tiny_base, runs, other_code, probe=True)
    before = (cache / "base.ckpt").read_bytes()
    setup = load_setup(tiny.config(tmp_path / "run.yaml", runs_root=str(runs)))
    said = []
    base = resolve_base(setup, progress_bar=False, say=said.append)
    path, record, cached, weights = base.path, base.record, base.how != "pretrained", base.weights
    assert cached and path == cache / "base.ckpt" and (cache / "base.ckpt").read_bytes() == before
    assert any(line.startswith(f"base model: cached {path} ({SAME_FUNCTION}; eval loss ") for line in said), said
    assert 0 <= base.probe_difference <= 1e-4 and record["code"]["modules"][FWPKM] == "0" * 64
    assert sorted(p.name for p in runs.iterdir() if p.name.startswith("pretrain-")) == [cache.name]  # nothing moved
    # A probe this code does not reproduce (one loss moved by 1e-3): moved aside and rebuilt.
    recorded = json.loads((cache / PROBE_FILE).read_text())
    (cache / PROBE_FILE).write_text(json.dumps({**recorded, "write": recorded["write"] + 1e-3}))
    said = []
    base = resolve_base(setup, progress_bar=False, say=said.append)
    rebuilt, cached = base.record, base.how != "pretrained"
    assert not cached and rebuilt["code"] == base_code()
    assert (runs / f"{cache.name}.stale-ffffffffffff" / "base.ckpt").read_bytes() == before
    assert any("moved to" in line for line in said), said


def test_a_cached_base_without_a_code_record_is_rebuilt_as_built_by_unknown_code(tiny, tiny_base, tmp_path):
    runs = tmp_path / "runs"
    cache = stale_cache(tiny_base, runs, no_code)
    said = []
    base = resolve_base(load_setup(tiny.config(tmp_path / "run.yaml", runs_root=str(runs))), progress_bar=False,
                        say=said.append)
    path, record, cached = base.path, base.record, base.how != "pretrained"
    assert not cached and record["code"] == base_code()
    assert any(line.startswith(f"base model: cached {cache / 'base.ckpt'} was built by unknown code (its record has "
                               f"no code fingerprint") and f"moved to {runs / (cache.name + '.stale-unknown')}" in line
               for line in said), said
    assert (runs / f"{cache.name}.stale-unknown" / "base.ckpt").is_file()


def test_an_unfinished_pretraining_started_by_other_code_starts_over(tiny, tmp_path):
    setup = load_setup(tiny.config(tmp_path / "short.yaml", runs_root=str(tmp_path / "runs"),
                                   pretrain={"steps": 20, "checkpoint_every": 10, "eval_every": 10}))
    key = base_key(setup)
    out = base_dir(setup, key)
    record = {"key": key, "code": dict(base_code())}
    other_code(record)
    save_checkpoint(out / "last.ckpt", "pretrain", setup.model_config,
                    {"key": key, "model": {}, "optimizer": None, "step": 10, "record": record})
    said = []
    base = resolve_base(setup, progress_bar=False, say=said.append)
    built, cached = base.record, base.how != "pretrained"
    aside = out.with_name(f"{out.name}.stale-ffffffffffff")
    assert f"base model: the unfinished pretraining in {out} was started by other code ({FWPKM} differs): " \
           f"moved to {aside}, starting over (--reuse-stale-base would continue it)" in said, said
    assert not cached and built["steps"] == 20 and built["code"] == base_code()
    assert built["loss_curve"][0][0] == 1  # from the first step, not from the stale checkpoint's
    assert (aside / "last.ckpt").is_file()


@pytest.mark.parametrize("change, changed, words", [
    (other_code, [FWPKM], f"was built by other code ({FWPKM} differs); reused anyway (--reuse-stale-base)"),
    (no_code, "unknown", "was built by unknown code (its record has no code fingerprint"),
])
def test_reuse_stale_base_uses_it_and_run_json_says_so(tiny, tiny_base, tmp_path, capsys, change, changed, words):
    runs = tmp_path / "runs"
    cache = stale_cache(tiny_base, runs, change)
    before = (cache / "base.ckpt").read_bytes()
    path = tiny.config(tmp_path / "reuse.yaml", runs_root=str(runs), name="reuse", order=["code"])
    assert cli_main(["run", str(path), "--reuse-stale-base"]) == 0
    out = capsys.readouterr().out
    assert f"base model: cached {cache / 'base.ckpt'} {words}" in out, out
    assert (cache / "base.ckpt").read_bytes() == before  # reused as it was: nothing rebuilt or moved
    assert sorted(p.name for p in runs.iterdir() if p.name.startswith("pretrain-")) == [cache.name]
    meta = run_json(next(runs.glob("reuse-*")))
    assert meta["base"]["how"] == "cached" and meta["base"]["reused_stale"] is True
    assert meta["base"]["changed_modules"] == changed
    assert meta["timings"]["base_pretraining"] == "cached"


def test_a_given_base_built_by_other_code_is_refused_unless_reuse_is_asked(tiny, tiny_base, tmp_path):
    given = tmp_path / "elsewhere" / "base.ckpt"
    rewrite_record(tiny_base.path, given, other_code)
    runs = tmp_path / "runs"
    path = tiny.config(tmp_path / "given.yaml", runs_root=str(runs), base_checkpoint=str(given), order=["code"])
    with pytest.raises(CheckpointError) as info:
        execute(path, progress_bar=False, say=quiet)
    assert str(info.value) == (f"checkpoint {given} was built by other code ({FWPKM} differs), and it has no probe.json "
                               f"beside it to check; pass --reuse-stale-base "
                               f"to use it anyway, or leave base_checkpoint unset to pretrain a base with this code")
    assert not runs.exists()

    said = []
    folder, results, _ = execute(path, progress_bar=False, say=said.append, reuse_stale_base=True)
    assert f"base model: {given} (given by base_checkpoint; built by other code ({FWPKM} differs), used anyway " \
           f"(--reuse-stale-base))" in said, said
    meta = run_json(folder)
    assert (meta["base"]["how"], meta["base"]["reused_stale"], meta["base"]["changed_modules"]) == ("given", True, [FWPKM])
    assert meta["timings"]["base_pretraining"] == "given"
    assert results.matrix.is_complete and not list(runs.glob("pretrain-*"))


def test_a_given_base_from_other_code_that_computes_the_same_function_is_used(tiny, tiny_base, tmp_path):
    """A shipped base outlives the code that built it: other code that reproduces its probe (the
    same losses on fixed tokens, writes off and on) uses it, naming the files that differ; a probe
    that does not match is refused with the difference, and nothing is written."""
    from cl_platform.probe import PROBE_FILE, measure

    assert (tiny_base.path.parent / PROBE_FILE).is_file()  # every pretraining writes its probe
    recorded = json.loads((tiny_base.path.parent / PROBE_FILE).read_text())
    given = tmp_path / "shipped" / "base.ckpt"
    rewrite_record(tiny_base.path, given, other_code)
    shutil.copy(tiny_base.path.parent / PROBE_FILE, given.parent / PROBE_FILE)
    runs = tmp_path / "runs"
    path = tiny.config(tmp_path / "given.yaml", runs_root=str(runs), base_checkpoint=str(given), order=["code"])
    said = []
    folder, results, _ = execute(path, progress_bar=False, say=said.append)
    line = next(s for s in said if s.startswith(f"base model: {given}"))
    assert line.startswith(f"base model: {given} (given by base_checkpoint; {SAME_FUNCTION})"), line
    meta = run_json(folder)["base"]
    assert meta["reused_stale"] is False and meta["changed_modules"] == [FWPKM] and 0 <= meta["probe_difference"] <= 1e-4
    assert results.matrix.is_complete

    # The probe can fail: each of its three losses moved by 1e-3 is refused, before any work.
    for key in ("read", "write", "after_write"):
        (given.parent / PROBE_FILE).write_text(json.dumps({**recorded, key: recorded[key] + 1e-3}))
        other_runs = tmp_path / f"runs-{key}"
        with pytest.raises(CheckpointError, match=rf"its probe \({given.parent / PROBE_FILE}\) differs by 0\.001"):
            execute(tiny.config(tmp_path / f"{key}.yaml", runs_root=str(other_runs), base_checkpoint=str(given)),
                    progress_bar=False, say=quiet)
        assert not other_runs.exists()
    # The three losses differ from each other, so each one measures something of its own.
    data = load_checkpoint(tiny_base.path, "base")
    setup = load_setup(path)
    now = measure(data["model"], setup.model_config, setup.config.pretrain.fwpkm)
    assert now == recorded and len({now["read"], now["write"], now["after_write"]}) == 3


def test_the_probe_is_float64_and_an_older_float32_probe_is_measured_as_recorded(tiny, tiny_base, tmp_path):
    """Probes are measured in float64 (float32 writes round differently on different CPUs, by more
    than the tolerance: cl_platform.probe's docstring); a probe.json written by older code has no `dtype`
    and is compared in float32, the precision it was recorded in — and can still fail."""
    from cl_platform.probe import PROBE_FILE, TOLERANCE, measure, probe_difference

    recorded = json.loads((tiny_base.path.parent / PROBE_FILE).read_text())
    assert recorded["dtype"] == "float64"
    data = load_checkpoint(tiny_base.path, "base")
    setup = load_setup(tiny.config(tmp_path / "run.yaml", runs_root=str(tmp_path / "runs")))
    args = (data["model"], setup.model_config, setup.config.pretrain.fwpkm)
    single = measure(*args, dtype=torch.float32)
    assert single["dtype"] == "float32"
    # The two precisions compute one function: they agree within the tolerance.
    assert max(abs(single[k] - recorded[k]) for k in ("read", "write", "after_write")) < TOLERANCE
    folder = tmp_path / "older"
    folder.mkdir()
    legacy = {k: v for k, v in single.items() if k != "dtype"}
    (folder / PROBE_FILE).write_text(json.dumps(legacy))
    assert probe_difference(folder, *args) == 0.0  # measured in float32, as recorded: bit for bit
    (folder / PROBE_FILE).write_text(json.dumps({**legacy, "write": legacy["write"] + 1e-3}))
    assert abs(probe_difference(folder, *args) - 1e-3) < 1e-5
    (folder / PROBE_FILE).write_text(json.dumps({**legacy, "dtype": "float16"}))
    assert probe_difference(folder, *args) is None  # a precision the probe does not know: no verdict


def truncated(tiny_base, path):
    data = tiny_base.path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def foreign(tiny_base, path):
    torch.save({"weights": {"w": torch.zeros(2)}}, path)


def older_format(tiny_base, path):
    torch.save({"format": "cl-platform-checkpoint/0", "kind": "base", "model": {}}, path)


def renamed_weights(tiny_base, path):
    data = load_checkpoint(tiny_base.path, "base")
    model = {("old_name." + k if i == 0 else k): v for i, (k, v) in enumerate(data["model"].items())}
    save_checkpoint(path, "base", data["model_config"], {"key": data["key"], "model": model, "record": data["record"]})


def folder(tiny_base, path):
    path.mkdir()


@pytest.mark.parametrize("make, reason", [
    (None, "does not exist"),
    (folder, "is a folder, not a file"),
    (truncated, "cannot be read: corrupted, truncated"),
    (foreign, "is not a cl-platform checkpoint (format None"),
    (older_format, f"was saved by an incompatible version of cl-platform (format 'cl-platform-checkpoint/0'; "
                   f"this version reads '{FORMAT}')"),
    (renamed_weights, "holds weights this version of cl-platform cannot load into the model"),
], ids=["missing", "folder", "truncated", "foreign", "older-format", "renamed-weights"])
def test_a_bad_base_checkpoint_names_the_file_and_why_before_anything_runs(tiny, tiny_base, tmp_path, make, reason):
    bad = tmp_path / "bad.ckpt"
    if make is not None:
        make(tiny_base, bad)
    runs = tmp_path / "runs"
    path = tiny.config(tmp_path / "bad.yaml", runs_root=str(runs), base_checkpoint=str(bad))
    with pytest.raises(CheckpointError) as info:
        execute(path, progress_bar=False, say=quiet)
    assert str(info.value).startswith(f"checkpoint {bad} {reason}"), str(info.value)
    assert not runs.exists()


def test_the_cli_prints_the_bad_base_checkpoint_and_exits_2(tiny, tmp_path, capsys):
    missing = tmp_path / "nowhere.ckpt"
    path = tiny.config(tmp_path / "bad.yaml", runs_root=str(tmp_path / "runs"), base_checkpoint=str(missing))
    assert cli_main(["run", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"clp run: error: checkpoint {missing} does not exist, and 'nowhere.ckpt' is not a "
                          f"shipped base (reference-attn-s0, ") and err.count("\n") == 1


class Crash(L.Callback):
    """Stops the process's work with an exception after training step `step`, as a kill would."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if pl_module.position.step == self.step:
            raise KeyError(f"crash at step {self.step}")


def test_run_json_records_code_versions_machine_and_seconds_per_phase_summed_over_a_resume(tiny, tiny_base, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(tiny_base.path.parent, runs / tiny_base.path.parent.name)  # the cached base
    path = tiny.config(tmp_path / "audit.yaml", runs_root=str(runs), name="audit", cl={"checkpoint_every": 3})
    # 2 experiences of 6 steps: checkpoints at steps 3 and 6 and after each row; stopped at step 8.
    with pytest.raises(KeyError, match="crash at step 8"):
        execute(path, progress_bar=False, say=quiet, callbacks=[Crash(8)])
    folder = next(runs.glob("audit-*"))
    first = run_json(folder)
    assert [e["experience"] for e in first["timings"]["experiences"]] == [1]
    partial = load_checkpoint(folder / "checkpoints" / "last.ckpt", "run")["seconds"]
    assert set(partial) == {"row0_eval", "exp1_train", "exp1_eval"}  # the last checkpoint: after row 1

    _, results, _ = execute(path, resume=True, progress_bar=False, say=quiet)
    meta = run_json(folder)
    assert meta["identity"] == first["identity"] and results.matrix.is_complete
    assert meta["code"] == all_code() and meta["versions"] == package_versions(VERSIONS)
    assert {"cpu", "cores", "torch_threads", "os", "python"} <= set(meta["machine"])
    assert meta["base"]["how"] == "cached" and meta["base"]["reused_stale"] is False
    assert [r["code"] for r in meta["resumes"]] == [all_code()] and meta["resumes"][0]["machine"] == meta["machine"]

    timings = meta["timings"]
    assert timings["base_pretraining"] == "cached"
    assert [(e["experience"], e["domain"]) for e in timings["experiences"]] == [(1, "math"), (2, "code")]
    seconds = [timings["row0_eval"]] + [e[k] for e in timings["experiences"] for k in ("train", "eval")]
    assert all(isinstance(s, float) and s >= 0 for s in seconds)
    assert timings["total"] == pytest.approx(sum(seconds))
    # What was measured before the stop is kept, not measured again: the resume adds to it.
    assert timings["row0_eval"] == first["timings"]["row0_eval"] == partial["row0_eval"]
    assert timings["experiences"][0] == first["timings"]["experiences"][0]
    # results.json is as before: no timings in it.
    assert "timings" not in json.loads((folder / "results.json").read_text())


def test_a_shipped_base_of_the_same_key_is_used_where_it_lies_instead_of_pretraining(tiny, tiny_base, tmp_path):
    """experiments/bases/<name>/ holds bases under their key: a config that would pretrain one reads
    it (built by this code, or by other code whose probe reproduces); one whose probe no longer
    reproduces is named and passed over, and the base is pretrained as usual."""
    from cl_platform.probe import PROBE_FILE

    shipped = tmp_path / "bases"
    folder = shipped / "tiny-s0"
    folder.mkdir(parents=True)
    for name in ("base.ckpt", "pretrain.json", PROBE_FILE):
        shutil.copy(tiny_base.path.parent / name, folder / name)
    other = shipped / "tiny-other"  # another key: never read
    shutil.copytree(folder, other)
    (other / "pretrain.json").write_text(json.dumps({"key": "0" * 64}))
    runs = tmp_path / "runs"
    setup = load_setup(tiny.config(tmp_path / "run.yaml", runs_root=str(runs)))
    said = []
    base = resolve_base(setup, progress_bar=False, say=said.append, shipped=(shipped,))
    path, record, cached, weights = base.path, base.record, base.how != "pretrained", base.weights
    assert path == folder / "base.ckpt" and cached and record["key"] == base_key(setup)
    assert all(torch.equal(weights[k], v) for k, v in load_checkpoint(tiny_base.path, "base")["model"].items())
    assert any(line.startswith(f"base model: shipped {path}") for line in said)
    assert not list(runs.glob("pretrain-*"))  # nothing pretrained, nothing copied

    # Built by other code: still used while its probe reproduces ...
    rewrite_record(tiny_base.path, folder / "base.ckpt", other_code)
    said = []
    base = resolve_base(setup, progress_bar=False, say=said.append, shipped=(shipped,))
    path, record = base.path, base.record
    assert path == folder / "base.ckpt" and 0 <= base.probe_difference <= 1e-4
    assert said[-1].startswith(f"base model: shipped {path} (pretraining key {record['key'][:12]}; {SAME_FUNCTION}; "), said
    # ... and passed over, by name, once it does not: then the base is pretrained into the cache.
    probe = json.loads((folder / PROBE_FILE).read_text())
    (folder / PROBE_FILE).write_text(json.dumps({**probe, "read": probe["read"] + 1e-3}))
    said = []
    base = resolve_base(setup, progress_bar=False, say=said.append, shipped=(shipped,))
    path, cached = base.path, base.how != "pretrained"
    assert any("differs by 0.001 nats under this code: not used" in line for line in said)
    assert path == base_dir(setup, base_key(setup)) / "base.ckpt" and not cached
