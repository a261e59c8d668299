"""Values several layers agree on, torch-free so that any of them may import this module (the
data in streams/ as well as the model and its configuration).

    IGNORE_INDEX   the target id the loss skips (padding, positions that are not scored)
    Precision      the forward passes' precision, a Literal; PRECISIONS its values
"""

from typing import Literal, get_args

IGNORE_INDEX = -100  # target id the loss skips (padding); F.cross_entropy's default

# "bf16-mixed": the slow weights' matrix multiplies run in bfloat16 under autocast (parameters,
# optimiser state, losses and the fast-weight memory stay float32); about 1.5x faster on CPUs with
# native bfloat16 (BENCHMARKS.md). "32-true": everything float32.
Precision = Literal["32-true", "bf16-mixed"]
PRECISIONS = get_args(Precision)
