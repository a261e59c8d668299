"""How a domain's loss moves *during* its own experience: the adaptation gain along the forgetting
curve, against the adapt tokens streamed so far (issue 9: "how much of a domain's gain is reached
after how many adapt tokens"). Pure functions of a run's results (numpy only).

A curve point is a domain's loss on its first `cl.curve_segments` evaluation segments at a run step
(`RunResults.curves`); `RunResults.row_steps` says where each experience started and ended. For
experience t on domain d:

    gain_t(s) = C_d(0) - C_d(s)       s = the run steps of experience t (loss: positive = better)

against the domain's first curve point C_d(0), taken before any experience on the same segments
(the curve's own row 0; the results matrix uses the full split, so its gains differ slightly).
"""

from __future__ import annotations

from cl_platform.results import RunResults


def gain_curve(results: RunResults, t: int) -> list[tuple[int, float]]:
    """[(steps into experience t, gain on its own domain)], from its first step (gain before the
    experience: what earlier experiences left) to its last."""
    experiences = results.matrix.experiences
    if not 1 <= t <= len(experiences):
        raise ValueError(f"experience {t} is not in 1..{len(experiences)}")
    for row in (t - 1, t):
        if str(row) not in results.row_steps:
            raise ValueError(f"row {row} has no recorded step (row_steps): the run did not reach it, "
                             f"or was written before rows recorded their steps")
    start, end = results.row_steps[str(t - 1)], results.row_steps[str(t)]
    domain = experiences[t - 1]
    points = results.curves.get(domain) or []
    if not points or points[0][0] != 0:
        raise ValueError(f"domain {domain!r} has no curve point at step 0")
    sign = 1.0 if results.matrix.lower_is_better else -1.0
    reference = points[0][1]
    inside: dict[int, float] = {}
    for step, value in points:
        if start <= step <= end:
            inside.setdefault(step - start, sign * (reference - value))  # first point of a shared step
    return sorted(inside.items())


def fraction_reached(curve: list[tuple[int, float]], fractions=(0.5, 0.9)) -> dict[float, int | None]:
    """Steps into the experience after which the gain first reaches each fraction of its final
    value (the last point); None when the final gain is not positive (nothing to reach)."""
    final = curve[-1][1]
    out: dict[float, int | None] = {}
    for f in fractions:
        out[f] = next((s for s, g in curve if g >= f * final), None) if final > 0 else None
    return out
