"""Sparse memory finetuning: the scores equal the paper's formulas computed by hand; one engine
step moves exactly the top-scoring read rows of the static PKM's value table, by lazy Adam's first
step on the full gradient's rows, and nothing else; the background is counted from the model's own
texts without touching the run; the model learns; the state resumes; bad input is refused."""
import copy
import math
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from cl_platform.memory.fwpkm import FwPKMConfig, WriteRule
from cl_platform.memory.pkm import PKMConfig
from cl_platform.model import FwPKMLM, ModelConfig
from cl_platform.optim import MixedAdamW
from cl_platform.strategy import StrategyContext
from strategies.sparse_memory import SparseMemory, smf_scores, top_slots

V, N = 32, 16  # vocabulary; static PKM slots (4 sub-keys squared)


def tiny_model(seed=0, pkm=True):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=V, n_layer=2, d_model=16, n_head=2, window=8, fwpkm_layers=[1],
                      fwpkm=FwPKMConfig(num_subkeys=4, d_key=8, d_value=8, topk=2),
                      pkm_layers=[0] if pkm else [], pkm=PKMConfig(num_subkeys=4, d_key=8, d_value=8, heads=2, topk=2))
    model = FwPKMLM(cfg, WriteRule(chunk=8))
    model.train()
    return model


def batches(n, B=2, T=12, seed=0):
    """n random (inputs, targets) batches of B rows, T tokens."""
    rows = torch.randint(0, V, (n, B, T + 1), generator=torch.Generator().manual_seed(seed))
    return [(r[:, :-1], r[:, 1:]) for r in rows]


def context(model, experience=1):
    current = SimpleNamespace(data=SimpleNamespace(segments=SimpleNamespace(eot_id=0, seq_len=12)))
    return StrategyContext(model=model, experience=experience, domain="math", mode="finetune", current=current)


def engine_steps(model, strategy, data, lr=1e-2, opt=None, ctx=None):
    """The finetune step as `LMModule._gradient_step` takes it: forward, after_write, backward,
    after_backward, the outer optimiser's step over every slow weight."""
    if ctx is None:
        ctx = context(model)
        strategy.on_experience_start(ctx)
    opt = opt or MixedAdamW(model.optimizer_groups(0.1, lr))
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        strategy.transform_batch({"input_ids": x}, ctx)
        _, loss = model(x, y)
        strategy.after_write(ctx)
        loss.backward()
        strategy.after_backward(ctx)
        assert [p for p in model.parameters() if p.grad is not None and not p.grad.is_sparse] == []
        opt.step()
    return ctx, opt


def test_scores_are_the_papers_formulas_by_hand():
    counts = torch.tensor([3, 0, 1, 2])
    df, texts, reads = torch.tensor([2, 1, 0, 2]), 2, torch.tensor([5, 1, 0, 4])
    tfidf = smf_scores(counts, df, texts, reads, "tfidf").tolist()
    want = [3 / 6 * math.log(3 / 3), -math.inf, 1 / 6 * math.log(3 / 1), 2 / 6 * math.log(3 / 3)]
    assert tfidf == pytest.approx(want)
    kl = smf_scores(counts, df, texts, reads, "kl").tolist()
    p, q = [3 / 6, 0, 1 / 6, 2 / 6], [6 / 14, 2 / 14, 1 / 14, 5 / 14]
    assert kl[1] == -math.inf
    assert [kl[i] for i in (0, 2, 3)] == pytest.approx([p[i] * math.log(p[i] / q[i]) for i in (0, 2, 3)])
    assert smf_scores(counts, df, texts, reads, "tf").tolist() == [3, -math.inf, 1, 2]
    # ties at 0 (slots 0 and 3) go to the lower id; unread slots never, even when t asks for more
    assert top_slots(torch.tensor(tfidf, dtype=torch.float64), 2).tolist() == [0, 2]
    assert top_slots(torch.tensor(tfidf, dtype=torch.float64), 4).tolist() == [0, 2, 3]


