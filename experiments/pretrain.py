"""`clp pretrain CONFIG [key=value ...]`: train the base model of a run config once; later runs reuse it.

    clp pretrain experiments/configs/default.yaml
    clp pretrain experiments/configs/default.yaml pretrain.steps=600
    clp pretrain experiments/configs/default.yaml --reuse-stale-base   # keep a base built by other code

The base lives in `<runs_root>/pretrain-<key>/` (base.ckpt, pretrain.json with the loss curves and
the unigram baseline, tensorboard/); `experiments/base.py` finds or builds it, `experiments/setup.py`
says what its key covers. `clp run` reuses a base whose key matches and says so.
"""

from __future__ import annotations

from typing import Sequence

from experiments.base import resolve_base
from experiments.setup import load_setup


def report(record: dict) -> str:
    """Per-domain table of the pretrained base against the unigram baseline, and the loss curve."""
    lines = [f"{'domain':<10} {'unigram':>9} {'base':>9}"]
    for name, uni in record["unigram"].items():
        lines.append(f"{name:<10} {uni:>9.3f} {record['final_eval'][name]:>9.3f}")
    lines.append(f"{'mean':<10} {record['unigram_mean']:>9.3f} {record['final_eval_mean']:>9.3f}")
    curve = record["loss_curve"]
    if curve:
        marks = sorted({0, len(curve) // 4, len(curve) // 2, 3 * len(curve) // 4, len(curve) - 1})
        lines.append("training loss: " + ", ".join(f"step {curve[i][0]}: {curve[i][1]:.3f}" for i in marks))
    return "\n".join(lines)


def main(config: str, overrides: Sequence[str] = (), reuse_stale_base: bool = False) -> int:
    setup = load_setup(config, overrides)
    base = resolve_base(setup, reuse_stale=reuse_stale_base)
    print(report(base.record))
    print(f"TensorBoard: tensorboard --logdir {base.path.parent / 'tensorboard'}")
    return 0
