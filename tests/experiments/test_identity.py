"""Identities: the base key covers what determines the base's weights, the run hash what changes
the run's results, and a run folder's config.yaml re-runs to the same run."""
import dataclasses
import json

import yaml

from experiments.run import execute
from experiments.setup import base_key, load_run_config, load_setup, run_identity


def quiet(_):
    pass


def test_a_continual_write_rule_change_reuses_the_cached_base(tiny, tiny_base, tmp_path):
    said = []
    folder, results, runner = execute(tiny.config(tmp_path / "eta.yaml", order=["code"]),
                                      ["cl.fwpkm.lr_values=0.25", "cl.fwpkm.chunk=8"],
                                      progress_bar=False, say=said.append)
    assert base_key(load_setup(tiny.config(tmp_path / "k.yaml"), ["cl.fwpkm.lr_values=0.25"])) == \
        base_key(tiny_base.setup)
    assert any(line.startswith(f"base model: cached {tiny_base.path}") for line in said), said
    assert not any("pretraining" in line for line in said)
    # The phase really wrote with its own rule, on the base's architecture (window 16 ≠ chunk 8).
    layer = runner.module.model.fwpkm_layers()[0]
    assert (layer.rule.lr_values, layer.rule.chunk, runner.module.model.config.window) == (0.25, 8, 16)
    identity = json.loads((folder / "run.json").read_text())["identity"]
    assert identity["write_rules"]["fwpkm1"]["lr_values"] == 0.25
    assert identity["base"]["key"] == base_key(tiny_base.setup)
    assert results.matrix.is_complete


def test_the_base_key_ignores_domains_without_pretraining_tokens_and_the_listing_order(tiny, tiny_base, tmp_path):
    law = {"name": "law", "source": "corpus:law", "filters": {"max_documents": 20},
           "token_budget": {"pretrain": 0, "adapt": 384, "eval": 256}}
    spec = {**tiny.stream_spec, "cache_dir": str(tiny.root / "cache")}
    more = tiny.write_yaml(tmp_path / "more.yaml", {**spec, "domains": [*spec["domains"], law]})
    swapped = tiny.write_yaml(tmp_path / "swapped.yaml", {**spec, "domains": spec["domains"][::-1]})
    key = base_key(tiny_base.setup)
    assert base_key(load_setup(tiny.config(tmp_path / "a.yaml", stream=str(more)))) == key
    assert base_key(load_setup(tiny.config(tmp_path / "b.yaml", stream=str(swapped)))) == key
    # What does determine the weights changes it: the pretraining write rule, the architecture.
    assert base_key(load_setup(tiny.config(tmp_path / "c.yaml"), ["pretrain.fwpkm.lr_values=0.5"])) != key
    assert base_key(load_setup(tiny.config(tmp_path / "d.yaml"), ["model.window=8"])) != key
    assert base_key(load_setup(tiny.config(tmp_path / "e.yaml"), ["pretrain.precision=bf16-mixed"])) != key
    assert base_key(load_setup(tiny.config(tmp_path / "f.yaml"), ["cl.precision=bf16-mixed"])) == key


def test_the_run_hash_follows_what_changes_results_only(tiny, tiny_base, tmp_path):
    path = tiny.config(tmp_path / "h.yaml", order=["code"])
    base = {"source": "pretrain", "key": base_key(tiny_base.setup)}

    def identity(*overrides):
        return run_identity(load_setup(path, overrides), base)

    plain = identity()
    assert identity("cl.checkpoint_every=7", "cl.log_every=3", "name=other", "pretrain.eval_every=9") == plain
    # A per-layer rule equal to the phase's rule is the same run; a different one is not.
    assert identity("cl.fwpkm_by_layer.fwpkm1.chunk=16") == plain
    assert identity("cl.fwpkm_by_layer.fwpkm1.chunk=8") != plain
    assert identity("cl.fwpkm.lr_keys=0.5") != plain and identity("seed=1") != plain
    assert identity("cl.precision=bf16-mixed") != plain
    finetune = identity("cl.mode=finetune")
    assert identity("cl.mode=finetune", "cl.lr=0.001") != finetune  # read in finetune mode


def test_overrides_round_trip_through_the_run_folder(tiny, tiny_base, tmp_path):
    path = tiny.config(tmp_path / "trip.yaml", order=["code"])
    overrides = ["cl.fwpkm.lookahead=false", "order=[code,math]", "cl.fwpkm_by_layer.fwpkm1.lr_values=0.5",
                 "strategy.name=naive", "seed=3"]
    folder, results, runner = execute(path, overrides, progress_bar=False, say=quiet)
    assert runner is not None and results.matrix.experiences == ["code", "math"]
    saved = yaml.safe_load((folder / "config.yaml").read_text())
    assert saved["cl"]["fwpkm"]["lookahead"] is False and saved["seed"] == 3
    assert saved["cl"]["fwpkm_by_layer"]["fwpkm1"]["lr_values"] == 0.5
    said = []
    again, same, runner = execute(folder / "config.yaml", progress_bar=False, say=said.append)
    assert runner is None and again == folder and "already complete" in said[-1]
    assert same.config_hash == results.config_hash


