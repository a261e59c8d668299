"""Results of one run: the score matrix R plus the metadata needed to reproduce and compare it.

    R[t, j] = score on domain j after experience t        t = 0 .. T, j = 0 .. D-1

Row 0 is the score before any experience. Experience t (1-based) trains domain
`experiences[t - 1]`; a domain may recur (math → law → math). Every metric (forgetting, BWT,
FWT, plasticity) is derived from this matrix by `analysis.metrics`; only the matrix is stored.

A run killed part-way leaves the rows it never reached as NaN: rows are filled in order, so
after the first incomplete row every later row is entirely NaN.

This module imports numpy only, never torch: `analysis` reads results on machines without the
model stack.

JSON has no NaN or infinity, so a cell is written as a number, `null` (NaN: not measured) or the
string "inf" / "-inf" (a diverged loss is a result worth keeping).
"""

import json
import math
import os
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np

from cl_platform.atomic import atomic_write_text

SCHEMA_VERSION = 1

# 'fast': slow weights frozen, only fast-weight writes adapt (the FwPKM paper's protocol);
# 'finetune': the outer optimiser also trains slow weights.
Mode = Literal["fast", "finetune"]

# One curve: (global_step, value) points in step order.
Curve = list[tuple[int, float]]


class ResultsFormatError(ValueError):
    """A results object or file breaks the format; the message names the bad field."""


@dataclass(eq=False)
class ResultsMatrix:
    """R[t, j] with its row and column labels and the metric's orientation.

    `values` has shape (len(experiences) + 1, len(domains)); NaN marks a cell not measured.
    """

    domains: list[str]
    experiences: list[str]
    values: np.ndarray  # (T+1, D)
    metric: str = "loss"
    lower_is_better: bool = True

    def __post_init__(self) -> None:
        _check_names(self.domains, "domains")
        if len(set(self.domains)) != len(self.domains):
            raise ResultsFormatError(f"field 'domains' has duplicates: {self.domains}")
        if not isinstance(self.experiences, list):
            raise ResultsFormatError("field 'experiences' must be a list of domain names")
        for t, name in enumerate(self.experiences, start=1):
            if name not in self.domains:
                raise ResultsFormatError(
                    f"field 'experiences[{t - 1}]' (experience {t}) is {name!r}, "
                    f"not one of domains {self.domains}"
                )
        if not isinstance(self.metric, str) or not self.metric:
            raise ResultsFormatError("field 'metric' must be a non-empty string")
        if not isinstance(self.lower_is_better, bool):
            raise ResultsFormatError("field 'lower_is_better' must be a bool")
        shape = (len(self.experiences) + 1, len(self.domains))
        try:
            self.values = np.array(self.values, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise ResultsFormatError(f"field 'values' is not a numeric matrix: {err}") from None
        if self.values.shape != shape:
            raise ResultsFormatError(
                f"field 'values' has shape {self.values.shape}, expected {shape} "
                "(experiences + 1 rows, one column per domain)"
            )
        self._check_fill_order()

    def _check_fill_order(self) -> None:
        # Rows are measured in order, so a measured cell below an incomplete row means the
        # matrix was assembled wrongly (a row index off by one, a shuffled domain list).
        measured = ~np.isnan(self.values)
        complete = measured.all(axis=1)
        first_incomplete = int(np.argmin(complete)) if not complete.all() else len(complete)
        later = measured[first_incomplete + 1 :]
        if later.any():
            row = first_incomplete + 1 + int(np.argmax(later.any(axis=1)))
            raise ResultsFormatError(
                f"field 'values': row {row} has measurements but row {first_incomplete} "
                "is incomplete (rows are filled in order)"
            )

    @classmethod
    def empty(
        cls,
        domains: list[str],
        experiences: list[str],
        metric: str = "loss",
        lower_is_better: bool = True,
    ) -> "ResultsMatrix":
        """A matrix with nothing measured yet: every cell NaN, filled with `record`."""
        values = np.full((len(experiences) + 1, len(domains)), np.nan)
        return cls(list(domains), list(experiences), values, metric, lower_is_better)

    @property
    def num_experiences(self) -> int:
        return len(self.experiences)

    @property
    def last_complete_row(self) -> int:
        """Largest t such that rows 0..t are fully measured; -1 if row 0 is incomplete."""
        complete = ~np.isnan(self.values).any(axis=1)
        return len(complete) - 1 if complete.all() else int(np.argmin(complete)) - 1

    @property
    def is_complete(self) -> bool:
        return self.last_complete_row == self.num_experiences

    def trained_domain(self, t: int) -> str:
        """Domain trained by experience t (1-based): `experiences[t - 1]`."""
        if not 1 <= t <= self.num_experiences:
            raise IndexError(f"experience {t} out of range 1..{self.num_experiences}")
        return self.experiences[t - 1]

    def training_experiences(self, domain: str) -> list[int]:
        """The experiences (1-based) that train `domain`, in order; empty if never trained."""
        if domain not in self.domains:
            raise KeyError(f"unknown domain {domain!r}; domains are {self.domains}")
        return [t for t, name in enumerate(self.experiences, start=1) if name == domain]

    def record(self, t: int, domain: str, value: float) -> None:
        """Set R[t, domain] = value (t = 0 before any experience)."""
        if not 0 <= t <= self.num_experiences:
            raise IndexError(f"row {t} out of range 0..{self.num_experiences}")
        if domain not in self.domains:
            raise KeyError(f"unknown domain {domain!r}; domains are {self.domains}")
        if t > self.last_complete_row + 1:
            raise ValueError(f"cannot record row {t}: row {t - 1} is not complete yet")
        self.values[t, self.domains.index(domain)] = float(value)

    def to_dict(self) -> dict[str, Any]:
        return {
            "domains": list(self.domains),
            "experiences": list(self.experiences),
            "metric": self.metric,
            "lower_is_better": self.lower_is_better,
            "values": [[_encode_float(v) for v in row] for row in self.values.tolist()],
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "matrix") -> "ResultsMatrix":
        _require_mapping(data, where)
        for key in ("domains", "experiences", "metric", "lower_is_better", "values"):
            if key not in data:
                raise ResultsFormatError(f"missing field '{where}.{key}'")
        rows = data["values"]
        if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
            raise ResultsFormatError(f"field '{where}.values' must be a list of rows")
        width = len(rows[0]) if rows else 0
        for t, row in enumerate(rows):
            if len(row) != width:
                raise ResultsFormatError(
                    f"field '{where}.values[{t}]' has {len(row)} cells, row 0 has {width}"
                )
        values = np.array(
            [[_decode_float(v, f"{where}.values[{t}][{j}]") for j, v in enumerate(row)]
             for t, row in enumerate(rows)],
            dtype=np.float64,
        ).reshape(len(rows), width)
        try:
            return cls(
                domains=data["domains"],
                experiences=data["experiences"],
                values=values,
                metric=data["metric"],
                lower_is_better=data["lower_is_better"],
            )
        except ResultsFormatError as err:
            raise ResultsFormatError(f"in '{where}': {err}") from None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ResultsMatrix):
            return NotImplemented
        return (
            self.domains == other.domains
            and self.experiences == other.experiences
            and self.metric == other.metric
            and self.lower_is_better == other.lower_is_better
            and np.array_equal(self.values, other.values, equal_nan=True)
        )


