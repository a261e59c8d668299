"""The memory recorder (`cl.inspect`): the FwPKM observer against the loop reference, the per-slot
top-K against brute force, and real tiny runs: recording changes nothing, its counts equal the
layer's own, its examples are the stream's tokens, its gates the model's."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from cl_platform.memory.fwpkm import FwPKM, FwPKMConfig, WriteRule, init_state, zscore
from cl_platform.memory.fwpkm_naive import naive_fwpkm
from cl_platform.memory_recorder import (
    CONTEXT,
    EXAMPLES,
    GATE_TOKENS,
    TOP_SLOTS,
    TopPerSlot,
)


def quiet(_):
    pass


# --- the layer's observer -------------------------------------------------------------------------------
@pytest.mark.parametrize("heads", [1, 2])
def test_the_observer_sees_each_tokens_picks_with_its_own_chunks_keys(heads):
    torch.manual_seed(0)
    cfg = FwPKMConfig(num_subkeys=8, d_key=8, d_value=6, heads=heads, topk=3)
    rule = WriteRule(chunk=4, lr_keys=5.0)  # large key steps: chunk 2 addresses differently from chunk 1's keys
    layer = FwPKM(12, cfg, rule)
    start = layer.snapshot()
    seen = []
    layer.observer = lambda lyr, g, idx, w: seen.append((lyr, g, idx, w))
    x = torch.randn(2, 10, 12)
    with torch.no_grad():
        layer(x)
        q = layer.proj_q(layer.norm_q(x))
        v = zscore(layer.proj_v(layer.norm_v(x)))
        g = torch.sigmoid(layer.proj_g(layer.norm_g(x)).squeeze(-1))
    ref = naive_fwpkm(q.double(), v.double(), g.double(), init_state(cfg)._replace(
        keys=start.keys.double(), values=start.values.double()), cfg, rule)
    (lyr, g_seen, idx, w), = seen
    assert lyr is layer
    assert torch.equal(idx, ref["idx"])
    torch.testing.assert_close(w.double(), ref["weights"].detach(), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(g_seen, g)
    # The picks of the last chunk differ from what the call's first keys would give.
    from cl_platform.memory.product_keys import product_key_lookup
    first_keys, _ = product_key_lookup(q.view(2, 10, heads, -1), start.keys, cfg.topk)
    assert not torch.equal(first_keys.idx[:, 8:], idx[:, 8:])


# --- top-K per slot -----------------------------------------------------------------------------------
def test_top_per_slot_keeps_the_k_heaviest_events_of_every_slot_over_updates():
    gen = torch.Generator().manual_seed(0)
    top = TopPerSlot(num_slots=10, k=3)
    events = []
    ref = 0
    for _ in range(7):
        n = int(torch.randint(0, 40, (1,), generator=gen))
        slots = torch.randint(0, 9, (n,), generator=gen)  # slot 9 never used
        weights = torch.rand(n, generator=gen)
        refs = torch.arange(ref, ref + n)
        ref += n
        top.update(slots, weights, refs)
        events += list(zip(slots.tolist(), weights.tolist(), refs.tolist()))
    for slot in range(10):
        mine = sorted(((w, r) for s, w, r in events if s == slot), reverse=True)[:3]
        kept = [(w, r) for w, r in zip(top.weight[slot].tolist(), top.ref[slot].tolist()) if r >= 0]
        assert [r for _, r in kept] == [r for _, r in mine]
        np.testing.assert_allclose([w for w, _ in kept], [w for w, _ in mine], rtol=1e-6)
    assert (top.ref[9] == -1).all()


# --- real tiny runs --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runs(tiny, tiny_base, tmp_path_factory):
    from experiments.run import execute

    root = tmp_path_factory.mktemp("inspect")
    made = {}
    for name, extra in (("plain", {}), ("inspect", {"inspect": True}),
                        ("no_lookahead", {"inspect": True, "fwpkm": {"lookahead": False, "chunk": 16}})):
        cfg = tiny.config(root / f"{name}.yaml", cl=extra)  # merged into the tiny defaults
        folder, results, _ = execute(cfg, run_dir=root / name, progress_bar=False, say=quiet)
        made[name] = SimpleNamespace(folder=folder, results=results, config=cfg)
    return SimpleNamespace(root=root, **made)


def test_recording_changes_no_result(runs):
    a, b = runs.plain.results, runs.inspect.results
    assert a.matrix.values.tolist() == b.matrix.values.tolist()
    assert a.curves == b.curves
    assert a.config_hash == b.config_hash  # cl.inspect is not part of the run's identity
    assert not (runs.plain.folder / "inspect").exists()


def _layer_state(folder: Path, config: Path):
    from cl_platform.checkpoint import load_checkpoint
    from experiments.setup import load_setup

    setup = load_setup(config)
    return setup, load_checkpoint(folder / "checkpoints" / "last.ckpt", "run", setup.model_config)["model"]


def test_write_counts_equal_the_layers_own_read_counts_when_every_token_writes(runs):
    # Without look-ahead every token writes, so per slot the recorder's writes of the last
    # experience equal the layer's read counts, which restart with each experience.
    setup, state = _layer_state(runs.no_lookahead.folder, runs.no_lookahead.config)
    last = len(setup.scenario)
    with np.load(runs.no_lookahead.folder / "inspect" / "counts.npz") as counts:
        writes = counts[f"writes_fwpkm1_{last}"]
    np.testing.assert_array_equal(writes, state["blocks.1.fwpkm.read_counts"].numpy())


def test_with_look_ahead_the_last_token_of_each_chunk_does_not_write(runs):
    setup, state = _layer_state(runs.inspect.folder, runs.inspect.config)
    exp = setup.scenario[len(setup.scenario) - 1]
    segments, T = len(exp.data.segments), exp.data.segments.seq_len
    k, chunk = setup.model_config.fwpkm.topk, setup.config.cl.fwpkm.chunk
    with np.load(runs.inspect.folder / "inspect" / "counts.npz") as counts:
        writes = counts[f"writes_fwpkm1_{len(setup.scenario)}"]
        reads = {t: counts[f"reads_fwpkm1_{t}"] for t in range(1, len(setup.scenario) + 1)}
    picks = state["blocks.1.fwpkm.read_counts"].numpy()
    assert (writes <= picks).all()
    assert picks.sum() - writes.sum() == segments * (T // chunk) * k
    # Reads at row t: every token of the domain's eval split, k picks each.
    for t, domain in enumerate((e.domain for e in setup.scenario), start=1):
        eval_segments = setup.scenario[0].eval_data[domain].segments
        assert reads[t].sum() == len(eval_segments) * eval_segments.seq_len * k


def test_slot_examples_are_the_streams_tokens_heaviest_first(runs):
    from experiments.setup import load_setup

    setup = load_setup(runs.inspect.config)
    data = json.loads((runs.inspect.folder / "inspect" / "slots.json").read_text())
    tokens = {int(k): v for k, v in json.loads((runs.inspect.folder / "inspect" / "tokens.json").read_text()).items()}
    assert [e["domain"] for e in data["experiences"]] == [e.domain for e in setup.scenario]
    assert data["bounds"] == {"top_slots": TOP_SLOTS, "examples": EXAMPLES, "context": CONTEXT}
    for entry, exp in zip(data["experiences"], setup.scenario):
        assert entry["partial"] is False
        slots = entry["layers"]["fwpkm1"]
        assert 0 < len(slots) <= TOP_SLOTS
        weights = [s["write_weight"] for s in slots]
        assert weights == sorted(weights, reverse=True)
        adapt = exp.data.segments.tokens.numpy()  # (segments, T + 1): inputs and the next token
        eval_tokens = setup.scenario[0].eval_data[exp.domain].segments.tokens.numpy()
        for s in slots:
            assert 0 < len(s["writers"]) <= EXAMPLES and s["writes"] >= len(s["writers"])
            for kind, source in (("writers", adapt), ("readers", eval_tokens)):
                ws = [ex["weight"] for ex in s[kind]]
                assert ws == sorted(ws, reverse=True) and all(0 < w <= 1 for w in ws)
                for ex in s[kind]:
                    window = ex["before"] + [ex["token"]] + ex["after"]
                    assert len(ex["before"]) <= CONTEXT and len(ex["after"]) <= CONTEXT
                    assert _occurs(source, window, len(ex["before"]), ex["next"]), (kind, ex)
                    for i in window:
                        assert str(i) in map(str, tokens)


def _occurs(segments: np.ndarray, window: list[int], at: int, nxt: int | None) -> bool:
    """`window` occurs in a segment's inputs and the token after its position `at` is `nxt`."""
    n = len(window)
    for row in segments:
        inputs = row[:-1]
        for start in range(len(inputs) - n + 1):
            if list(inputs[start:start + n]) == window:
                if nxt is None or int(row[start + at + 1]) == nxt:
                    return True
    return False