def test_settings_are_chosen_on_a_dev_split_that_leaves_the_base_and_the_eval_split_alone(tiny, tiny_base, tmp_path):
    from cl_platform.check import ConfigError
    import pytest

    plain = tiny.config(tmp_path / "nodev.yaml", runs_root=str(tmp_path / "runs"), order=["code"])
    with pytest.raises(ConfigError, match=r"'cl.eval_split': 'dev' but domain\(s\) \['math', 'code'\] have none"):
        execute(plain, ["cl.eval_split=dev"], progress_bar=False, say=quiet)
    assert not (tmp_path / "runs").exists()

    spec = {**tiny.stream_spec, "cache_dir": str(tiny.root / "cache")}
    spec["token_budget"] = {**spec["token_budget"], "dev": 256}
    stream = tiny.write_yaml(tmp_path / "dev.yaml", spec)
    path = tiny.config(tmp_path / "withdev.yaml", stream=str(stream), order=["code"])
    setup = load_setup(path, ["cl.eval_split=dev"])
    assert base_key(setup) == base_key(tiny_base.setup)  # the dev split comes after pretrain
    for name, domain in setup.scenario.domains.items():
        dev = set(domain.document_ids("dev"))
        assert dev and not dev & set(domain.document_ids("eval")) and not dev & set(domain.document_ids("adapt"))
    said = []
    _, on_dev, _ = execute(path, ["cl.eval_split=dev"], progress_bar=False, say=said.append)
    _, on_eval, _ = execute(path, [], progress_bar=False, say=quiet)
    assert any("evaluated on the dev split" in line for line in said)
    assert on_dev.config_hash != on_eval.config_hash
    assert not (on_dev.matrix.values == on_eval.matrix.values).any()


