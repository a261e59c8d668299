"""Device placement (issue 23), checked without a GPU, and the same checks on one where there is.

Stray tensors. The code that computes on the model's device — the LightningModule's steps and its
evaluations, and everything they call: the model, the FwPKM layer, the strategies' step hooks, the
memory recorder — runs here with torch's default device set to `meta` while the model and the data
stay on the CPU. A tensor made without `device=` then lands on meta, and the first operation that
mixes it with a real tensor fails, as it would on a GPU, where it would land on the host. (The
other way round — model and inputs on meta — cannot run this code: the layer's unique-slot writes
and every `float(loss)` need values.) Lightning's own logging is left on the host: it makes its
tensors from Python floats and moves them itself. The instrumentation changes no value: every
instrumented run equals an uninstrumented one bit for bit, and a planted stray tensor is caught.

Device-parametrized: the layer against a float64 CPU reference, the training step and one
continual-phase run, on `cpu` and on `cuda` where torch sees one (skipped elsewhere), and every
strategy composed on CUDA against the CPU, so the same suite checks a GPU machine (experiments/studies/device_check.sh).
"""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from cl_platform.check import ConfigError
from cl_platform.device import Placement, check_placement, launcher
from cl_platform.lm_module import LMModule
from cl_platform.memory.fwpkm import FwPKM, FwPKMConfig, WriteRule
from cl_platform.results import RunResults

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device")
AUTO = Placement("auto").resolved_accelerator()
DEVICES = ["cpu", pytest.param("cuda", marks=CUDA)]

# The LightningModule's methods that run on the model's device (training and evaluation).
DEVICE_SIDE = ("training_step", "validation_step", "on_validation_start", "on_validation_batch_start",
               "on_validation_epoch_end", "on_validation_end", "_token_losses")


def _on(device: str, fn):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with torch.device(device):
            return fn(*args, **kwargs)
    return wrapped


def instrument(monkeypatch) -> None:
    """From here on, the device-side methods make stray tensors on meta (Lightning's logging stays on the host)."""
    for name in DEVICE_SIDE:
        monkeypatch.setattr(LMModule, name, _on("meta", getattr(LMModule, name)))
    monkeypatch.setattr(LMModule, "log", _on("cpu", LMModule.log))


def quiet(_):
    pass


# Every strategy, composed: fast mode (replay's mixed batches and generated rows, slot freezing's write mask, slot
# transfer's slow bank, distillation) and finetune mode (EWC's penalty, LwF's teacher), with
# the memory recorder on.
FAST = [{"name": "replay", "kwargs": {"size": 6, "policy": "reservoir", "ratio": 0.5}},
        {"name": "slot_freezing", "kwargs": {"fraction": 0.1, "budget": 0.3}},
        {"name": "slot_transfer", "kwargs": {"fraction": 0.1, "budget": 0.3}},
        {"name": "distill", "kwargs": {"steps": 2, "batch_size": 2, "lr": 1e-3}},
        {"name": "generative_replay", "kwargs": {"samples": 2, "length": 8, "ratio": 0.5}}]
FINETUNE = [{"name": "ewc", "kwargs": {"lam": 1.0e3, "fisher_batches": 2, "batch_size": 2}},
            {"name": "lwf", "kwargs": {"alpha": 1.0}}]


def _results(tiny, tmp_path, name, mode, strategy, instrumented, accelerator="cpu"):
    """One continual run with every strategy of `mode` composed. The meta instrumentation keeps the
    model on the CPU (`accelerator` pinned, so a GPU machine runs the same check)."""
    from experiments.run import execute

    config = tiny.config(tmp_path / f"{name}.yaml", name=name, strategy=strategy,
                         cl={"mode": mode, "inspect": True, "accelerator": accelerator})
    folder, results, _ = execute(config, run_dir=tmp_path / ("meta" if instrumented else accelerator) / name,
                                 progress_bar=False, say=quiet)
    return results


