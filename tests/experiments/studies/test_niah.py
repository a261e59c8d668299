"""`clp niah`: n-iter reading is n reads and n − 1 whole-context writes (counted on every FwPKM
layer), episodes do not see each other's writes, bad configs are named before any work, and the
whole experiment runs on the tiny family (fine-tune, score, reuse)."""
import contextlib
import dataclasses
import json

import numpy as np
import pytest
import torch
import yaml

from cl_platform.check import ConfigError
from analysis.memory_inspect import addresses, shared_weight
from experiments.studies.needle_reading import finetune, read_in_pass, read_iteratively
from experiments.studies.niah import FINETUNE_MEMORY, Needles, load
from streams.needles import Episode
from streams.needles import NeedleConfig, make_episode


def run(exp, say=print):
    return Needles(exp).run(say)


@pytest.fixture
def model_and_episodes(tiny_base):
    from experiments.setup import build_model

    setup = tiny_base.setup
    weights = torch.load(tiny_base.path, weights_only=True)["model"]
    model = build_model(setup.model_config, 0, setup.config.pretrain.fwpkm)
    model.load_state_dict(weights)
    model.eval()
    split = setup.scenario.domains["math"].splits["eval"]
    source = split.segments.tokens[:, :-1][split.segments.doc_index[:, :-1] >= 0].numpy()
    cfg = NeedleConfig(haystack_tokens=120, needles=2, depths=(0.1, 0.3))
    rng = np.random.default_rng(0)
    episodes = [make_episode(cfg, setup.scenario.tokenizer, source, rng) for _ in range(3)]
    return model, episodes, setup.config.pretrain.fwpkm


def test_n_iter_is_n_reads_and_n_minus_1_whole_context_writes(model_and_episodes):
    model, episodes, rule = model_and_episodes
    memory = model.snapshot_memory()
    ep = episodes[0]
    logits = {}
    for n in (1, 2, 3):
        captured: list[torch.Tensor] = []
        handle = model.lm_head.register_forward_hook(lambda m, i, o, out=captured: out.append(o.detach().clone()))
        read_iteratively(model, ep, n, rule, memory, contextlib.nullcontext())
        handle.remove()
        logits[n] = captured[-1]
        for layer in model.fwpkm_layers():
            assert (layer.calls, layer.writes) == (n, n - 1)
            assert layer.rule.chunk == len(ep.haystack)  # each extra read writes once over the whole context
        assert len(captured) == n  # n forward passes in all
    # the writes change what the final read sees; one read writes nothing
    assert not torch.equal(logits[1], logits[2]) and not torch.equal(logits[2], logits[3])
    # The final read is one batch, a row per needle's number: the asked row is the plain read of
    # haystack + question + answer (the padding after a shorter row changes none of its positions).
    model.restore_memory(memory)
    model.set_writes(False)
    with torch.no_grad():
        for j, number in enumerate(ep.candidates):
            plain = model(torch.tensor(ep.haystack + ep.question + number[:-1])[None])
            torch.testing.assert_close(logits[1][j:j + 1, :plain.shape[1]], plain, rtol=1e-5, atol=1e-5)
    assert ep.candidates[ep.asked] == ep.answer and len(logits[1]) == len(ep.candidates) == 2


def test_candidate_rank_counts_the_needles_the_model_finds_likelier():
    from types import SimpleNamespace

    from experiments.studies.needle_reading import _rank

    # 3 needles, numbers of 2 tokens; the question ends at position 4 (haystack 3 + question 2)
    ep = SimpleNamespace(haystack=[0, 0, 0], question=[0, 0], candidates=[[5, 6], [7, 8], [5, 9]], asked=0)
    logits = torch.zeros(3, 6, 10)
    for j, (a, b) in enumerate(ep.candidates):  # row j scores its own number at positions 4, 5
        logits[j, 4, a] = 3.0 - j
        logits[j, 5, b] = 3.0 - j
    assert _rank(logits, ep) == 1
    logits[1, 4, 7] = logits[1, 5, 8] = 8.0  # needle 1's number becomes likelier than the asked one's
    assert _rank(logits, ep) == 2
    logits[2, 4, 5] = logits[2, 5, 9] = 9.0
    assert _rank(logits, ep) == 3 and _rank(logits, SimpleNamespace(**{**vars(ep), "asked": 2})) == 1


