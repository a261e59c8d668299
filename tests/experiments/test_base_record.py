"""A named base brings its settings: the `pretrain:` section, the tokenizer and the segment length
(experiments/base_record.py); a stream or config that contradicts it is refused before any work."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
import yaml

from cl_platform.check import ConfigError
from cl_platform.checkpoint import CheckpointError
from experiments.base_record import SHIPPED_BASES, read_base
from experiments.cli import main as cli_main
from experiments.setup import load_run_config, load_setup
from streams import load_stream_config

ROOT = Path(__file__).resolve().parents[2]
GENERAL = ROOT / "streams" / "assets" / "tokenizer_general.json"
DEFAULT = ROOT / "streams" / "assets" / "tokenizer.json"
EXAMPLES = ROOT / "experiments" / "configs" / "examples"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def stream_without(tiny, path: Path, *fields: str, **extra) -> Path:
    spec = {k: v for k, v in tiny.stream_spec.items() if k not in fields}
    return tiny.write_yaml(path, {**spec, "cache_dir": str(tiny.root / "cache"), **extra})


def test_a_pretrained_base_records_its_tokenizer_and_seq_len_and_keeps_a_copy(tiny_base):
    stream = tiny_base.record["stream"]
    assert stream == {"tokenizer": {"fingerprint": sha(DEFAULT), "vocab_size": 4096, "file": "tokenizer.json"},
                      "seq_len": 32}
    assert sha(tiny_base.path.parent / "tokenizer.json") == sha(DEFAULT)
    base = read_base(tiny_base.path.parent)  # a base folder names its base.ckpt
    assert (base.path, base.seq_len, base.tokenizer) == (tiny_base.path, 32, stream["tokenizer"])


def test_a_stream_read_with_a_base_takes_its_tokenizer_and_seq_len(tiny, tiny_base, tmp_path):
    bare = stream_without(tiny, tmp_path / "bare.yaml", "seq_len")
    assert load_stream_config(bare).seq_len is None and load_stream_config(bare).tokenizer is None
    path = tiny.config(tmp_path / "run.yaml", stream=str(bare), base_checkpoint=str(tiny_base.path))
    setup = load_setup(path)
    assert setup.scenario.config.seq_len == 32
    assert setup.scenario.tokenizer.fingerprint == sha(DEFAULT)
    assert tuple(setup.scenario[0].data.segments.tokens.shape[1:]) == (33,)  # seq_len + 1 for the shifted targets
    # Without a base the same stream has the defaults (512-token segments, the shipped tokenizer).
    assert load_setup(tiny.config(tmp_path / "nobase.yaml", stream=str(bare))).scenario.config.seq_len == 512


def test_a_stream_of_another_tokenizer_or_seq_len_is_refused_before_any_work(tiny, tiny_base, tmp_path, capsys):
    runs = tmp_path / "runs"
    other_tok = stream_without(tiny, tmp_path / "tok.yaml", tokenizer=str(GENERAL))
    path = tiny.config(tmp_path / "a.yaml", stream=str(other_tok), base_checkpoint=str(tiny_base.path),
                       runs_root=str(runs))
    assert cli_main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tokenizer_general.json" in err[0] and "tokenizer.json" in err[0]
    assert sha(GENERAL)[:12] in err[0] and sha(DEFAULT)[:12] in err[0]
    other_len = stream_without(tiny, tmp_path / "len.yaml", "seq_len", seq_len=64)
    path = tiny.config(tmp_path / "b.yaml", stream=str(other_len), base_checkpoint=str(tiny_base.path),
                       runs_root=str(runs))
    assert cli_main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'seq_len' is 64" in err[0] and "32-token segments" in err[0]
    assert not runs.exists()  # nothing written
    # The same tokenizer or length named explicitly is the base's: accepted.
    same = stream_without(tiny, tmp_path / "same.yaml", tokenizer=str(DEFAULT))
    assert load_setup(tiny.config(tmp_path / "c.yaml", stream=str(same),
                                  base_checkpoint=str(tiny_base.path))).scenario.config.seq_len == 32


def test_a_named_base_fills_the_pretrain_section_and_refuses_a_contradiction(tiny, tiny_base, tmp_path):
    spec = yaml.safe_load(tiny.config(tmp_path / "full.yaml", base_checkpoint=str(tiny_base.path)).read_text())
    del spec["pretrain"]  # nothing copied from the base
    path = tiny.write_yaml(tmp_path / "nopretrain.yaml", spec)
    cfg, base = load_run_config(path)
    recorded = tiny_base.record["config"]
    for name in ("steps", "batch_size", "lr", "warmup_steps", "eval_every", "seed"):
        assert getattr(cfg.pretrain, name) == recorded[name], name
    assert cfg.pretrain.fwpkm.chunk == recorded["fwpkm"]["chunk"] == 16
    assert cfg.cl.fwpkm.chunk == 16  # the continual write rule still starts from the pretraining one
    with pytest.raises(ConfigError, match=r"pretrain.lr is 0.003 in the base, 0.01 in this run") as info:
        load_run_config(path, ["pretrain.lr=0.01"])
    assert "pretrain.steps" not in str(info.value)  # only what differs is named
    # How progress was reported is the run's to change: no contradiction.
    assert load_run_config(path, ["pretrain.eval_every=7"])[0].pretrain.eval_every == 7


def test_a_shipped_base_is_named_by_its_folder_and_a_wrong_name_lists_them(tmp_path):
    cfg, base = load_run_config(ROOT / "experiments" / "configs" / "reference_main.yaml", ["pretrain.seed=1"])
    assert Path(cfg.base_checkpoint) == SHIPPED_BASES / "reference-s1" / "base.ckpt" == base.path
    assert (cfg.pretrain.seed, cfg.pretrain.steps, cfg.pretrain.precision) == (1, 1221, "bf16-mixed")
    assert base.seq_len == 2048 and base.tokenizer["fingerprint"] == sha(GENERAL)
    # The record beside the shipped base agrees with the checkpoint's own (its settings and key).
    data = torch.load(base.path, map_location="cpu", weights_only=True)
    assert data["record"]["config"]["steps"] == 1221 and data["record"]["key"] == data["key"]
    with pytest.raises(CheckpointError, match=r"reference-s9 does not exist, and 'reference-s9' is not a shipped base "
                                              r"\(.*reference-s0"):
        load_run_config(ROOT / "experiments" / "configs" / "reference_main.yaml", ["base_checkpoint=reference-s9"])


def test_the_own_domain_example_reads_the_main_jobs_web_split_with_the_bases_tokenizer():
    """The README's own-domain example on the reference base: the general tokenizer and 2,048-token
    segments come from the base, so its web evaluation is the main job's, token for token (and so
    is row 0's web loss, 4.783: frozen evaluation reads each domain from the same memory). Named
    with the default tokenizer, as the example once ran, it is refused."""
    example = load_setup(EXAMPLES / "own_domain_run.yaml")
    main = load_setup(ROOT / "experiments" / "configs" / "reference_main.yaml")
    assert example.scenario.tokenizer.fingerprint == main.scenario.tokenizer.fingerprint == sha(GENERAL)
    assert example.scenario.config.seq_len == 2048
    ours = example.scenario.domains["web"].splits["eval"].segments.tokens
    theirs = main.scenario.domains["web"].splits["eval"].segments.tokens
    assert torch.equal(torch.as_tensor(ours), torch.as_tensor(theirs))
    with pytest.raises(ConfigError, match=r"'tokenizer' is tokenizer.json .* trained with tokenizer_general.json"):
        load_setup(EXAMPLES / "own_domain_run.yaml", [f"stream={_with_tokenizer(DEFAULT)}"])


def _with_tokenizer(tokenizer: Path) -> Path:
    import tempfile

    spec = yaml.safe_load((EXAMPLES / "own_domain.yaml").read_text())
    for d in spec["domains"]:
        if "source" in d and not str(d["source"]).startswith("corpus:"):
            d["source"] = str((EXAMPLES / d["source"]).resolve())
    out = Path(tempfile.mkdtemp()) / "own_domain_default_tokenizer.yaml"
    out.write_text(yaml.safe_dump({**spec, "tokenizer": str(tokenizer)}))
    return out
