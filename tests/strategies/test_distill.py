"""Fast-to-slow distillation: the KL falls, only the chosen slow weights move, the memory ends as
`after` says, frozen flags come back, fast mode only, and the state resumes exactly."""
import copy
from types import SimpleNamespace

import pytest
import torch

from cl_platform.memory.fwpkm import FwPKMConfig, WriteRule
from cl_platform.memory.pkm import PKMConfig
from cl_platform.model import FwPKMLM, ModelConfig
from cl_platform.strategy import StrategyContext
from cl_platform.sample import sample
from strategies.distill import Distill
from strategies.lwf import token_kl


def setup(seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=32, n_layer=2, d_model=32, n_head=2, window=8, fwpkm_layers=[1],
                      fwpkm=FwPKMConfig(num_subkeys=8, d_key=16, d_value=16, topk=4))
    model = FwPKMLM(cfg, WriteRule(chunk=8, lr_values=1.0))
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)  # fast mode
    g = torch.Generator().manual_seed(1)
    segs = []
    for _ in range(6):
        x = torch.randint(0, 32, (17,), generator=g)
        segs.append({"input_ids": x[:-1], "targets": x[1:]})
    return model, segs


def adapt(model, segs):
    with torch.no_grad():
        for s in segs:
            model(s["input_ids"][None])


def adapted_experience(strategy, seed=0):
    """(model, segments, context, memory before, memory after) of experience 1 started under
    `strategy` and adapted on its segments, not yet ended."""
    model, segs = setup(seed)
    ctx = StrategyContext(model=model, experience=1, domain="math", mode="fast",
                          current=SimpleNamespace(data=SimpleNamespace(segments=segs)))
    strategy.on_experience_start(ctx)
    before = model.snapshot_memory()
    adapt(model, segs)
    return model, segs, ctx, before, model.snapshot_memory()


@pytest.mark.parametrize("after", ["keep", "reset"])
def test_kl_falls_only_mlps_move_and_memory_ends_as_asked(after):
    s = Distill(params="mlp", steps=25, batch_size=3, lr=3e-3, after=after)
    model, segs, ctx, before, adapted = adapted_experience(s)
    slow = {n: p.clone() for n, p in model.named_parameters()}
    s.on_experience_end(ctx)
    losses = s.losses[-1]
    assert len(losses) == 25 and losses[0] > 0 and losses[-1] < 0.7 * losses[0], losses
    for n, p in model.named_parameters():
        moved = not torch.equal(p, slow[n])
        assert moved == (".ffn." in n and "blocks" in n), n
        assert not p.requires_grad and p.grad is None
    # the record of how far the consolidation moved the weights it trained: ‖Δθ‖ / ‖θ‖ over the MLPs
    mlps = [n for n in slow if ".ffn." in n and "blocks" in n]
    params = dict(model.named_parameters())
    change = sum(float((params[n] - slow[n]).square().sum()) for n in mlps) ** 0.5
    size = sum(float(slow[n].square().sum()) for n in mlps) ** 0.5
    assert len(s.moved) == 1 and s.moved[0] == pytest.approx(change / size, rel=1e-5) and s.moved[0] > 1e-3
    assert s.summary()["relative_change"] == s.moved
    want = adapted if after == "keep" else before
    for a, b in zip(model.snapshot_memory(), want):
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert all(layer.writes_enabled for layer in model.fwpkm_layers())


def test_finetune_mode_and_no_memory_are_refused():
    model, _ = setup()
    with pytest.raises(ValueError, match="'fast' mode only"):
        Distill().on_experience_start(StrategyContext(model=model, experience=1, domain="m", mode="finetune"))
    cfg = ModelConfig(vocab_size=32, n_layer=1, d_model=32, n_head=2, window=8, fwpkm_layers=[])
    with pytest.raises(ValueError, match="no FwPKM layer"):
        Distill().on_experience_start(StrategyContext(model=FwPKMLM(cfg), experience=1, domain="m", mode="fast"))
    with pytest.raises(ValueError, match="params"):
        Distill(params="attention")


def test_resume_mid_experience_consolidates_the_same_way():
    runs = []
    for resumed in (False, True):
        model, segs = setup()
        s = Distill(steps=5, batch_size=2)
        ctx = StrategyContext(model=model, experience=1, domain="math", mode="fast",
                              current=SimpleNamespace(data=SimpleNamespace(segments=segs)))
        s.on_experience_start(ctx)
        adapt(model, segs[:3])
        if resumed:
            s2 = Distill(steps=5, batch_size=2)
            s2.load_state_dict(s.state_dict())
            s = s2
        adapt(model, segs[3:])
        s.on_experience_end(ctx)
        runs.append((s.losses, [p.clone() for p in model.parameters()]))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))


