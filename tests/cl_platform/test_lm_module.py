"""The LightningModule on synthetic batches: what each phase trains, evaluation, loss terms."""
import math

import pytest
import torch
from torch.utils.data import DataLoader

from cl_platform.device import Placement
from cl_platform.trainer import make_trainer, quiet_lightning
from cl_platform.lm_module import LMModule, NonFiniteLossError, OptimSettings
from cl_platform.memory.fwpkm import FwPKMConfig, WriteRule
from cl_platform.memory_policy import FrozenMemory, StreamMemory, get_memory_policy
from cl_platform.model import FwPKMLM, ModelConfig
from cl_platform.strategy import Strategy, StrategyContext

V, T = 64, 20


def tiny_model(seed=0) -> FwPKMLM:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=V, n_layer=2, d_model=32, n_head=2, fwpkm_layers=[0], window=8,
                      fwpkm=FwPKMConfig(num_subkeys=8, d_key=16, d_value=16))
    return FwPKMLM(cfg, WriteRule(chunk=8))


def batches(n=6, seed=1) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        seq = torch.randint(2, V, (T + 1,), generator=g)
        targets = seq[1:].clone()
        targets[-3:] = -100  # padding at the end, as in a split's last segment
        out.append({"input_ids": seq[:-1], "targets": targets})
    return out


def loader(n=6, batch_size=2):
    return DataLoader(batches(n), batch_size=batch_size)


def state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def same(a, b, keys=None):
    return all(torch.equal(a[k], b[k]) for k in (keys or a))


@pytest.fixture(autouse=True)
def _quiet():
    quiet_lightning()


def fit(module, data):
    make_trainer(Placement(), [], logger=False, progress_bar=False).fit(module, train_dataloaders=data)


def test_fast_mode_changes_only_the_memory():
    model = tiny_model()
    before = state(model)
    module = LMModule(model, phase="fast")
    fit(module, loader())
    after = state(model)
    memory = {"blocks.0.fwpkm.keys", "blocks.0.fwpkm.values", "blocks.0.fwpkm.read_counts"}
    assert same(before, after, [k for k in before if k not in memory])
    assert not torch.equal(before["blocks.0.fwpkm.values"], after["blocks.0.fwpkm.values"])
    assert module.position.step == 3 and module.position.segments_done == 6
    assert not any(p.requires_grad for p in model.parameters())