def test_gates_are_the_last_models_gates_on_the_first_eval_tokens(runs):
    from experiments.setup import build_model

    setup, state = _layer_state(runs.inspect.folder, runs.inspect.config)
    model = build_model(setup.model_config, setup.config.seed, setup.config.pretrain.fwpkm)
    model.load_state_dict(state)
    model.eval()
    model.set_writes(False)
    seen = []
    model.fwpkm_layers()[0].observer = lambda layer, g, idx, w: seen.append(g)
    with np.load(runs.inspect.folder / "inspect" / "gates.npz") as gates:
        recorded = {key: gates[key] for key in gates.files}
    counts = torch.bincount(torch.cat([d.splits["pretrain"].segments.tokens.flatten()
                                       for d in setup.scenario.domains.values() if d.splits["pretrain"].n_docs]),
                            minlength=setup.scenario.tokenizer.vocab_size)
    np.testing.assert_array_equal(recorded["pretrain_counts"], counts.numpy())
    for domain, split in setup.scenario[0].eval_data.items():
        inputs = split.segments.tokens[:, :-1]
        n = min(GATE_TOKENS, inputs.numel())
        assert recorded[f"{domain}_ids"].tolist() == inputs.flatten()[:n].tolist()
        seen.clear()
        with torch.no_grad():
            model(inputs)
        np.testing.assert_allclose(recorded[f"{domain}_fwpkm1"].astype(np.float32), seen[0].flatten()[:n].numpy(),
                                   atol=1e-3)