def consolidated(retain, steps=12, lr=3e-3, seed=0):
    """(strategy, model, memory before, adapted memory, slow weights before) after one consolidation."""
    s = Distill(params="mlp", steps=steps, batch_size=3, lr=lr, retain=retain, anchors=6, anchor_length=12)
    model, segs, ctx, before, adapted = adapted_experience(s, seed)
    slow = copy.deepcopy(model)
    s.losses.append(s.consolidate(model, segs, experience=1, start=0))
    return s, model, before, adapted, slow


def anchor_kl(previous, model, before, texts):
    """KL(previous ‖ model) on `texts`, both reading the memory as the experience found it: the
    naive reference (two whole models) for the strategy's functional_call."""
    previous.restore_memory(before)
    model.restore_memory(before)
    previous.set_writes(False)
    model.set_writes(False)
    with torch.no_grad():
        return float(token_kl(previous(texts[:, :-1]), model(texts[:, :-1]), texts[:, 1:], 1.0))


def test_retention_starts_at_zero_anchors_the_model_and_leaves_the_new_domain_draws_alone():
    plain, m0, before, adapted, slow = consolidated(retain=0.0)
    held, m1, _, _, _ = consolidated(retain=1.0)
    # The texts are the model's own, written with the memory as the experience found it.
    texts = held.anchor_texts(slow, 1, 0)
    assert texts.shape == (6, 13) and bool((texts[:, 0] == 0).all())
    ref = copy.deepcopy(slow)
    ref.restore_memory(before)
    assert torch.equal(texts, sample(ref, 6, 12, generator=torch.Generator().manual_seed(1 + 500_009), start=0))
    # Step 1: the student is the previous model, so the retention KL is 0 and the new-domain KL
    # is plain distillation's (the same draws: the anchors have their own generator).
    assert held.retained[-1][0] == pytest.approx(0.0, abs=1e-6) and held.retained[-1][-1] > 1e-6
    assert held.losses[-1][0] == plain.losses[-1][0]
    assert plain.retained == [] and "retention_kl_first_last" not in plain.summary()
    # What it buys: the drift from the previous model on the anchors (reference: whole models) is
    # smaller with the term (measured 3.2x with the teacher fixed, stop 37; 18x when it moved with
    # the weights), and the new-domain KL still falls (to 0.63 of its start).
    drift_plain, drift_held = anchor_kl(slow, m0, before, texts), anchor_kl(slow, m1, before, texts)
    assert drift_held < 0.5 * drift_plain, (drift_held, drift_plain)
    assert held.losses[-1][-1] < 0.8 * held.losses[-1][0]
    # The strategy's last retention KL is that reference's KL at the weights before the last step:
    # close to (not equal to) the final drift, and far below plain distillation's.
    assert held.retained[-1][-1] < 0.5 * drift_plain


def test_retention_resumes_and_bad_knobs_are_refused():
    s, *_ = consolidated(retain=1.0, steps=3)
    s2 = Distill(retain=1.0)
    s2.load_state_dict(s.state_dict())
    assert s2.retained == s.retained and s2.losses == s.losses and len(s2.retained[-1]) == 3
    with pytest.raises(ValueError, match="retain"):
        Distill(retain=-1.0)
    with pytest.raises(ValueError, match="anchor_length"):
        Distill(anchor_length=0)
    stream = [SimpleNamespace(data=SimpleNamespace(segments=SimpleNamespace(seq_len=16)))]
    model, _ = setup()
    with pytest.raises(ValueError, match="anchor_length 32 is longer"):
        Distill(retain=1.0, anchor_length=32).check(model.config, "fast", stream)
    Distill(retain=0.0, anchor_length=32).check(model.config, "fast", stream)  # no texts are drawn