def test_answer_hits_are_the_teacher_forced_top1_of_each_answer_token():
    from types import SimpleNamespace

    from experiments.studies.needle_reading import _answer_hits
    from experiments.studies.niah import token_accuracy

    # Inputs end with the answer but its last token: the last 3 positions predict its 3 tokens.
    ep = SimpleNamespace(answer=[5, 6, 7])
    logits = torch.zeros(1, 6, 10)
    logits[0, 2, 9] = 1.0  # the position before the answer's predictions: not read
    for i, tok in enumerate([5, 6, 7]):
        logits[0, 3 + i, tok] = 1.0
    assert _answer_hits(logits, ep) == [True, True, True]
    logits[0, 4, 8] = 2.0  # the second token's prediction is wrong
    assert _answer_hits(logits, ep) == [True, False, True]
    # Rates by position over episodes of different answer lengths.
    assert token_accuracy([[1, 0, 1], [1, 1], [0, 1, 1, 1]]) == pytest.approx([2 / 3, 2 / 3, 1.0, 1.0])


def test_hits_split_by_whether_the_asked_attribute_is_shared():
    from experiments.studies.niah import by_flag

    hits = [[1, 0, 1, 1], [0, 0, 1, 0]]  # two runs (seeds) of 4 episodes
    flags = [True, False, True, False]
    assert by_flag(hits, flags, True) == {"mean": 3 / 4, "episodes": 2}
    assert by_flag(hits, flags, False) == {"mean": 1 / 4, "episodes": 2}
    assert by_flag(hits, [True] * 4, False) == {"mean": None, "episodes": 0}


def test_the_name_guess_is_a_random_pick_among_the_values_of_the_asked_attribute():
    from experiments.studies.niah import name_guess

    # needles with the asked attribute per episode; unique ones (1) are left out
    assert name_guess([1, 2, 3, 2]) == pytest.approx((1 / 2 + 1 / 3 + 1 / 2) / 3)
    assert name_guess([5] * 7) == pytest.approx(0.2)  # secret needles: all share one, the candidates' chance
    assert name_guess([1, 1]) is None


def test_the_positive_controls_reach_is_full_attention_on_the_same_weights(tiny_base, model_and_episodes):
    """`model: {window: N}` (N >= the episode) is causal attention over everything, on the base's own
    weights: the same function as `mixer: full` with no windowed training, not the base's window."""
    from experiments.setup import build_model
    from experiments.studies.niah import reach_config

    base, episodes, rule = model_and_episodes
    setup = tiny_base.setup
    ep = episodes[0]
    ids = torch.tensor(ep.haystack + ep.question + ep.answer[:-1])[None]
    assert ids.shape[1] > setup.model_config.window  # needles beyond the base's window

    def logits(spec):
        m = build_model(reach_config(setup.model_config, spec), 0, rule)
        m.load_state_dict(base.state_dict())
        m.eval()
        m.set_writes(False)
        with torch.no_grad():
            return m(ids)

    wide = logits({"model": {"window": 4096}})
    assert wide.shape == logits({}).shape and not torch.allclose(wide, logits({}), atol=1e-3)
    torch.testing.assert_close(wide, logits({"model": {"mixer": "full", "pswa_prob": 0.0}}), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits({"model": {"window": setup.model_config.window}}), logits({}), rtol=0, atol=0)


def test_episodes_start_from_the_same_memory(model_and_episodes):
    model, episodes, rule = model_and_episodes
    memory = model.snapshot_memory()
    null = contextlib.nullcontext()
    alone = [read_iteratively(model, episodes[2], 3, rule, memory, null), read_in_pass(model, episodes[2], rule, memory, null)]
    for ep in episodes[:2]:
        read_iteratively(model, ep, 3, rule, memory, null)
        read_in_pass(model, ep, rule, memory, null)
    after = [read_iteratively(model, episodes[2], 3, rule, memory, null), read_in_pass(model, episodes[2], rule, memory, null)]
    assert after == alone
    values = model.fwpkm_layers()[0].values
    read_in_pass(model, episodes[2], rule, memory, null)
    assert not torch.equal(values, memory[0].values)  # in-pass reading writes ...
    read_iteratively(model, episodes[2], 1, rule, memory, null)
    assert torch.equal(values, memory[0].values)  # ... a 1-iter read does not


