"""A base model's checkpoint, opened and judged in one call: whose code built it, and whether this
code computes the same function with its weights.

    base = open_base(path, model_config, rule)   # load, code check, and the probe if other code built it
    base.usable                                  # built by this code, or its probe reproduces
    base.entry()                                 # what run.json says about it

A base records the per-file hashes of the code that built it (`cl_platform.provenance.BASE_CODE`).
One built by other code is still this base when this code reproduces its probe
(`cl_platform.probe`: three losses in float64, within 1e-4 nats). Which base a run uses — given,
cached, shipped, pretrained now — is decided in one place, `experiments/base.py: resolve_base`;
this module only answers its questions about one file at a time.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cl_platform.checkpoint import CheckpointError, load_checkpoint
from cl_platform.probe import PROBE_FILE, TOLERANCE, probe_difference
from cl_platform.provenance import base_code, changed_modules

REUSE_FLAG = "--reuse-stale-base"


@dataclass
class BaseFile:
    """One base checkpoint as this code sees it."""

    path: Path
    key: str | None  # its pretraining key (None: a file made by other tools)
    weights: dict = field(repr=False)
    record: dict  # its pretraining record (pretrain.json's content)
    change: str | None  # None: built by this code; otherwise what built it, in words
    probe_difference: float | None = None  # max |Δ| of its probe under this code (measured only when `change`)
    how: str = ""  # how the run got it: "given", "cached" (shipped too) or "pretrained"

    @property
    def same_function(self) -> bool:
        return self.probe_difference is not None and self.probe_difference <= TOLERANCE

    @property
    def usable(self) -> bool:
        """Built by this code, or by other code that computes the same function with it."""
        return self.change is None or self.same_function

    def entry(self) -> dict[str, Any]:
        """What run.json says about the base a run started from."""
        changed = changed_modules(self.record.get("code"), base_code())
        code = self.record.get("code") if isinstance(self.record.get("code"), dict) else {}
        return {
            "path": str(self.path),
            "how": self.how,
            "key": self.record.get("key"),
            "code": code.get("combined"),  # None: made before bases recorded their code
            # A base built by other code is only ever used when asked for (--reuse-stale-base).
            "reused_stale": changed != [] and not self.same_function,
            "changed_modules": changed if changed is not None else "unknown",
            "pretraining_seconds": self.record.get("seconds"),
            "probe_difference": self.probe_difference,
        }

    def note(self) -> str:
        """Why a base built by other code is used, in plain words ('' for one built by this code)."""
        if self.change is None:
            return ""
        if self.same_function:
            changed = changed_modules(self.record.get("code"), base_code())
            since = ("it was made before bases recorded their code" if changed is None else
                     f"the code has changed in {len(changed)} file{'' if len(changed) == 1 else 's'} since it was built")
            tolerance = f"{TOLERANCE:.0e}".replace("e-0", "e-")  # 1e-4
            return f"{since}, and this code computes the same function with it: its probe reproduces within {tolerance} nats"
        return f"built by {self.change}, used anyway ({REUSE_FLAG})"

    def refusal(self) -> str:
        """Why a base built by other code is not this base: its probe, in words."""
        if self.probe_difference is None:
            return f"it has no {PROBE_FILE} beside it to check"
        return f"its probe ({self.path.parent / PROBE_FILE}) differs by {self.probe_difference:.3g} nats under this code"



def open_base(path: str | Path, model_config: Any, rule: Any) -> BaseFile:
    """Read a base checkpoint for this architecture (CheckpointError naming the file otherwise);
    one built by other code gets its probe measured under this code."""
    path = Path(path)
    data = load_checkpoint(path, "base", model_config)
    record = data.get("record") if isinstance(data.get("record"), dict) else {}
    base = BaseFile(path, data.get("key"), data["model"], record, code_change(record))
    if base.change is not None:
        try:
            check_loads(path, base.weights, model_config, rule)
        except CheckpointError:
            return base  # weights this model cannot load: no probe can vouch for them
        base.probe_difference = probe_difference(path.parent, base.weights, model_config, rule)
    return base


def code_change(record: dict) -> str | None:
    """None when the base's recorded code is the running code; otherwise what built it, in words."""
    changed = changed_modules(record.get("code"), base_code())
    if changed is None:
        return "unknown code (its record has no code fingerprint: it was made before bases recorded one)"
    if not changed:
        return None
    return f"other code ({', '.join(changed)} differ{'s' if len(changed) == 1 else ''})"


def check_loads(path: Path, weights: dict, model_config: Any, rule: Any) -> None:
    """A base's weights must fit this version's model exactly (names and shapes); torch's own
    error would come later, after the run folder is made."""
    from cl_platform.model import FwPKMLM

    try:
        FwPKMLM(model_config, rule).load_state_dict(weights)
    except (RuntimeError, KeyError, TypeError) as err:
        detail = " ".join(str(err).split())[:300]
        raise CheckpointError(f"checkpoint {path} holds weights this version of cl-platform cannot load "
                              f"into the model (saved by an incompatible version?): {detail}") from None


def contradictions(recorded: Any, pretrain: Any) -> list[str]:
    """Where the run's `pretrain` section (a PretrainConfig) differs from a base's recorded
    settings, one phrase a field; how progress was reported and where it ran are not compared
    (they do not change a base), nor fields the record lacks (made by an older version)."""
    from cl_platform.config import PretrainConfig

    if not isinstance(recorded, dict):
        return []
    ours = dataclasses.asdict(pretrain)
    skip = PretrainConfig.REPORTING + PretrainConfig.PLACEMENT
    return [f"pretrain.{k} is {json.dumps(recorded[k], sort_keys=True)} in the base, "
            f"{json.dumps(v, sort_keys=True)} in this run"
            for k, v in ours.items() if k not in skip and k in recorded and recorded[k] != v]


def move_aside(out: Path, record: dict) -> Path:
    """Rename a stale base folder so that its key's folder is free for the rebuild; nothing is deleted."""
    code = record.get("code") if isinstance(record.get("code"), dict) else {}
    stem = f"{out.name}.stale-{str(code.get('combined', 'unknown'))[:12]}"
    aside, n = out.with_name(stem), 1
    while aside.exists():
        n += 1
        aside = out.with_name(f"{stem}-{n}")
    out.rename(aside)
    return aside


def describe(record: dict) -> str:
    """One line: final eval loss vs the unigram baseline, steps and time."""
    loss, uni = record.get("final_eval_mean", math.nan), record.get("unigram_mean", math.nan)
    return (f"eval loss {loss:.3f} (ppl {math.exp(loss):.1f}) vs unigram {uni:.3f} (ppl {math.exp(uni):.1f}); "
            f"{record.get('steps', 0)} steps, {record.get('tokens', 0):,} tokens, {record.get('seconds', 0.0):.0f} s")