def test_the_report_shows_slots_and_gates_from_the_records(runs, tmp_path):
    from html.parser import HTMLParser

    from analysis.memory_inspect import gate_by_class, load_inspect
    from analysis.report import write_report
    from analysis.report_document import num, slug

    html, md = write_report([runs.inspect.folder], tmp_path / "report")
    page, text = html.read_text(), md.read_text()
    prefix = f"run-{slug(runs.inspect.folder.name)}"
    for section in ("slots", "gate"):
        assert f'id="{prefix}-{section}"' in page
    assert "http://" not in page and "https://" not in page
    # The gate table's means are gate_by_class's; the slot table shows the recorded top slot.
    stats = gate_by_class(load_inspect(runs.inspect.folder))["fwpkm1"]
    for name, value in stats.items():
        assert f'<td class="text">{name}</td>' in page and f"<td>{num(value['mean'])}</td>" in page
    slots = json.loads((runs.inspect.folder / "inspect" / "slots.json").read_text())
    top = slots["experiences"][0]["layers"]["fwpkm1"][0]
    assert f"<td>{top['slot']}</td><td>{top['writes']}</td><td>{top['reads']}</td>" in page
    assert 'class="hl"' in page and "**" in text  # shaded text; its Markdown twin marks the top tenth in bold

    class Spans(HTMLParser):
        titles: list[float] = []

        def handle_starttag(self, tag, attrs):
            if tag == "span":
                self.titles.append(float(dict(attrs)["title"]))

    spans = Spans()
    spans.feed(page)
    with np.load(runs.inspect.folder / "inspect" / "gates.npz") as gates:
        first = gates[f"{slots['experiences'][0]['domain']}_fwpkm1"]
    assert spans.titles[:5] == pytest.approx(first[:5].astype(float).tolist(), abs=5e-4)
    assert not (runs.plain.folder / "inspect").exists()
    plain_page = write_report([runs.plain.folder], tmp_path / "plain")[0].read_text()
    assert f'id="{prefix.replace("inspect", "plain")}-slots"' not in plain_page and 'class="hl"' not in plain_page


def test_a_resumed_experience_is_marked_partial_and_earlier_ones_are_kept(runs, tmp_path):
    from cl_platform.callbacks import RunCallback
    from experiments.run import execute

    class StopAt(RunCallback):
        def on_curve_point(self, runner, step):
            if step == 10:  # inside experience 2 (6 steps each); the last checkpoint is step 9
                raise RuntimeError("stopped for the test")

    folder = tmp_path / "stopped"
    with pytest.raises(RuntimeError, match="stopped for the test"):
        execute(runs.inspect.config, run_dir=folder, progress_bar=False, say=quiet, callbacks=[StopAt()])
    first = json.loads((folder / "inspect" / "slots.json").read_text())
    assert [e["experience"] for e in first["experiences"]] == [1]
    _, results, _ = execute(runs.inspect.config, run_dir=folder, resume=True, progress_bar=False, say=quiet)
    assert results.matrix.values.tolist() == runs.inspect.results.matrix.values.tolist()
    data = json.loads((folder / "inspect" / "slots.json").read_text())
    full = json.loads((runs.inspect.folder / "inspect" / "slots.json").read_text())
    assert [e["partial"] for e in data["experiences"]] == [False, True]
    assert data["experiences"][0] == full["experiences"][0]  # written before the stop, kept as it was
    with np.load(folder / "inspect" / "counts.npz") as part, np.load(runs.inspect.folder / "inspect" / "counts.npz") as whole:
        np.testing.assert_array_equal(part["writes_fwpkm1_1"], whole["writes_fwpkm1_1"])
        # Experience 2 from step 9 on: 3 of its 6 batches.
        assert part["writes_fwpkm1_2"].sum() * 2 == whole["writes_fwpkm1_2"].sum()
        np.testing.assert_array_equal(part["reads_fwpkm1_2"], whole["reads_fwpkm1_2"])  # its row ran whole


def test_a_strategys_copy_of_the_model_is_not_recorded(runs, tiny, tmp_path):
    # LwF's teacher is a deep copy of the model (its layers carry the observer along) and reads every
    # training batch too; only the run's own model is recorded, so the writes are counted once.
    from experiments.run import execute
    from experiments.setup import load_setup

    cfg = tiny.config(tmp_path / "lwf.yaml", cl={"mode": "finetune", "inspect": True}, strategy={"name": "lwf"})
    folder, _, _ = execute(cfg, run_dir=tmp_path / "lwf", progress_bar=False, say=quiet)
    setup = load_setup(cfg)
    k, chunk = setup.model_config.fwpkm.topk, setup.config.cl.fwpkm.chunk
    with np.load(folder / "inspect" / "counts.npz") as counts:
        for t, exp in enumerate(setup.scenario, start=1):
            T = exp.data.segments.seq_len
            assert counts[f"writes_fwpkm1_{t}"].sum() == len(exp.data.segments) * (T - T // chunk) * k