def hand_choice(reads, df, texts, t):
    """The paper's top-t by TF-IDF, with Python counting and sorting."""
    c = Counter(reads.reshape(-1).tolist())
    total = sum(c.values())
    score = {i: c[i] / total * math.log((texts + 1) / (int(df[i]) + 1)) for i in c}
    return sorted(sorted(score, key=lambda i: (-score[i], i))[:t])


def test_one_step_moves_exactly_the_top_rows_by_lazy_adams_first_step():
    model, t, lr = tiny_model(), 3, 1e-2
    s = SparseMemory(slots=t, background=4, length=8)
    ctx = context(model)
    s.on_experience_start(ctx)
    pkm = model.blocks[0].ffn
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    (x, y), = batches(1)

    # reference: the full dense gradient of the value table, from an untouched copy
    ref = copy.deepcopy(model)
    ref.blocks[0].ffn.record_reads = True
    _, loss = ref(x, y)
    loss.backward()
    grad = ref.blocks[0].ffn.values.weight.grad.to_dense()
    want_rows = hand_choice(ref.blocks[0].ffn.last_reads, s.choice.df["blocks.0.ffn"], 4, t)

    engine_steps(model, s, [(x, y)], lr=lr, ctx=ctx)
    after = dict(model.named_parameters())
    moved = [n for n in before if not torch.equal(before[n], after[n].detach())]
    assert moved == ["blocks.0.ffn.values.weight"]
    w0, w1 = before["blocks.0.ffn.values.weight"], after["blocks.0.ffn.values.weight"].detach()
    rows = torch.nonzero((w0 != w1).any(1)).squeeze(1).tolist()
    assert rows == want_rows and len(rows) == t
    g = grad[rows]
    # lazy Adam's first step (SparseAdam's eps on sqrt(v) before bias correction): m = (1-β1)·g,
    # √v = √(1-β2)·|g|, step lr·√(1-β2)/(1-β1)
    b1, b2, eps = 0.9, 0.999, 1e-8
    adam = w0[rows] - lr * math.sqrt(1 - b2) / (1 - b1) * (1 - b1) * g / (math.sqrt(1 - b2) * g.abs() + eps)
    torch.testing.assert_close(w1[rows], adam, rtol=1e-5, atol=1e-7)
    assert s.summary()["slots_trained"] == {"blocks.0.ffn": t} and s.summary()["steps"] == 1


def test_the_background_is_the_models_texts_counted_without_touching_the_run():
    model = tiny_model()
    model.train()
    layer = model.fwpkm_layers()[0]
    state = [copy.deepcopy(t) for t in layer.snapshot()]
    flags = (layer.writes_enabled, layer.calls, layer.writes)
    s = SparseMemory(slots=3, background=5, length=8, seed=3)
    s.on_experience_start(context(model))
    after = layer.snapshot()
    assert all(torch.equal(a, b) for a, b in zip(state, after)) and (layer.writes_enabled, layer.calls, layer.writes) == flags
    assert model.training
    df, reads = s.choice.df["blocks.0.ffn"], s.choice.reads["blocks.0.ffn"]
    # each of the 5 texts reads 8 tokens x 2 heads x top-2 slots
    assert int(reads.sum()) == 5 * 8 * 2 * 2 and int(df.max()) <= 5 and bool((df <= reads).all())
    assert bool(((df > 0) == (reads > 0)).all())
    # the same seed gives the same background; another seed other texts
    again = SparseMemory(slots=3, background=5, length=8, seed=3)
    again.on_experience_start(context(tiny_model()))
    other = SparseMemory(slots=3, background=5, length=8, seed=4)
    other.on_experience_start(context(tiny_model()))
    assert torch.equal(again.choice.df["blocks.0.ffn"], df) and not torch.equal(other.choice.reads["blocks.0.ffn"], reads)


def test_the_model_learns_its_batches_and_only_a_few_rows_move():
    model = tiny_model()
    data = batches(2)
    s = SparseMemory(slots=4, background=4, length=8)
    with torch.no_grad():
        start = [float(model(x, y)[1]) for x, y in data]
    ctx, opt = engine_steps(model, s, data * 15, lr=3e-2)
    model.eval()
    with torch.no_grad():
        end = [float(model(x, y)[1]) for x, y in data]
    assert all(e < b for e, b in zip(end, start)), (start, end)
    assert s.summary()["slots_trained"]["blocks.0.ffn"] <= N and s.steps == 30