def test_sample_inputs_are_the_teachers_own_texts_and_the_segments_are_not_read():
    s = Distill(params="mlp", steps=12, batch_size=3, lr=3e-3, anchors=6, anchor_length=12, inputs="samples")
    model, segs, ctx, before, adapted = adapted_experience(s)
    teacher = copy.deepcopy(model)
    texts = s.teacher_texts(model, 1, 0)
    # the texts are what the model writes with its memory as adapted (a copy sampled the same way),
    # and differ from what it writes with the memory as the experience found it
    ref = sample(teacher, 6, 12, generator=torch.Generator().manual_seed(1 + 1_500_007), start=0)
    assert torch.equal(torch.stack([torch.cat([t["input_ids"][:1], t["targets"]]) for t in texts]), ref)
    teacher.restore_memory(before)
    assert not torch.equal(ref, sample(teacher, 6, 12, generator=torch.Generator().manual_seed(1 + 1_500_007), start=0))

    class Untouchable(list):
        def __len__(self):
            raise AssertionError("inputs: samples must not read the adapt segments")

    s.losses.append(s.consolidate(model, Untouchable(segs), experience=1, start=0))
    losses = s.losses[-1]
    assert len(losses) == 12 and losses[0] > 0 and losses[-1] < 0.8 * losses[0], losses
    # the KL it lowers is the one on the teacher's texts: the reference (memory as adapted vs as
    # found, writes off) on those texts after the consolidation is below its value before
    x = torch.stack([t["input_ids"] for t in texts])
    y = torch.stack([t["targets"] for t in texts])

    def kl(m):
        m.set_writes(False)
        m.restore_memory(adapted)
        with torch.no_grad():
            t_logits = m(x)
            m.restore_memory(before)
            out = float(token_kl(t_logits, m(x), y, 1.0))
        m.set_writes(True)
        return out

    assert kl(model) < 0.8 * kl(teacher)  # teacher: the slow weights before the consolidation
    with pytest.raises(ValueError, match="inputs"):
        Distill(inputs="dev")
    stream = [SimpleNamespace(data=SimpleNamespace(segments=SimpleNamespace(seq_len=16)))]
    with pytest.raises(ValueError, match="anchor_length 32 is longer"):
        Distill(inputs="samples", anchor_length=32).check(model.config, "fast", stream)


def test_low_rank_consolidation_moves_each_mlp_matrix_by_a_rank_r_update():
    s = Distill(params="mlp", steps=25, batch_size=3, lr=1e-2, rank=2)
    model, segs, ctx, before, adapted = adapted_experience(s)
    slow = {n: p.clone() for n, p in model.named_parameters()}
    s.on_experience_end(ctx)
    losses = s.losses[-1]
    assert len(losses) == 25 and losses[-1] < 0.8 * losses[0], losses
    moved = []
    for n, p in model.named_parameters():
        assert not p.requires_grad and p.grad is None
        delta = p - slow[n]
        if ".ffn." in n and "blocks" in n and p.ndim == 2:
            # B·A with r = 2: exactly two singular values above rounding (a dense update has
            # min(out, in) of them, so this fails for rank 0)
            sv = torch.linalg.svdvals(delta.double())
            assert sv[1] > 1e-4 * sv[0] and bool((sv[2:] < 1e-5 * sv[0]).all()), (n, sv[:4])
            moved.append(n)
        else:  # biases, attention, embeddings, norms: untouched
            assert torch.equal(p, slow[n]), n
    assert len(moved) == 4  # fc and proj of each of the two blocks' MLPs
    params = dict(model.named_parameters())
    change = sum(float((params[n] - slow[n]).square().sum()) for n in moved) ** 0.5
    assert s.moved == [pytest.approx(change / sum(float(slow[n].square().sum()) for n in moved) ** 0.5, rel=1e-4)]
    for a, b in zip(model.snapshot_memory(), adapted):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_low_rank_first_step_is_adams_sign_step_of_the_dense_gradient_through_a():
    """Naive reference for the factors: B starts at 0, so A's first gradient is 0 and B's is
    G·Aᵀ, G the dense KL gradient of W; Adam's first step is g / (|g| + eps) times lr, so the
    merged update is -lr · (G Aᵀ / (|G Aᵀ| + eps)) · A."""
    lr = 1e-2
    s = Distill(params="mlp", steps=1, batch_size=2, lr=lr, rank=3)
    model, segs, ctx, before, adapted = adapted_experience(s)
    one = segs[:1]  # one segment: every draw is that segment, so the batch is known
    ref = copy.deepcopy(model)
    names = [n for n, p in ref.named_parameters() if ".ffn." in n and p.ndim == 2]
    factors = s.adapters(ref, 1, torch.device("cpu"))
    x = torch.stack([one[0]["input_ids"]] * 2)
    y = torch.stack([one[0]["targets"]] * 2)
    ref.set_writes(False)
    ref.restore_memory(adapted)
    with torch.no_grad():
        teacher = ref(x)
    ref.restore_memory(before)
    params = dict(ref.named_parameters())
    for n in names:
        params[n].requires_grad_(True)
    token_kl(teacher, ref(x), y, 1.0).backward()
    slow = {n: p.detach().clone() for n, p in model.named_parameters()}
    s.losses.append(s.consolidate(model, one, experience=1, start=0))
    for n in names:
        a = factors[n][1].detach()
        gb = params[n].grad @ a.T
        want_b = -lr * gb / (gb.abs() + 1e-8)
        got = dict(model.named_parameters())[n] - slow[n]
        # the update lies in A's row space: got = B·A with B recovered by least squares
        b = torch.linalg.lstsq(a.T.double(), got.T.double()).solution.T.float()
        assert torch.allclose(b @ a, got, atol=1e-8), n
        # B is Adam's first step on G·Aᵀ; where |G·Aᵀ| is near Adam's eps (1e-8) the step is
        # g / (|g| + eps) and a gradient's last-bit rounding moves it, so compare where |g| >> eps
        sure = gb.abs() > 1e-6
        assert sure.float().mean() > 0.5, n
        assert torch.allclose(b[sure], want_b[sure], rtol=1e-4, atol=1e-7), (n, (b - want_b)[sure].abs().max())
        assert bool((b.abs() <= lr * (1 + 1e-4)).all()), n