def test_the_shipped_run_configs_load_and_the_default_pretrains_on_web_only():
    from pathlib import Path

    from cl_platform.config import load_config
    from streams.stream import load_stream_config

    from experiments.multi import compare
    from experiments.studies import longctx, niah, recall, repeat

    root = Path(__file__).resolve().parents[2] / "experiments" / "configs"
    # Every shipped YAML is a run config or one experiment's own config, and loads as one.
    # Every compare_*.yaml is a comparison's config (the compare CLI refuses anything else).
    others = {"recall": recall.load, "recall_scale": recall.load, "recall_keys": recall.load,
              "recall_keys_short": recall.load, "longctx": longctx.load, "niah": niah.load,
              "reference_family": longctx.load, "niah_reference": niah.load, "repeat_reference": repeat.load,
              "reference_v2_family": longctx.load, "niah_v2": niah.load}
    others |= {p.stem: compare.load for p in root.glob("compare_*.yaml")}
    assert {"compare_strategies", "compare_strategies_dev", "compare_consolidation", "compare_consolidation_dev"} <= set(others)
    for stem, loader in others.items():
        loader(root / f"{stem}.yaml")
    # A config that names a base takes its `pretrain:` section from the base's record.
    configs = {p.stem: load_run_config(p)[0] for p in sorted(root.glob("*.yaml")) if p.stem not in others}
    assert set(configs) == {"default", "indomain", "longctx_base", "reference", "reference_main", "reference_pkm_main",
                            "reference_v2"}
    # The reference base reads every pretraining token once, and streams only domains it never saw.
    ref = configs["reference"]
    ref_stream = load_stream_config(ref.stream)
    pretrained = {d.name: ref_stream.budget(d.name).pretrain for d in ref_stream.domains if ref_stream.budget(d.name).pretrain}
    assert ref.pretrain.steps * ref.pretrain.batch_size * ref_stream.seq_len == sum(pretrained.values())
    assert set(pretrained) == {"books", "wiki"} and not set(pretrained) & set(ref_stream.experience_domains)
    # The retrieval-knob stream is the reference stream with episodes in its pretraining splits only.
    # So is its eight-times dose (every segment, 8 facts against a quarter of them, 4 facts).
    knob = load_stream_config(ref.stream.replace("reference.yaml", "reference_retrieval.yaml"))
    knob8 = load_stream_config(ref.stream.replace("reference.yaml", "reference_retrieval_x8.yaml"))
    named = load_stream_config(ref.stream.replace("reference.yaml", "reference_retrieval_named.yaml"))
    name_last = load_stream_config(ref.stream.replace("reference.yaml", "reference_retrieval_name_last.yaml"))
    secret = load_stream_config(ref.stream.replace("reference.yaml", "reference_retrieval_secret.yaml"))
    secret12 = load_stream_config(ref.stream.replace("reference.yaml", "reference_retrieval_secret12.yaml"))
    for k in (knob, knob8, named, name_last, secret, secret12):
        assert k.retrieval.active and k.retrieval.min_distance > 4 * 127  # beyond the stacked windows
        assert dataclasses.replace(k, retrieval=ref_stream.retrieval) == ref_stream
    dose = lambda r: r.fraction * r.facts  # noqa: E731
    assert dose(knob8.retrieval) == 8 * dose(knob.retrieval) and knob8.retrieval.min_distance == knob.retrieval.min_distance
    # The one-attribute knob differs from the knob in that field only: the same dose and distance.
    assert knob.retrieval.attributes == 0 and dataclasses.replace(named.retrieval, attributes=0) == knob.retrieval
    # ... and the name-last knob from the one-attribute knob in the sentence's form only.
    assert dataclasses.replace(name_last.retrieval, form="name_first") == named.retrieval != name_last.retrieval
    # ... and the secret knob from the knob in the sentence only: the same dose and distance.
    assert dataclasses.replace(secret.retrieval, form="name_first") == knob.retrieval != secret.retrieval
    # ... and its 12-fact version from it in the facts an episode only.
    assert dataclasses.replace(secret12.retrieval, facts=4) == secret.retrieval and secret12.retrieval.facts == 12
    # The main job on the shipped base (reference_main) is the reference run without pretraining
    # domains: the base's own settings, the same continual phase, the same domains and adapt budgets.
    main = configs["reference_main"]
    main_stream = load_stream_config(main.stream)
    assert main.base_checkpoint is not None and ref.base_checkpoint is None
    assert (main.model, main.pretrain, main.cl, main.strategy) == (ref.model, ref.pretrain, ref.cl, ref.strategy)
    assert main_stream.experience_domains == ref_stream.experience_domains
    assert (main_stream.seq_len, main_stream.tokenizer) == (ref_stream.seq_len, ref_stream.tokenizer)
    assert {d.name for d in main_stream.domains} == set(ref_stream.experience_domains)
    assert all(main_stream.budget(d).adapt == ref_stream.budget(d).adapt for d in ref_stream.experience_domains)
    # The FwPKM + PKM main job is the main job with a static PKM at layer 2, on its own shipped base.
    pkm_main = configs["reference_pkm_main"]
    assert pkm_main.model == dataclasses.replace(main.model, pkm_layers=[2])
    assert (pkm_main.stream, pkm_main.pretrain, pkm_main.cl, pkm_main.strategy) == (main.stream, main.pretrain, main.cl, main.strategy)
    assert "reference-pkm-s" in str(pkm_main.base_checkpoint)
    # v2 is the reference recipe with the short conv, the keyed mix and float32, nothing else.
    v2 = configs["reference_v2"]
    keyed = load_stream_config(v2.stream)
    assert v2.model == dataclasses.replace(ref.model, conv_kernel=4)
    assert v2.pretrain == dataclasses.replace(ref.pretrain, precision="32-true")
    assert (v2.cl, v2.strategy, v2.seed) == (ref.cl, ref.strategy, ref.seed)
    assert keyed.retrieval.form == "keyed" and dataclasses.replace(keyed, retrieval=ref_stream.retrieval) == ref_stream
    # The held-out stream is the main stream plus books and wiki, evaluated only, each eval
    # document cut as the reference stream cuts it (so its eval documents are the head of the
    # reference eval split: tests/streams/test_stream_splits.py) and none pretrained on.
    held = load_stream_config(main.stream.replace("reference_main.yaml", "reference_main_heldout.yaml"))
    assert held.experience_domains == main_stream.experience_domains and held.seed == ref_stream.seed
    assert {d.name for d in held.domains} == {d.name for d in main_stream.domains} | {"books", "wiki"}
    for name in ("books", "wiki"):
        h, r = held.budget(name), ref_stream.budget(name)
        assert h.pretrain == 0 and h.eval < r.eval and h.eval // h.eval_docs == r.eval // r.eval_docs
        assert [d.source for d in held.domains if d.name == name] == [d.source for d in ref_stream.domains if d.name == name]
    # Its attention-only twin has the FwPKM model's active parameters, within 0.5 %.
    from cl_platform.model import FwPKMLM, count_parameters
    from experiments.studies.family import load_family

    from streams.tokenizer import load_tokenizer

    family = load_family(root / "reference_family.yaml")  # the configs only: the corpus need not be built
    vocab = load_tokenizer(ref_stream.tokenizer).vocab_size
    active = {v: count_parameters(FwPKMLM(dataclasses.replace(load_config(family.base, family.overrides(v, 0)).model,
                                                               vocab_size=vocab)))["active"]
              for v in family.variants}
    assert abs(active["attention"] / active["fwpkm"] - 1) < 0.005, active
    assert configs["longctx_base"].pretrain.batch_size * 2048 == 8 * 512  # the main job's tokens per step
    default = configs["default"]
    assert (default.pretrain.precision, default.cl.precision) == ("bf16-mixed", "bf16-mixed")
    stream = load_stream_config(default.stream)  # resolved against the config file's folder
    assert [d for d in stream.experience_domains if stream.budget(d).pretrain] == ["web"]