def test_finetune_gives_every_episode_the_base_memory(tiny, tiny_base, tmp_path, model_and_episodes):
    # Every FwPKM layer, whenever it reads during the fine-tune, reads one episode and holds the
    # memory the base came with (the one evaluation starts from); afterwards the model holds that
    # memory again. A fine-tune that read its batch in one forward, or let episodes read each
    # other's writes, fails here.
    model, _, rule = model_and_episodes
    exp = load(family_files(tiny, tmp_path))
    setup = tiny_base.setup
    split = setup.scenario.domains["math"].splits["pretrain"]
    source = split.segments.tokens[:, :-1][split.segments.doc_index[:, :-1] >= 0].numpy()
    layers = model.fwpkm_layers()
    base = model.snapshot_memory()
    seen = []
    for layer, then in zip(layers, base):
        layer.register_forward_pre_hook(lambda layer, args, then=then: seen.append(
            (args[0].shape[0], all(torch.equal(a, b) for a, b in zip(layer.snapshot(), then)))))
    finetune(model, exp, rule, source, setup.scenario.tokenizer, seed=0, precision="32-true")
    assert len(seen) == len(layers) * exp.finetune_steps * exp.finetune_batch_size
    assert all(rows == 1 and same for rows, same in seen)
    for layer, then in zip(layers, base):
        assert all(torch.equal(a, b) for a, b in zip(layer.snapshot(), then))
        assert layer.writes > 0  # the episodes did write (and were undone)


def test_writes_names_the_layers_that_write_and_the_others_only_read(model_and_episodes):
    model, episodes, rule = model_and_episodes
    memory = model.snapshot_memory()
    ep = episodes[1]
    every = [int(layer.name.removeprefix("fwpkm")) for layer in model.fwpkm_layers()]

    def final_logits(n, writes=None, reader=read_iteratively):
        captured: list[torch.Tensor] = []
        handle = model.lm_head.register_forward_hook(lambda m, i, o: captured.append(o.detach().clone()))
        reader(model, ep, *((n,) if reader is read_iteratively else ()), rule, memory, contextlib.nullcontext(), writes)
        handle.remove()
        return captured[-1]

    # naming every layer is the default, bit for bit
    assert torch.equal(final_logits(2), final_logits(2, every))
    # naming none: the extra read writes nothing, so 2-iter reads as 1-iter does
    two_none = final_logits(2, [])
    assert all(layer.writes == 0 and layer.calls == 2 for layer in model.fwpkm_layers())
    assert torch.equal(two_none, final_logits(1)) and not torch.equal(two_none, final_logits(2))
    # in one pass, naming none is reading with writes off
    model.restore_memory(memory)
    model.set_writes(False)
    with torch.no_grad():
        off = model(torch.tensor(ep.haystack + ep.question + ep.answer[:-1])[None])
    assert torch.equal(final_logits(None, [], read_in_pass), off)
    assert not torch.equal(final_logits(None, None, read_in_pass), off)
    # one layer named: it writes, the others do not
    final_logits(3, every[:1])
    assert [layer.writes for layer in model.fwpkm_layers()] == [2] + [0] * (len(every) - 1)