def test_rank_bad_input_is_refused():
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="rank"):
            Distill(rank=bad)
    with pytest.raises(ValueError, match="rank > 0 makes low-rank updates"):
        Distill(params="pkm", rank=4)


@pytest.mark.parametrize("rank", [0, 4])
def test_the_teacher_stays_put_and_hold_keeps_the_model_with_its_adapted_memory_the_teacher(rank):
    def run(hold):
        s = Distill(params="mlp", steps=15, batch_size=3, lr=1e-2 if rank else 3e-3, rank=rank, hold=hold)
        model, segs, ctx, before, adapted = adapted_experience(s)
        teacher = copy.deepcopy(model)
        s.on_experience_end(ctx)
        return s, model, teacher, segs, before, adapted

    plain, m0, teacher, segs, before, adapted = run(0.0)
    held, m1, _, _, _, _ = run(1.0)
    assert plain.held == [] and "held_kl_first_last" not in plain.summary()
    assert held.losses[-1][0] == plain.losses[-1][0]  # the same draws, the same first step
    # Step 1: the student is the teacher. Later steps: the teacher is the slow weights as the
    # consolidation found them, so the student with the adapted memory drifts from it (a teacher
    # read from the live weights, as before stop 37, would keep this KL at exactly 0).
    assert held.held[-1][0] == pytest.approx(0.0, abs=1e-6) and len(held.held[-1]) == 15
    assert min(held.held[-1][1:]) > 1e-6, held.held[-1]

    x = torch.stack([s["input_ids"] for s in segs])
    y = torch.stack([s["targets"] for s in segs])
    reader = copy.deepcopy(teacher)

    def kl_to_teacher(m, memory):
        """Reference: KL(teacher with the adapted memory ‖ m reading `memory`), whole models."""
        for model in (teacher, m):
            model.set_writes(False)
        teacher.restore_memory(adapted)
        m.restore_memory(memory)
        with torch.no_grad():
            return float(token_kl(teacher(x), m(x), y, 1.0))

    # Both learn to do without the memory (measured 0.27-0.33 of the start); plain distillation
    # counts the memory twice where it is still there, and the term halves that drift (measured
    # 0.5x at rank 0 and at rank 4)
    start = kl_to_teacher(reader, before)
    assert kl_to_teacher(m0, before) < 0.6 * start and kl_to_teacher(m1, before) < 0.6 * start
    assert kl_to_teacher(m1, adapted) < 0.7 * kl_to_teacher(m0, adapted)
    s2 = Distill(hold=1.0)
    s2.load_state_dict(held.state_dict())
    assert s2.held == held.held
    old = {k: v for k, v in held.state_dict().items() if k not in ("held", "moved")}  # a checkpoint from before `hold`
    s3 = Distill()
    s3.load_state_dict(old)
    assert s3.held == []
    with pytest.raises(ValueError, match="hold"):
        Distill(hold=-0.5)


