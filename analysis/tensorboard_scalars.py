"""A run's TensorBoard scalars, read back from its event files the way TensorBoard reads them.

    scalars = read_scalars(run_folder / "tensorboard")     # {"fwpkm/fwpkm1/coverage": [(step, value), ...]}

TensorBoard's own EventAccumulator does the reading, so the values (float32, as logged) and the
discarding of points a killed run logged after its last checkpoint (`mark_restart` in
cl_platform/callbacks.py) are exactly what the TensorBoard UI shows. The tensorboard package needs
no torch.
"""

from __future__ import annotations

from pathlib import Path


def read_scalars(folder: Path, prefix: str = "") -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag starting with `prefix`, as (step, value) points in logged order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)]
            for tag in acc.Tags()["scalars"] if tag.startswith(prefix)}
