"""The shipped reference base (experiments/bases/reference-s0) is what the main job on it reads:
this code still computes the base's function (its probe.json reproduces), its record says how it
was built, and the run config that names it loads it without pretraining. When a change to the
model, the memory or the write rule breaks the probe, this test fails first: rebuild the base
(`clp pretrain experiments/configs/reference.yaml`) and ship the new one."""
import dataclasses
import json
from pathlib import Path

import pytest

from cl_platform.checkpoint import load_checkpoint, model_config_dict
from cl_platform.config import load_config
from experiments.base_probe import PROBE_FILE, TOLERANCE, probe_difference

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "experiments" / "bases" / "reference-s0"
CONFIG = ROOT / "experiments" / "configs" / "reference_main.yaml"


@pytest.fixture(scope="module")
def shipped():
    return load_checkpoint(BASE / "base.ckpt", "base")


def test_the_main_job_config_names_the_shipped_base_and_its_write_rule(shipped):
    cfg = load_config(CONFIG)
    assert Path(cfg.base_checkpoint) == BASE / "base.ckpt"
    record = json.loads((BASE / "pretrain.json").read_text())
    assert record["key"] == shipped["key"] and record["steps"] == cfg.pretrain.steps == 1221
    assert record["tokens"] == 1221 * 8 * 2048
    # The base was trained with the write rule the config gives the probe.
    assert record["write_rule"]["lr_values"] == cfg.pretrain.fwpkm.lr_values
    assert record["write_rule"]["chunk"] == cfg.pretrain.fwpkm.chunk
    # Well past unigram on every domain, new ones included (the weak base was one nat better).
    assert all(record["final_eval"][d] < record["unigram"][d] - 1.5 for d in record["unigram"])


def test_this_code_reproduces_the_shipped_bases_probe(shipped):
    cfg = load_config(CONFIG)
    recorded = json.loads((BASE / PROBE_FILE).read_text())
    model_config = dataclasses.replace(cfg.model, vocab_size=shipped["model_config"]["vocab_size"])
    assert model_config_dict(model_config) == shipped["model_config"]  # the config's architecture is the base's
    diff = probe_difference(BASE, shipped["model"], model_config, cfg.pretrain.fwpkm)
    assert diff is not None and diff <= TOLERANCE, diff
    # Writes change what the model predicts: the probe exercises the memory, not only attention.
    assert abs(recorded["after_write"] - recorded["read"]) > 100 * TOLERANCE