def test_finetune_trains_slow_weights_and_the_optimiser_holds_no_fast_weights():
    model = tiny_model()
    before = state(model)
    module = LMModule(model, phase="finetune", optim=OptimSettings(lr=1e-2))
    trainer = make_trainer(Placement(), [], logger=False, progress_bar=False)
    trainer.fit(module, train_dataloaders=loader())
    assert not torch.equal(before["blocks.1.attn.qkv.weight"], model.blocks[1].attn.qkv.weight)
    in_optimizer = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
    assert in_optimizer == {id(p) for p in model.parameters()}
    assert not {id(b) for b in model.buffers()} & in_optimizer
    assert module.optimizer_state is not None  # carried to the next experience's Trainer
    assert set(module.last_losses) >= {"lm", "total", "lr", "grad_norm"}


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    s = OptimSettings(lr=1.0, warmup_steps=4, decay_steps=14, min_lr_ratio=0.1)
    assert [s.lr_at(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert s.lr_at(14) == pytest.approx(0.1) and s.lr_at(100) == pytest.approx(0.1)
    assert s.lr_at(9) == pytest.approx(0.55)


@pytest.mark.parametrize("policy", ["frozen", "stream"])
def test_evaluation_leaves_the_model_bit_identical(policy):
    model = tiny_model()
    fit(LMModule(model, phase="fast"), loader())  # a memory that is not the initial one
    before = state(model)
    module = LMModule(model, phase="fast", memory_policy=get_memory_policy(policy), eval_domains=["a", "b"])
    make_trainer(Placement(), [], logger=False, progress_bar=False, shard_data=False).validate(
        module, dataloaders=[loader(4), loader(6)], verbose=False)
    assert same(before, state(model))
    assert all(layer.writes_enabled for layer in model.fwpkm_layers())
    manual = module.evaluate({"a": loader(4), "b": loader(6)})
    assert same(before, state(model))
    assert manual == module.last_eval and all(math.isfinite(v) for v in manual.values())


def test_stream_policy_reads_with_writes_and_frozen_without():
    model = tiny_model()
    frozen = LMModule(model, phase="fast", memory_policy=FrozenMemory()).evaluate({"a": loader(6)})
    stream = LMModule(model, phase="fast", memory_policy=StreamMemory()).evaluate({"a": loader(6)})
    assert frozen["a"] != stream["a"]


def test_per_token_loss_does_not_depend_on_the_batch_size():
    module = LMModule(tiny_model(), phase="fast")
    one = module.evaluate({"a": loader(6, batch_size=1)})["a"]
    three = module.evaluate({"a": loader(6, batch_size=3)})["a"]
    assert one == pytest.approx(three, rel=1e-6)
    # the mean over real tokens only: recompute it by hand (memory frozen, as the policy does)
    total, count = 0.0, 0
    module.model.set_writes(False)
    with torch.no_grad():
        for b in batches(6):
            logits = module.model(b["input_ids"][None])[0]
            keep = b["targets"] != -100
            total += float(torch.nn.functional.cross_entropy(logits[keep], b["targets"][keep], reduction="sum"))
            count += int(keep.sum())
    assert one == pytest.approx(total / count, rel=1e-5)


class Terms(Strategy):
    """Returns a named extra loss; NaN from step `nan_at` (1-based) on."""

    def __init__(self, nan_at=None):
        self.nan_at = nan_at
        self.calls = []

    def extra_losses(self, batch, outputs, ctx):
        self.calls.append(ctx.global_step)
        value = float("nan") if self.nan_at and ctx.global_step + 1 >= self.nan_at else 0.5
        return {"terms/penalty": outputs["lm_loss"] * 0 + value}


def with_ctx(module, mode):
    module.begin_experience(StrategyContext(model=module.model, experience=1, domain="a", mode=mode), label="a")
    return module


def test_strategy_terms_are_added_and_reported_by_name():
    strategy = Terms()
    module = with_ctx(LMModule(tiny_model(), phase="finetune", optim=OptimSettings(lr=1e-3), strategy=strategy), "finetune")
    fit(module, loader())
    assert strategy.calls == [0, 1, 2]
    assert module.last_losses["terms/penalty"] == 0.5
    assert module.last_losses["total"] == pytest.approx(module.last_losses["lm"] + 0.5)


def test_fast_mode_calls_no_loss_hooks():
    strategy = Terms()
    fit(with_ctx(LMModule(tiny_model(), phase="fast", strategy=strategy), "fast"), loader())
    assert strategy.calls == []


def test_non_finite_loss_stops_with_the_step():
    module = with_ctx(LMModule(tiny_model(), phase="finetune", optim=OptimSettings(lr=1e-3), strategy=Terms(nan_at=2)),
                      "finetune")
    with pytest.raises(NonFiniteLossError, match="step 2") as info:
        fit(module, loader())
    assert info.value.step == 2 and module.position.step == 1


def test_bf16_mixed_trains_close_to_float32_keeps_float32_weights_and_is_deterministic():
    runs = {}
    for precision in ("32-true", "bf16-mixed", "bf16-mixed"):
        model = tiny_model()
        module = LMModule(model, phase="finetune", optim=OptimSettings(lr=1e-2), precision=precision)
        fit(module, loader(12))
        evaluation = module.evaluate({"a": loader(4)})["a"]
        runs.setdefault(precision, []).append((state(model), evaluation, module.last_losses["lm"]))
    (w32, e32, l32), = runs["32-true"]
    (wa, ea, la), (wb, eb, lb) = runs["bf16-mixed"]
    assert same(wa, wb) and ea == eb and la == lb  # bfloat16 on CPU is deterministic too
    assert all(t.dtype in (torch.float32, torch.int64, torch.bool) for t in wa.values())
    assert ea != e32 and la != l32  # the setting does something ...
    assert abs(ea - e32) < 0.05 and abs(la - l32) < 0.05  # ... and changes the losses by little (~4.2 nats here)


def test_an_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="LMModule.precision must be one of"):
        LMModule(tiny_model(), phase="fast", precision="16-mixed")


class GradientRecorder(LMModule):
    """LMModule that keeps a copy of the gradients it clips (the step's summed gradient)."""

    def _clip_gradients(self) -> float:
        self.recorded = {name: p.grad.clone() for name, p in self.model.named_parameters() if p.grad is not None}
        return super()._clip_gradients()


def episodic_model(seed=0) -> FwPKMLM:
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=V, n_layer=2, d_model=32, n_head=2, fwpkm_layers=[0], window=8,
                      fwpkm=FwPKMConfig(num_subkeys=8, d_key=16, d_value=16))
    return FwPKMLM(cfg, WriteRule(chunk=8, persistence="reset_per_call"))


