"""Where a phase runs and where its tensors live.

    check_placement(cfg.cl, "cl")          # accelerator=gpu without CUDA, num_nodes without a launcher:
                                           #   ConfigError naming the field, before any work
    make_trainer(..., placement=Placement.of(cfg.cl))   # cl_platform/trainer.py
    batch = to_device(batch, model_device(model))       # code outside Lightning's loops

A phase's `accelerator` (auto | cpu | gpu), `devices` and `num_nodes` go to Lightning's Trainer,
which picks the device, moves the model and the batches it loads, and launches the processes
(DDP: gloo on CPU, NCCL on CUDA). `auto` is CUDA where torch sees a GPU and the CPU elsewhere, so
a laptop's results are what they were before these fields existed.

Two rules keep the code device-agnostic, and tests/cl_platform/test_device.py enforces them:
- code that computes on the model's tensors creates new ones on *their* device (`device=x.device`,
  `new_zeros`, `zeros_like`), never on the default one;
- code that keeps state in host memory on purpose (replay's segment ids, the memory recorder's
  tables, analysis) says so with `device=HOST`, and copies what it reads from the device.
Evaluations that run in the middle of a fit (forgetting curves, pretraining's eval points) read
plain DataLoaders that Lightning does not move: `to_device` moves each batch to the model.

Lightning moves the model back to the CPU when a fit ends (`Strategy.teardown`), so strategy hooks
between experiences (slot transfer, distillation, EWC's Fisher) run on the host; the next fit moves
the model (fast weights included: they are buffers) to the device again, but not what a strategy
made there: state that the steps read (slot transfer's banks, EWC's Fisher and anchor) moves to
the reading tensor's device at its first use (found on an H200: test_every_strategy_on_cuda).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from cl_platform.check import ConfigError

HOST = torch.device("cpu")
ACCELERATORS = ("auto", "cpu", "gpu")

# What a multi-node launch leaves in each process's environment: torchrun / torchelastic, SLURM's
# srun, or the variables Lightning's own launcher reads (a manual launch, one per node).
LAUNCHERS = {
    "torchrun": ("TORCHELASTIC_RUN_ID",),
    "slurm": ("SLURM_NTASKS", "SLURM_PROCID"),
    "manual": ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK"),
}


@dataclass(frozen=True)
class Placement:
    """The Trainer arguments that say where a phase runs."""

    accelerator: str = "auto"
    devices: int = 1
    num_nodes: int = 1

    @classmethod
    def of(cls, phase_config: Any) -> "Placement":
        # Pretraining has no devices / num_nodes: it runs in one process.
        return cls(phase_config.accelerator, getattr(phase_config, "devices", 1), getattr(phase_config, "num_nodes", 1))

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes

    def resolved_accelerator(self) -> str:
        """"cpu" or "gpu": what `auto` means on this machine."""
        if self.accelerator == "auto":
            return "gpu" if torch.cuda.is_available() else "cpu"
        return self.accelerator

    def ddp_backend(self) -> str:
        return "nccl" if self.resolved_accelerator() == "gpu" else "gloo"


def launcher(environ: dict[str, str] | None = None) -> str | None:
    """The multi-node launcher this process was started by, if any."""
    env = os.environ if environ is None else environ
    for name, variables in LAUNCHERS.items():
        if all(v in env for v in variables):
            return name
    return None


def launch_rank(devices: int = 1, environ: dict[str, str] | None = None) -> int:
    """This process's global rank as its launcher set it, 0 outside a distributed launch: torchrun's
    RANK, SLURM's SLURM_PROCID, else NODE_RANK × devices + LOCAL_RANK (Lightning's own launcher,
    which sets LOCAL_RANK in the processes it starts; a node started by hand has NODE_RANK only).
    Lightning learns the rank when a Trainer sets up; code that runs before that (a resumed run's
    first messages, the run folder) asks here."""
    env = os.environ if environ is None else environ
    for variable in ("RANK", "SLURM_PROCID"):
        if variable in env:
            return int(env[variable])
    return int(env.get("NODE_RANK", "0")) * devices + int(env.get("LOCAL_RANK", "0"))


def check_placement(phase_config: Any, section: str, environ: dict[str, str] | None = None) -> None:
    """Refuse, naming the field, a placement this machine or this launch cannot give."""
    p = Placement.of(phase_config)
    if p.accelerator == "gpu":
        if not torch.cuda.is_available():
            raise ConfigError(f"run config field '{section}.accelerator': 'gpu', but torch sees no CUDA device "
                              f"on this machine (torch {torch.__version__}, built with CUDA "
                              f"{torch.version.cuda or 'none'}); use 'auto' or 'cpu'")
        if p.devices > torch.cuda.device_count():
            raise ConfigError(f"run config field '{section}.devices': {p.devices}, but this machine has "
                              f"{torch.cuda.device_count()} CUDA device(s)")
    if p.num_nodes > 1 and launcher(environ) is None:
        needs = "; ".join(f"{name}: {', '.join(v)}" for name, v in LAUNCHERS.items())
        raise ConfigError(f"run config field '{section}.num_nodes': {p.num_nodes} needs a multi-node launch, and "
                          f"this process has none of the launchers' environment ({needs}). Start one process per "
                          f"node with torchrun or srun (README: 'Several machines')")


def model_device(module: torch.nn.Module) -> torch.device:
    for p in module.parameters():
        return p.device
    return HOST


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """A batch (a mapping of tensors) on `device`; the same object when it is already there."""
    if all(v.device == device for v in batch.values()):
        return batch
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}