def family_files(tiny, tmp_path, **niah):
    tiny.config(tmp_path / "base.yaml")
    (tmp_path / "family.yaml").write_text(yaml.safe_dump({
        "base": "base.yaml", "variants": {"attention": {"fwpkm_layers": []}, "fwpkm": {}},
        "buckets": [0, 16, 32]}), encoding="utf-8")
    data = {"family": "family.yaml", "haystack_domain": "math",
            "models": {"attention": {"variant": "attention", "finetune": True},
                       "fwpkm-zero-shot": {"variant": "fwpkm"}},
            "needles": {"haystack_tokens": 100, "needles": 2, "depths": [0.1, 0.4]},
            "iterations": [1, 2], "episodes": 6, "finetune_steps": 3, "finetune_batch_size": 2, **niah}
    path = tmp_path / "niah.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.mark.parametrize("fields, message", [
    ({"needles": {"haystack_tokens": 100, "needles": 1, "depths": [1.2]}}, "depth 1.2 is outside"),
    ({"needles": {"haystack_tokens": 30, "needles": 2, "depths": [0.1, 0.2]}}, "shorter than its 2 needles"),
    ({"models": {"x": {"variant": "fwpkm", "finetune": "yes"}}}, "finetune must be true or false"),
    ({"models": {"x": {"variant": "fwpkm", "rule": {"chunkz": 3}}}}, "models.x.rule"),
    ({"models": {"x": {"varient": "fwpkm"}}}, "needs 'variant'"),
    ({"iterations": [0, 1]}, "iterations"),
    ({"models": {"x": {"variant": "fwpkm", "model": {"d_model": 8}}}}, "may change only .*'window'"),
    ({"models": {"x": {"variant": "fwpkm", "writes": 1}}}, "writes must be a list of distinct"),
    ({"models": {"x": {"variant": "fwpkm", "writes": [1], "finetune": True}}}, "writes applies to zero-shot"),
    ({"split": "test"}, "split='test': must be 'dev' or 'eval'"),
    ({"models": {"x": {"variant": "fwpkm", "patch": "yes"}}}, "patch must be true or false"),
    ({"memory": "forever"}, "memory='forever': must be 'reset' or 'persist'"),
])
def test_bad_configs_are_named(tiny, tmp_path, fields, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        load(family_files(tiny, tmp_path, **fields))


@pytest.mark.parametrize("fields, message", [
    ({"models": {"x": {"variant": "mamba"}}}, "models.x.variant.*'mamba' is not a variant"),
    ({"haystack_domain": "poetry"}, "haystack_domain.*'poetry' is not a domain"),
    ({"models": {"x": {"variant": "fwpkm", "model": {"mixer": "mamba"}}}}, "models.x.model.*mixer"),
    ({"models": {"x": {"variant": "fwpkm", "writes": [99]}}}, "models.x.writes.*99.*not all FwPKM layers"),
])
def test_unknown_names_are_named_before_any_work(tiny, tmp_path, fields, message):
    with pytest.raises(ConfigError, match=message):
        run(load(family_files(tiny, tmp_path, runs_root=str(tmp_path / "runs"), **fields)))
    assert not list((tmp_path / "runs").glob("niah-*/*.json"))


def test_niah_run_on_the_tiny_family(tiny, tmp_path):
    said = []
    folder, _ = run(load(family_files(tiny, tmp_path, runs_root=str(tiny.runs))), say=said.append)
    assert any("fine-tuning 3 steps" in s for s in said)
    saved = json.loads((folder / "results.json").read_text())
    for name in ("attention", "fwpkm-zero-shot"):
        per = json.loads((folder / f"{name}-seed0.json").read_text())
        for setting in ("1-iter", "2-iter", "in-pass"):
            hits = per["hits"][setting]
            assert len(hits) == 6 and saved["models"][name][setting]["mean"] == pytest.approx(sum(hits) / 6)
            low, high = saved["models"][name][setting]["wilson"]
            assert 0 <= low <= sum(hits) / 6 <= high <= 1
            # Exact match is every answer token right; the rates by position are over the episodes.
            tokens = per["token_hits"][setting]
            assert [int(all(t)) for t in tokens] == hits and all(len(t) >= 1 for t in tokens)
            rates = saved["models"][name]["token_accuracy"][setting]
            assert rates[0] == pytest.approx(sum(t[0] for t in tokens) / 6) and rates[0] >= sum(hits) / 6  # all have a 1st
            # Every secret needle has the same attribute: no episode with a unique one.
            split = saved["models"][name]["by_attribute"][setting]
            assert split["unique"] == {"mean": None, "episodes": 0}
            assert split["shared"] == {"mean": pytest.approx(sum(hits) / 6), "episodes": 6}
            assert saved["models"][name]["name_guess"] == pytest.approx(1 / 2)  # 2 needles, one attribute
        for setting in ("1-iter", "2-iter"):  # candidate match: rank 1 of the 2 needles' numbers
            ranks = per["ranks"][setting]
            assert len(ranks) == 6 and set(ranks) <= {1, 2}
            assert saved["models"][name]["candidate_match"][setting]["mean"] == pytest.approx(ranks.count(1) / 6)
    # Addresses: the in-pass lookups of every FwPKM layer, averaged over the episodes; none without one.
    per = json.loads((folder / "fwpkm-zero-shot-seed0.json").read_text())
    layers = saved["models"]["fwpkm-zero-shot"]["address"]
    assert set(layers) == set(per["address"]) and len(layers) >= 1
    for layer, value in layers.items():
        for key in ("asked", "others", "match", "between"):
            assert len(per["address"][layer][key]) == 6
            assert value[key] == pytest.approx(sum(per["address"][layer][key]) / 6)
    assert "address" not in saved["models"]["attention"] and not json.loads(
        (folder / "attention-seed0.json").read_text())["address"]
    # exact match split by whether the address matched: the episodes' hits where match is 1 / 0
    hits = per["hits"]["in-pass"]
    for layer, split in saved["models"]["fwpkm-zero-shot"]["exact_by_address"].items():
        for kind, value in (("matched", 1.0), ("missed", 0.0)):
            chosen = [h for h, m in zip(hits, per["address"][layer]["match"]) if m == value]
            assert split[kind] == (pytest.approx(sum(chosen) / len(chosen)) if chosen else None)
        assert split["matched"] is not None or split["missed"] is not None
    # secret needles share their attribute: every episode's match is on the "shared" side
    split = saved["models"]["fwpkm-zero-shot"]["address_match_by_attribute"]
    assert all(v["unique"] is None and v["shared"] == pytest.approx(layers[k]["match"]) for k, v in split.items())
    table = (folder / "table.txt").read_text()
    assert "addresses, in-pass" in table and "(unique n/a / shared" in table and "where matched /" in table and f"{next(iter(layers))} " in table
    again = []
    run(load(family_files(tiny, tmp_path, runs_root=str(tiny.runs))), say=again.append)
    assert not any("scoring" in s for s in again)
    # A fine-tuned result made with another episode memory (before it was recorded) is made again;
    # the zero-shot one is not.
    stale = json.loads((folder / "attention-seed0.json").read_text())
    assert stale["finetune_memory"] == FINETUNE_MEMORY
    del stale["finetune_memory"]
    (folder / "attention-seed0.json").write_text(json.dumps(stale))
    third = []
    run(load(family_files(tiny, tmp_path, runs_root=str(tiny.runs))), say=third.append)
    assert [s.split(":")[0] for s in third if "scoring" in s] == ["attention, seed 0"]
    # A variant added to the family moves no result; a variant defined anew (the same base here)
    # is scored again, the others not.
    path = family_files(tiny, tmp_path, runs_root=str(tiny.runs))
    fam = yaml.safe_load((tmp_path / "family.yaml").read_text())
    fam["variants"]["wide"] = {"mlp_ratio": 8.0}
    (tmp_path / "family.yaml").write_text(yaml.safe_dump(fam), encoding="utf-8")
    fourth = []
    assert run(load(path), say=fourth.append)[0] == folder and not any("scoring" in s for s in fourth)
    fam["variants"]["fwpkm"] = {"fwpkm_layers": [1]}  # what it was by default
    (tmp_path / "family.yaml").write_text(yaml.safe_dump(fam), encoding="utf-8")
    fifth = []
    assert run(load(path), say=fifth.append)[0] == folder
    assert [s.split(":")[0] for s in fifth if "scoring" in s] == ["fwpkm-zero-shot, seed 0"]
    # Paired against a reference model: the same episodes, nothing scored again, the folder unmoved.
    sixth = []
    folder2, summary = run(load(path, overrides=["reference=attention"]), say=sixth.append)
    assert folder2 == folder and not any("scoring" in s for s in sixth)
    ref = json.loads((folder / "attention-seed0.json").read_text())["hits"]
    other = json.loads((folder / "fwpkm-zero-shot-seed0.json").read_text())["hits"]
    for setting in ("1-iter", "2-iter", "in-pass"):
        paired = summary["models"]["fwpkm-zero-shot"]["paired"][setting]
        assert paired["value"] == pytest.approx((sum(other[setting]) - sum(ref[setting])) / 6)
        assert paired["low"] <= paired["value"] <= paired["high"]
    assert "paired" not in summary["models"]["attention"]
    assert any("paired against attention" in s for s in sixth)


def test_model_subset(tiny, tmp_path):
    path = family_files(tiny, tmp_path)
    assert list(load(path, models=["attention"]).models) == ["attention"]
    with pytest.raises(ConfigError, match="--models \\['mamba'\\] not among"):
        load(path, models=["mamba"])
    with pytest.raises(ConfigError, match="reference='fwpkm-zero-shot': .* not among the models"):
        load(path, models=["attention"], overrides=["reference=fwpkm-zero-shot"])


def test_the_needle_form_keys_the_folder_only_when_it_is_not_the_default(tiny, tmp_path):
    from experiments.studies.niah import needle_family, study_identity

    path = family_files(tiny, tmp_path)
    key = lambda *o: study_identity(e := load(path, overrides=list(o)), needle_family(e))  # noqa: E731
    word = key("needles.style=word")
    assert key("needles.style=word", "needles.form=name_first") == word  # folders made before the field stay found
    assert key("needles.style=word", "needles.form=name_last") != word
    plain = key()
    assert key("split=eval", "memory=reset") == plain  # so do the later fields at their defaults
    assert len({str(plain), *(str(key(o)) for o in ("split=dev", "memory=persist", "needles.id_alphabet=hex"))}) == 4
    with pytest.raises((ConfigError, ValueError), match="needles.form applies to styles"):
        load(path, overrides=["needles.form=name_last"])  # the secret needle


def test_paired_episodes_averages_each_sides_runs_and_resamples_the_episodes():
    from analysis.intervals import paired_bootstrap

    assert paired_bootstrap([[1, 0, 1, 0]], [[1, 1, 1, 0]])["value"] == pytest.approx(0.25)
    # Two runs of the other model: per episode 1, .5, 0, 0 against 0 -> 0.375.
    assert paired_bootstrap([[0, 0, 0, 0]], [[1, 1, 0, 0], [1, 0, 0, 0]])["value"] == pytest.approx(0.375)
    same = paired_bootstrap([[1, 0, 1, 1]], [[1, 0, 1, 1]])
    assert same == {"value": 0.0, "low": 0.0, "high": 0.0}
    assert paired_bootstrap([[0] * 5], [[1] * 5]) == {"value": 1.0, "low": 1.0, "high": 1.0}
    # 50 of 200 episodes won, none lost: p = 0.25, the normal approximation's 95 % half-width
    # 1.96 * sqrt(.25 * .75 / 200) = 0.060.
    wide = paired_bootstrap([[0] * 200], [[1] * 50 + [0] * 150])
    assert wide["value"] == pytest.approx(0.25)
    assert wide["low"] == pytest.approx(0.19, abs=0.02) and wide["high"] == pytest.approx(0.31, abs=0.02)
    with pytest.raises(ValueError, match="4 reference episodes against 3"):
        paired_bootstrap([[1, 0, 1, 0]], [[1, 1, 1]])


def test_over_base_seeds_is_each_bases_run_and_the_t_interval_over_them(tiny, tmp_path):
    from scipy import stats

    from experiments.studies.niah import run_over_bases

    exp = load(family_files(tiny, tmp_path, runs_root=str(tiny.runs), episodes=24), models=["fwpkm-zero-shot"])
    said = []
    folder, summary = run_over_bases(exp, [0, 1], say=said.append)
    assert summary["base_seeds"] == [0, 1]
    alone = [run(dataclasses.replace(exp, base_seed=seed), say=lambda _: None)[1]["models"]["fwpkm-zero-shot"]
             for seed in (0, 1)]  # each base's own run, read back from its folder
    cases = [("exact", s, [a[s]["mean"] for a in alone]) for s in ("1-iter", "2-iter", "in-pass")]
    cases += [("candidate", s, [a["candidate_match"][s]["mean"] for a in alone]) for s in ("1-iter", "2-iter")]
    for what, setting, values in cases:
        stat = summary["models"]["fwpkm-zero-shot"][what][setting]
        assert stat["values"] == pytest.approx(values)
        mean, sd = sum(values) / 2, abs(values[0] - values[1]) / 2 ** 0.5
        half = stats.t.ppf(0.975, 1) * sd / 2 ** 0.5
        assert stat["mean"] == pytest.approx(mean) and stat["t95"] == pytest.approx([mean - half, mean + half])
    assert set(summary["models"]["fwpkm-zero-shot"]["candidate"]) == {"1-iter", "2-iter"}
    assert said.count("--- base seed 0") == 1 and said.count("--- base seed 1") == 1
    saved = json.loads((folder / "results.json").read_text())
    assert saved["models"]["fwpkm-zero-shot"]["exact"]["in-pass"]["values"] == pytest.approx(
        summary["models"]["fwpkm-zero-shot"]["exact"]["in-pass"]["values"])
    assert "t-interval over the bases" in (folder / "table.txt").read_text()
    with pytest.raises(ConfigError, match="--base-seeds must be distinct"):
        run_over_bases(exp, [1, 1])


def test_over_bases_is_the_student_t_interval_of_the_bases_values():
    from experiments.studies.niah import over_bases

    def base(in_pass, cand):
        return {"models": {"m": {"1-iter": {"mean": 0.0}, "in-pass": {"mean": in_pass},
                                 "candidate_match": {"1-iter": {"mean": cand}}}}}

    out = over_bases({0: base(0.10, 0.36), 1: base(0.06, 0.27), 2: base(0.11, 0.21)})
    stat = out["models"]["m"]["exact"]["in-pass"]
    # by hand: mean 0.09, sd 0.02646, t(0.975, 2 df) = 4.3027, half = 4.3027 · 0.02646 / √3 = 0.06572
    assert stat["mean"] == pytest.approx(0.09) and stat["t95"] == pytest.approx([0.02428, 0.15572], abs=1e-4)
    assert out["models"]["m"]["candidate"]["1-iter"]["t95"] == pytest.approx([0.0924, 0.4676], abs=1e-3)
    assert out["models"]["m"]["exact"]["1-iter"]["t95"] == [0.0, 0.0] and out["base_seeds"] == [0, 1, 2]

    def two(in_pass_m, in_pass_r):
        return {"models": {"r": {"in-pass": {"mean": in_pass_r}}, "m": {"in-pass": {"mean": in_pass_m}}}}

    # Paired over the bases: the t-interval of the three differences 0.10, 0.05, 0.12 (by hand:
    # mean 0.09, sd 0.03606, half 4.3027 · 0.03606 / √3 = 0.08957).
    out = over_bases({0: two(0.50, 0.40), 1: two(0.45, 0.40), 2: two(0.47, 0.35)}, reference="r")
    assert out["models"]["m"]["paired"]["in-pass"]["values"] == pytest.approx([0.10, 0.05, 0.12])
    assert out["models"]["m"]["paired"]["in-pass"]["t95"] == pytest.approx([0.00043, 0.17957], abs=1e-4)
    assert "paired" not in out["models"]["r"]


def test_shared_weight_is_the_read_weight_two_lookups_put_on_the_same_slots():
    # (T=2, H=2, k=2): head 0 shares slot 2 (min(0.4, 0.5) = 0.4), head 1 picks the same slots with
    # the same weights (1.0): 0.7, whichever position comes first; a position with itself is 1.
    idx = torch.tensor([[[1, 2], [7, 8]], [[2, 3], [8, 7]]])
    w = torch.tensor([[[0.6, 0.4], [0.3, 0.7]], [[0.5, 0.5], [0.7, 0.3]]])
    assert shared_weight(idx, w, 0, 1) == pytest.approx(0.7) == shared_weight(idx, w, 1, 0)
    assert shared_weight(idx, w, 0, 0) == pytest.approx(1.0)
    assert shared_weight(idx, torch.tensor([[[0.5, 0.5], [0.5, 0.5]], [[0.9, 0.1], [0.5, 0.5]]]), 0, 1) == \
        pytest.approx((0.5 + 1.0) / 2)


def test_addresses_compare_the_question_read_with_each_needles_write():
    # 3 needles whose numbers start at 3, 6 and 9 (writes at 2, 5, 8); the question's last token
    # (position 12) reads one slot of needle 0's and one of needle 1's, none of needle 2's.
    H, k = 1, 2
    idx = torch.zeros(13, H, k, dtype=torch.long)
    w = torch.full((13, H, k), 0.5)
    idx[:, 0] = torch.tensor([100, 101])  # every other position: slots no needle uses
    idx[2, 0], idx[5, 0], idx[8, 0], idx[12, 0] = torch.tensor([1, 2]), torch.tensor([3, 4]), \
        torch.tensor([5, 6]), torch.tensor([3, 1])
    ep = Episode(haystack=list(range(11)), question=[0, 0], answer=[7], ids=["a", "b", "c"], numbers=["1", "2", "3"],
                 asked=1, answer_starts=[3, 6, 9])
    got = addresses(idx, w, ep)
    assert got == pytest.approx({"asked": 0.5, "others": 0.25, "match": 0.5, "between": 0.0})  # a tie: shared
    assert addresses(idx, w, dataclasses.replace(ep, asked=2)) == pytest.approx(
        {"asked": 0.0, "others": 0.5, "match": 0.0, "between": 0.0})
    idx[12, 0] = torch.tensor([4, 3])  # needle 1's slots, in another order
    assert addresses(idx, w, ep) == pytest.approx({"asked": 1.0, "others": 0.0, "match": 1.0, "between": 0.0})
    idx[8, 0] = torch.tensor([4, 9])  # needle 2 now writes one of needle 1's slots too
    assert addresses(idx, w, ep) == pytest.approx({"asked": 1.0, "others": 0.25, "match": 1.0, "between": 0.5 / 3})
    one = dataclasses.replace(ep, ids=["b"], numbers=["2"], asked=0, answer_starts=[6])
    assert addresses(idx, w, one) == {"asked": 1.0, "others": None, "match": 1.0, "between": None}


def test_in_pass_reports_every_layers_addresses_and_gives_its_observer_back(model_and_episodes):
    model, episodes, rule = model_and_episodes
    memory = model.snapshot_memory()
    seen = []
    for layer in model.fwpkm_layers():
        layer.observer = lambda *args: seen.append(args)
    hits, where = read_in_pass(model, episodes[0], rule, memory, contextlib.nullcontext())
    assert seen == []  # the reading's own observer replaced it for the read ...
    assert set(where) == {layer.name for layer in model.fwpkm_layers()}
    for value in where.values():
        assert 0.0 <= value["asked"] <= 1.0 and 0.0 <= value["between"] <= 1.0 and value["match"] in (0.0, 0.5, 1.0)
    model.set_writes(False)
    with torch.no_grad():
        model(torch.tensor(episodes[0].haystack)[None])
    assert len(seen) == len(model.fwpkm_layers())  # ... and it is back afterwards
    for layer in model.fwpkm_layers():
        layer.observer = None


def test_a_haystack_source_is_any_text_as_the_model_reads_it_halved_into_dev_and_eval(tiny_base, tmp_path):
    from types import SimpleNamespace

    from experiments.studies.needle_reading import haystack

    texts = ["The river ran past the mill and on to the sea.", "A second document, about bread and salt."]
    for i, text in enumerate(texts):
        (tmp_path / f"doc{i}.txt").write_text(text)
    setup, tok = tiny_base.setup, tiny_base.setup.scenario.tokenizer
    whole = [t for text in texts for t in tok.encode(text) + [tok.eot_id]]
    exp = SimpleNamespace(haystack_source=str(tmp_path / "doc*.txt"), haystack_domain="math", split="dev")
    dev = haystack(exp, setup).tolist()
    exp.split = "eval"
    assert dev + haystack(exp, setup).tolist() == whole and len(dev) == len(whole) // 2
    exp.haystack_source = None  # no source: the domain's split, as before the field
    split = setup.scenario.domains["math"].splits["eval"]
    assert haystack(exp, setup).tolist() == split.segments.tokens[:, :-1][split.segments.doc_index[:, :-1] >= 0].tolist()
    exp.haystack_source = str(tmp_path / "missing.txt")
    with pytest.raises(ValueError, match="missing.txt"):
        haystack(exp, setup)


def test_persisting_memory_carries_each_readings_writes_to_the_next_episode(tiny_base, model_and_episodes):
    """memory: persist reads the episodes in an order drawn from the seed, each reading starting
    from what the same reading left after the episode before; results come back in episode order."""
    from types import SimpleNamespace

    from experiments.studies.needle_reading import episodes as scored, read_episodes, split_tokens

    model, _, rule = model_and_episodes
    setup = tiny_base.setup
    source, tok = split_tokens(setup.scenario.domains["math"].splits["eval"]), setup.scenario.tokenizer
    exp = SimpleNamespace(needle_config=NeedleConfig(haystack_tokens=120, needles=2, depths=(0.1, 0.3)), episodes=4,
                          iterations=[2], memory="persist")
    start = model.snapshot_memory()
    persist = read_episodes(model, exp, rule, source, tok, "32-true", seed=5)
    reset = read_episodes(model, SimpleNamespace(**{**vars(exp), "memory": "reset"}), rule, source, tok, "32-true", seed=5)
    order = np.random.default_rng(5).permutation(4).tolist()
    assert order != sorted(order)  # the order is drawn, not the episodes' own
    eps, hits, address = list(scored(exp, source, tok)), {}, {}
    iterated = in_pass = start
    for i in order:
        answer, _ = read_iteratively(model, eps[i], 2, rule, iterated, contextlib.nullcontext())
        iterated = model.snapshot_memory()
        _, where = read_in_pass(model, eps[i], rule, in_pass, contextlib.nullcontext())
        in_pass = model.snapshot_memory()
        hits[i], address[i] = [int(a) for a in answer], where
    model.restore_memory(start)
    assert persist["token_hits"]["2-iter"] == [hits[i] for i in range(4)]
    for name in persist["address"]:
        for key, values in persist["address"][name].items():
            assert values == [address[i][name][key] for i in range(4)]
    # the carried memory changes what the questions read; reset gives every episode the trained memory
    assert persist["address"] != reset["address"]
    assert reset["address"] == read_episodes(model, SimpleNamespace(**{**vars(exp), "memory": "reset"}), rule, source,
                                             tok, "32-true", seed=9)["address"]


def test_address_patching_reads_the_question_with_the_asked_needles_queries(model_and_episodes):
    """With `patch`, every FwPKM layer looks up the question's answer positions exactly where the
    asked needle's " is" and number tokens did (writes off in the final read: the same keys, so the
    same slots and weights); without it they differ; the patch is gone afterwards."""
    model, episodes, rule = model_and_episodes
    memory = model.snapshot_memory()
    ep = episodes[0]
    k = len(ep.answer)
    src = [ep.answer_starts[ep.asked] - 1 + i for i in range(k)]
    dst = [len(ep.haystack) + len(ep.question) - 1 + i for i in range(k)]
    seen = {}
    layers = model.fwpkm_layers()
    for layer in layers:
        layer.observer = lambda layer, g, idx, w: seen.__setitem__(layer.name, (idx, w))
    try:
        for patch in (True, False):
            seen.clear()
            read_iteratively(model, ep, 2, rule, memory, contextlib.nullcontext(), patch=patch)
            assert set(seen) == {layer.name for layer in layers}
            for idx, w in seen.values():  # the final read's lookups, every candidate row
                same = torch.equal(idx[:, dst], idx[:, src]) and torch.equal(w[:, dst], w[:, src])
                assert same == patch
            assert all(layer.query_patch is None for layer in layers)
    finally:
        for layer in layers:
            layer.observer = None
    model.restore_memory(memory)