@pytest.mark.parametrize("mode, strategy", [("fast", FAST), ("finetune", FINETUNE)], ids=["fast", "finetune"])
def test_device_side_code_makes_every_tensor_on_its_inputs_device(tiny, tiny_base, tmp_path, monkeypatch, mode, strategy):
    plain = _results(tiny, tmp_path, f"dev-{mode}", mode, strategy, instrumented=False)
    instrument(monkeypatch)
    meta = _results(tiny, tmp_path, f"dev-{mode}", mode, strategy, instrumented=True)
    assert meta.matrix.is_complete
    assert np.array_equal(plain.matrix.values, meta.matrix.values) and plain.curves == meta.curves


def test_a_tensor_made_without_device_is_caught(tiny, tiny_base, tmp_path, monkeypatch):
    # The check can fail: a layer that adds a tensor made on the default device.
    instrument(monkeypatch)
    forward = FwPKM.forward

    def stray(self, x):
        return forward(self, x) + torch.zeros(x.shape[-1])

    monkeypatch.setattr(FwPKM, "forward", stray)
    from experiments.run import execute

    config = tiny.config(tmp_path / "stray.yaml", name="stray", cl={"accelerator": "cpu"})
    with pytest.raises(RuntimeError, match="meta"):
        execute(config, run_dir=tmp_path / "stray", progress_bar=False, say=quiet)


def test_pretraining_device_side_code(tiny, tmp_path, monkeypatch):
    from experiments.base import resolve_base
    from experiments.setup import load_setup

    def base(root):
        setup = load_setup(tiny.config(tmp_path / "pre.yaml", runs_root=str(tmp_path / root)),
                           ["pretrain.steps=4", "pretrain.eval_every=2", "pretrain.checkpoint_every=2",
                            "pretrain.accelerator=cpu"])
        return resolve_base(setup, progress_bar=False, say=quiet, shipped=()).weights

    plain = base("plain")
    instrument(monkeypatch)
    meta = base("meta")
    assert plain.keys() == meta.keys() and all(torch.equal(plain[k], meta[k]) for k in plain)


# --- on each device ----------------------------------------------------------------------------


def _layer(seed=0):
    torch.manual_seed(seed)
    return FwPKM(32, FwPKMConfig(num_subkeys=16, d_key=16, d_value=16, topk=4), WriteRule(chunk=8))


@pytest.mark.parametrize("device", DEVICES)
def test_layer_on_device_matches_the_float64_reference(device):
    """Outputs, fast-weight states after the writes and gradients of the float32 layer on `device`
    against the same layer in float64 on the CPU (the issue's bar: 1e-4)."""
    ref, layer = _layer().double(), _layer().to(device)
    x64 = torch.randn(2, 40, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    w = torch.linspace(-1, 1, 32, dtype=torch.float64)
    out = {}
    for name, mod, x in (("ref", ref, x64.clone().requires_grad_()),
                         ("dev", layer, x64.float().to(device).requires_grad_())):
        mod.train()
        y = mod(x)
        (y * w.to(y)).sum().backward()
        out[name] = {"y": y.detach(), "dx": x.grad, "keys": mod.keys.detach(), "values": mod.values.detach(),
                     **{f"grad {n}": p.grad for n, p in mod.named_parameters()}}
    assert out["dev"]["y"].device.type == device
    for key, a in out["ref"].items():
        b = out["dev"][key].to("cpu", torch.float64)
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4, msg=key)
    assert not torch.equal(out["ref"]["values"], _layer().double().values)  # it wrote


@pytest.mark.parametrize("device", DEVICES)
def test_continual_run_on_device(tiny, tiny_base, tmp_path, device):
    """One finetune run (slow weights and memory trained) on `device`: on the CPU, an explicit
    `cpu` equals the default `auto` bit for bit (this machine's results are unchanged); on CUDA,
    the matrix agrees with the CPU's within float32 rounding."""
    from experiments.run import execute

    def matrix(accelerator):
        config = tiny.config(tmp_path / f"{accelerator}.yaml", name="on-device",
                             cl={"mode": "finetune", "accelerator": accelerator})
        _, results, _ = execute(config, run_dir=tmp_path / accelerator, progress_bar=False, say=quiet)
        return results.matrix.values

    if device == "cpu" and AUTO != "cpu":
        pytest.skip("`auto` is CUDA on this machine: the cuda case checks it")
    cpu = matrix("cpu")
    if device == "cpu":
        assert np.array_equal(cpu, matrix("auto"))
    else:
        assert np.allclose(cpu, matrix("gpu"), atol=1e-3, rtol=0)