def one_batch(batch_size=4):
    rows = batches(batch_size, seed=5)
    for i, row in enumerate(rows):  # unequal target counts, so a plain mean of group losses is wrong
        row["targets"][: 2 * i] = -100
    return DataLoader(rows, batch_size=batch_size)


def test_sequences_per_forward_sums_the_gradients_of_each_sequence_with_its_own_memory():
    from cl_platform.lm_module import step_seed

    batch = next(iter(one_batch()))
    module = GradientRecorder(episodic_model(), phase="pretrain", optim=OptimSettings(lr=1e-3), seed=3,
                              sequences_per_forward=1)
    reference = episodic_model()  # the same initial weights
    fit(module, one_batch())
    # By hand: each sequence alone (a fresh memory each), its mean loss weighted by its share of
    # the batch's target tokens, in the order the step reads them (pSWA draws and memory
    # initialisations come from the step's seed).
    torch.manual_seed(step_seed(3, 0))
    reference.train()
    counts = (batch["targets"] != -100).sum(dim=1)
    total, expected_loss = 0, 0.0
    for i in range(4):
        _, loss = reference(batch["input_ids"][i:i + 1], batch["targets"][i:i + 1])
        share = float(counts[i]) / float(counts.sum())
        (loss * share).backward()
        expected_loss += float(loss.detach()) * share
    for name, p in reference.named_parameters():
        torch.testing.assert_close(module.recorded[name], p.grad, rtol=1e-5, atol=1e-7, msg=name)
    assert module.last_losses["lm"] == pytest.approx(expected_loss, rel=1e-6)
    # A shared memory gives another gradient: the groups really did read separate memories.
    whole = GradientRecorder(episodic_model(), phase="pretrain", optim=OptimSettings(lr=1e-3), seed=3)
    fit(whole, one_batch())
    assert not torch.allclose(whole.recorded["blocks.0.fwpkm.proj_v.weight"], module.recorded["blocks.0.fwpkm.proj_v.weight"])


def test_one_group_of_the_whole_batch_is_the_ordinary_step():
    plain = LMModule(episodic_model(), phase="pretrain", optim=OptimSettings(lr=1e-2), seed=1)
    grouped = LMModule(episodic_model(), phase="pretrain", optim=OptimSettings(lr=1e-2), seed=1, sequences_per_forward=4)
    fit(plain, one_batch())
    fit(grouped, one_batch())
    assert same(state(plain.model), state(grouped.model))
    assert grouped.last_losses["lm"] == plain.last_losses["lm"]


@pytest.mark.parametrize("kwargs, message", [
    ({"phase": "finetune", "optim": OptimSettings(lr=1e-3), "sequences_per_forward": 2}, "phase 'pretrain'"),
    ({"phase": "pretrain", "optim": OptimSettings(lr=1e-3), "sequences_per_forward": -1}, "sequences_per_forward"),
    ({"phase": "pretrain", "optim": OptimSettings(lr=1e-3), "sequences_per_forward": True}, "sequences_per_forward"),
])
def test_sequences_per_forward_is_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LMModule(tiny_model(), **kwargs)