def pkm_experience(strategy, seed=0):
    """Experience 1 on a model with a static PKM in place of layer 0's MLP, adapted, not yet ended."""
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=32, n_layer=2, d_model=32, n_head=2, window=8, fwpkm_layers=[1],
                      fwpkm=FwPKMConfig(num_subkeys=8, d_key=16, d_value=16, topk=4), pkm_layers=[0],
                      pkm=PKMConfig(num_subkeys=8, d_key=16, d_value=16, heads=2, topk=4))
    model = FwPKMLM(cfg, WriteRule(chunk=8, lr_values=1.0))
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    _, segs = setup(seed)
    ctx = StrategyContext(model=model, experience=1, domain="math", mode="fast",
                          current=SimpleNamespace(data=SimpleNamespace(segments=Segments(segs))))
    strategy.on_experience_start(ctx)
    adapt(model, segs)
    return model, ctx


class Segments(list):
    """Segments with the stream's <|endoftext|> id, as PackedSegments carries it."""
    eot_id = 0
    seq_len = 16


@pytest.mark.parametrize("slots", [0, 5])
def test_consolidation_into_a_static_pkm_moves_only_value_rows_and_with_slots_the_chosen_few(slots):
    s = Distill(params="pkm", steps=1 if slots else 6, batch_size=3, lr=1e-2, slots=slots, anchors=4, anchor_length=8)
    model, ctx = pkm_experience(s)
    values = model.blocks[0].ffn.values.weight
    slow = {n: p.clone() for n, p in model.named_parameters()}
    if slots:  # the background was counted from the base's own texts when the experience began
        assert int(s.choice.reads["blocks.0.ffn"].sum()) == 4 * 8 * 2 * 4  # texts x tokens x heads x top-k
    s.on_experience_end(ctx)
    for n, p in model.named_parameters():
        assert torch.equal(p, slow[n]) == (n != "blocks.0.ffn.values.weight"), n
    rows = torch.nonzero((values != slow["blocks.0.ffn.values.weight"]).any(1)).squeeze(1)
    if slots:  # one step: exactly `slots` rows (the batch reads far more: 3 x 16 tokens x 2 heads x top-4)
        assert len(rows) == slots
        # lazy Adam's first step moves an entry by lr·|g| / (|g| + ε/√(1−β2)): about lr whatever the
        # gradient's scale, never more; SGD would move it by a multiple of the (small) gradient
        moved = (values - slow["blocks.0.ffn.values.weight"])[rows].abs()
        assert float(moved.max()) <= 1e-2 * (1 + 1e-5) and bool((moved.max(1).values > 0.9e-2).all())
    else:
        assert len(rows) > 5 and s.losses[-1][-1] < s.losses[-1][0]
    old = slow["blocks.0.ffn.values.weight"]
    assert s.moved == [pytest.approx(float((values - old).norm() / old.norm()), rel=1e-5)]
    if slots:  # the recording is off again, and the background is state: a resume scores against it
        assert all(not m.record_reads and m.last_reads is None for m in s.choice.pkms(model).values())
        again = Distill(params="pkm", steps=1, batch_size=3, lr=1e-2, slots=slots, anchors=4, anchor_length=8)
        again.load_state_dict(s.state_dict())
        assert again.moved == s.moved
        assert torch.equal(again.choice.df["blocks.0.ffn"], s.choice.df["blocks.0.ffn"])


def test_slots_bad_input_is_refused():
    with pytest.raises(ValueError, match="slots chooses a static PKM's value rows; it needs params: pkm"):
        Distill(params="mlp", slots=4)
    with pytest.raises(ValueError, match="slots must be an int >= 0"):
        Distill(params="pkm", slots=-1)
    model, _ = setup()
    with pytest.raises(ValueError, match="params='pkm' needs a static PKM layer"):
        Distill(params="pkm", slots=4).check(model.config, "fast")
    cfg = ModelConfig(vocab_size=32, n_layer=2, d_model=32, n_head=2, window=8, fwpkm_layers=[1], pkm_layers=[0],
                      pkm=PKMConfig(num_subkeys=8, d_key=16, d_value=16, heads=2, topk=4))
    with pytest.raises(ValueError, match="slots 65 is more than the static PKM has \\(64\\)"):
        Distill(params="pkm", slots=65).check(cfg, "fast")
    with pytest.raises(ValueError, match="state has keys"):
        Distill(params="pkm", slots=4).load_state_dict({"before": None, "losses": [], "retained": [], "held": []})