def test_a_resumed_strategy_chooses_as_the_uninterrupted_one():
    data = batches(4)
    whole, s = tiny_model(), SparseMemory(slots=3, background=4, length=8)
    ctx, opt = engine_steps(whole, s, data)

    part, first = tiny_model(), SparseMemory(slots=3, background=4, length=8)
    ctx2, opt2 = engine_steps(part, first, data[:2])
    resumed = SparseMemory(slots=3, background=4, length=8)
    resumed.load_state_dict(first.state_dict())
    ctx3 = context(part)  # resumed in the middle of the experience: no on_experience_start, as the engine does
    assert torch.equal(resumed.choice.df["blocks.0.ffn"], first.choice.df["blocks.0.ffn"])
    engine_steps(part, resumed, data[2:], opt=opt2, ctx=ctx3)
    for (n, a), b in zip(whole.named_parameters(), part.parameters()):
        assert torch.equal(a, b), n
    assert resumed.summary() == s.summary()
    with pytest.raises(ValueError, match="state has keys"):
        SparseMemory().load_state_dict({"df": {}})


def test_bad_input_is_refused():
    with_pkm, without = tiny_model().config, tiny_model(pkm=False).config
    with pytest.raises(ValueError, match="no static PKM"):
        SparseMemory().check(without, "finetune")
    with pytest.raises(ValueError, match="fast"):
        SparseMemory(slots=4).check(with_pkm, "fast")
    with pytest.raises(ValueError, match=f"slots 17 is more than the static PKM has \\({N}\\)"):
        SparseMemory(slots=17).check(with_pkm, "finetune")
    stream = [SimpleNamespace(data=SimpleNamespace(segments=SimpleNamespace(seq_len=12)))]
    with pytest.raises(ValueError, match="background length 13 is longer than the stream's segments"):
        SparseMemory(slots=4, length=13).check(with_pkm, "finetune", stream)
    SparseMemory(slots=4, length=12).check(with_pkm, "finetune", stream)
    for kwargs, field in (({"slots": 0}, "slots"), ({"background": 1.5}, "background"), ({"score": "idf"}, "score")):
        with pytest.raises(ValueError, match=field):
            SparseMemory(**kwargs)


def ddp_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import os

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        model, s = tiny_model(), SparseMemory(slots=3, background=4, length=8)
        s.choice.count_background(model, 0)  # identical on every rank: same model, same seed
        (x, _), = batches(1, B=2 * world)
        s.choice.record(model, True)
        with torch.no_grad():
            model(x[2 * rank:2 * rank + 2])  # each rank reads its own share of the batch
        torch.save(s.choice.choose(model), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_under_data_parallelism_every_rank_chooses_the_rows_of_the_whole_batch(tmp_path):
    import torch.multiprocessing as mp

    world = 2
    mp.spawn(ddp_worker, args=(world, str(tmp_path / "init"), str(tmp_path)), nprocs=world, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world))
    model, s = tiny_model(), SparseMemory(slots=3, background=4, length=8)
    s.choice.count_background(model, 0)
    (x, _), = batches(1, B=2 * world)
    s.choice.record(model, True)
    with torch.no_grad():
        model(x)
    whole = s.choice.choose(model)
    assert torch.equal(r0["blocks.0.ffn"], whole["blocks.0.ffn"]) and torch.equal(r1["blocks.0.ffn"], whole["blocks.0.ffn"])
    # ... which one rank's share alone would not always give: the test can fail
    s.choice.record(model, True)
    with torch.no_grad():
        model(x[:2])
    alone = s.choice.choose(model)["blocks.0.ffn"]
    s.choice.record(model, True)
    with torch.no_grad():
        model(x[2:])
    assert not (torch.equal(alone, whole["blocks.0.ffn"]) and torch.equal(s.choice.choose(model)["blocks.0.ffn"], alone))