@CUDA
@pytest.mark.parametrize("mode, strategy", [("fast", FAST), ("finetune", FINETUNE)], ids=["fast", "finetune"])
def test_every_strategy_on_cuda(tiny, tiny_base, tmp_path, mode, strategy):
    """Every strategy of `mode` composed, with the memory recorder, on CUDA against the same run on
    the CPU: the hooks between experiences run on the host and the steps on the device."""
    cpu = _results(tiny, tmp_path, f"all-{mode}", mode, strategy, instrumented=False, accelerator="cpu")
    gpu = _results(tiny, tmp_path, f"all-{mode}", mode, strategy, instrumented=False, accelerator="gpu")
    assert gpu.matrix.is_complete
    gap = float(np.abs(cpu.matrix.values - gpu.matrix.values).max())
    assert gap < 1e-2, f"largest |cpu - cuda| in the matrix: {gap:.2e}"


@pytest.mark.parametrize("device", DEVICES)
def test_training_step_on_device(tiny, tiny_base, device):
    """Three pretraining-phase steps through a real Trainer on `device` against the CPU's."""
    from torch.utils.data import DataLoader

    from cl_platform.lm_module import OptimSettings
    from cl_platform.trainer import make_trainer, quiet_lightning
    from experiments.setup import build_model

    quiet_lightning()
    rows = [tiny_base.setup.scenario[0].data.segments[i] for i in range(6)]

    def trained(accelerator):
        model = build_model(tiny_base.setup.model_config, 0)
        module = LMModule(model, phase="pretrain", optim=OptimSettings(lr=1e-3, warmup_steps=0, decay_steps=3), seed=0)
        make_trainer(Placement(accelerator), [], logger=False, progress_bar=False).fit(
            module, DataLoader(rows, batch_size=2))
        assert module.position.step == 3
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}

    if device == "cpu" and AUTO != "cpu":
        pytest.skip("`auto` is CUDA on this machine: the cuda case checks it")
    a = trained("cpu")
    b = trained("auto" if device == "cpu" else "gpu")
    start = build_model(tiny_base.setup.model_config, 0).state_dict()
    assert not torch.equal(a["lm_head.weight"], start["lm_head.weight"])
    for key in a:
        if device == "cpu":
            assert torch.equal(a[key], b[key]), key
        else:
            torch.testing.assert_close(b[key], a[key], atol=1e-4, rtol=1e-3, msg=key)


# --- placement refused before any work ----------------------------------------------------------


def _phase(**fields):
    from cl_platform.config import CLConfig

    return CLConfig(**{"mode": "finetune", **fields})


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_gpu_without_cuda_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match=r"'cl.accelerator': 'gpu', but torch sees no CUDA device"):
        check_placement(_phase(accelerator="gpu"), "cl")


def test_num_nodes_without_a_launcher_is_refused():
    with pytest.raises(ConfigError, match=r"'cl.num_nodes': 2 needs a multi-node launch.*torchrun.*SLURM_NTASKS"):
        check_placement(_phase(num_nodes=2), "cl", environ={})
    check_placement(_phase(num_nodes=2), "cl", environ={"TORCHELASTIC_RUN_ID": "x"})  # torchrun's environment
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "NODE_RANK": "1"}
    assert launcher(env) == "manual" and launcher({"SLURM_NTASKS": "2", "SLURM_PROCID": "0"}) == "slurm"


def test_placement_world_and_backend():
    assert Placement("cpu", 2, 3).world_size == 6 and Placement("cpu", 2).ddp_backend() == "gloo"
    assert Placement("auto").resolved_accelerator() == ("gpu" if torch.cuda.is_available() else "cpu")