@dataclass
class RunResults:
    """One run: its results matrix, what produced it, and per-domain evaluation curves.

    `curves[domain]` is that domain's evaluation score over training, as (global_step, value)
    points with non-decreasing steps (two points may share a step: an end-of-experience and a
    start-of-next evaluation).
    """

    matrix: ResultsMatrix
    config_hash: str
    seed: int
    mode: Mode
    memory_policy: str
    strategy: str
    versions: dict[str, str] = field(default_factory=dict)
    curves: dict[str, Curve] = field(default_factory=dict)
    # Per results row (as a string key: JSON) and domain, [Σ loss, tokens] of every document of
    # the evaluated split, so intervals can resample documents; R[t, j] = Σ loss / Σ tokens.
    doc_losses: dict[str, dict[str, list[list[float]]]] = field(default_factory=dict)
    # The run step at which each results row was measured (row 0 at 0, row t where experience t
    # ended): the experience boundaries on the curves' step axis.
    row_steps: dict[str, int] = field(default_factory=dict)
    # R with the fast memory put back to the base's before each row is read (row 0 is `matrix`'s):
    # what the slow weights hold without what the stream wrote into the memory (the consolidated
    # fraction, analysis.metrics). None in results written before it existed.
    memory_reset: ResultsMatrix | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.matrix, ResultsMatrix):
            raise ResultsFormatError("field 'matrix' must be a ResultsMatrix")
        if self.memory_reset is not None and (
                not isinstance(self.memory_reset, ResultsMatrix)
                or (self.memory_reset.domains, self.memory_reset.experiences)
                != (self.matrix.domains, self.matrix.experiences)):
            raise ResultsFormatError("field 'memory_reset' must be a matrix of the same domains and experiences "
                                     "as 'matrix'")
        for name in ("config_hash", "memory_policy", "strategy"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ResultsFormatError(f"field '{name}' must be a non-empty string")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ResultsFormatError(f"field 'seed' must be an int, got {self.seed!r}")
        if self.mode not in get_args(Mode):
            raise ResultsFormatError(
                f"field 'mode' is {self.mode!r}, expected one of {get_args(Mode)}"
            )
        if not isinstance(self.versions, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.versions.items()
        ):
            raise ResultsFormatError("field 'versions' must map package names to version strings")
        if not isinstance(self.curves, dict):
            raise ResultsFormatError("field 'curves' must map domain names to point lists")
        self.curves = {
            domain: self._checked_curve(domain, points) for domain, points in self.curves.items()
        }
        if not isinstance(self.doc_losses, dict) or not all(
            isinstance(row, dict) and all(isinstance(docs, list) for docs in row.values())
            for row in self.doc_losses.values()
        ):
            raise ResultsFormatError("field 'doc_losses' must map rows to {domain: [[loss sum, tokens], ...]}")
        if not isinstance(self.row_steps, dict) or not all(
            isinstance(k, str) and not isinstance(v, bool) and isinstance(v, int) and v >= 0
            for k, v in self.row_steps.items()
        ):
            raise ResultsFormatError("field 'row_steps' must map rows to run steps (ints >= 0)")

    def _checked_curve(self, domain: str, points: Any) -> Curve:
        where = f"curves[{domain!r}]"
        if domain not in self.matrix.domains:
            raise ResultsFormatError(f"field '{where}': not one of domains {self.matrix.domains}")
        if not isinstance(points, list):
            raise ResultsFormatError(f"field '{where}' must be a list of [step, value] points")
        curve: Curve = []
        for i, point in enumerate(points):
            if not isinstance(point, (list, tuple)) or len(point) != 2:
                raise ResultsFormatError(f"field '{where}[{i}]' must be a [step, value] pair")
            step, value = point
            if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                raise ResultsFormatError(f"field '{where}[{i}]': step must be an int >= 0")
            if curve and step < curve[-1][0]:
                raise ResultsFormatError(
                    f"field '{where}[{i}]': step {step} is before the previous step {curve[-1][0]}"
                )
            curve.append((step, _decode_float(value, f"{where}[{i}]")))
        return curve

    def add_point(self, domain: str, step: int, value: float) -> None:
        """Append (step, value) to `curves[domain]`, keeping the curve's invariants."""
        points = [*self.curves.get(domain, []), (step, float(value))]
        self.curves[domain] = self._checked_curve(domain, points)

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION,
            "config_hash": self.config_hash,
            "seed": self.seed,
            "mode": self.mode,
            "memory_policy": self.memory_policy,
            "strategy": self.strategy,
            "versions": dict(self.versions),
            "matrix": self.matrix.to_dict(),
            "curves": {
                domain: [[step, _encode_float(value)] for step, value in points]
                for domain, points in self.curves.items()
            },
            "doc_losses": self.doc_losses,
            "row_steps": self.row_steps,
            **({"memory_reset": self.memory_reset.to_dict()} if self.memory_reset is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: Any) -> "RunResults":
        _require_mapping(data, "<root>")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ResultsFormatError(
                f"field 'schema_version' is {version!r}, this code reads {SCHEMA_VERSION}"
            )
        keys = ("config_hash", "seed", "mode", "memory_policy", "strategy", "versions", "matrix")
        for key in keys:
            if key not in data:
                raise ResultsFormatError(f"missing field '{key}'")
        return cls(
            matrix=ResultsMatrix.from_dict(data["matrix"]),
            config_hash=data["config_hash"],
            seed=data["seed"],
            mode=data["mode"],
            memory_policy=data["memory_policy"],
            strategy=data["strategy"],
            versions=data["versions"],
            curves=data.get("curves", {}),
            doc_losses=data.get("doc_losses", {}),
            row_steps=data.get("row_steps", {}),
            memory_reset=(ResultsMatrix.from_dict(data["memory_reset"], "memory_reset")
                          if data.get("memory_reset") is not None else None),
        )

    def to_json(self, path: str | os.PathLike[str]) -> None:
        """Write atomically: a reader never sees a half-written file, even if the run dies."""
        path = Path(path)
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n")

    @classmethod
    def from_json(cls, path: str | os.PathLike[str]) -> "RunResults":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ResultsFormatError(f"{path}: not valid JSON ({err})") from None
        try:
            return cls.from_dict(data)
        except ResultsFormatError as err:
            raise ResultsFormatError(f"{path}: {err}") from None


def perplexity(loss: float) -> float:
    """exp(loss) per token; inf where exp would overflow (a diverged loss stays a finite result)."""
    return math.exp(loss) if loss < 700 else math.inf


def package_versions(
    names: tuple[str, ...] = ("torch", "lightning", "avalanche-lib", "numpy"),
) -> dict[str, str]:
    """Installed versions of `names` from package metadata (no imports); absent ones are omitted."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def _check_names(names: Any, where: str) -> None:
    if not isinstance(names, list) or not names:
        raise ResultsFormatError(f"field '{where}' must be a non-empty list of names")
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name:
            raise ResultsFormatError(f"field '{where}[{i}]' must be a non-empty string")


def _require_mapping(data: Any, where: str) -> None:
    if not isinstance(data, dict):
        raise ResultsFormatError(f"field '{where}' must be an object, got {type(data).__name__}")


def _encode_float(value: float) -> float | str | None:
    if math.isnan(value):
        return None
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def _decode_float(value: Any, where: str) -> float:
    if value is None:
        return math.nan
    if value in ("inf", "-inf"):
        return float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ResultsFormatError(f"field '{where}' must be a number, null or \"inf\"/\"-inf\"")
    return float(value)
