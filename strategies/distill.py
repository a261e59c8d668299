"""Fast-to-slow consolidation by distillation: when an experience ends, chosen slow weights learn
to predict, without what the fast memory learned in that experience, what the model predicts with
it, on the experience's own segments; later domains may then overwrite the memory.

    strategy: {name: distill, kwargs: {params: mlp, steps: 20, batch_size: 4, lr: 1.0e-3, after: keep,
                                       retain: 1.0, anchors: 16, anchor_length: 512, inputs: adapt,
                                       rank: 0, hold: 0.0, slots: 0}}

- teacher: the model with its memory as the experience left it (writes off), and with its slow
  weights as the consolidation found them: a copy of the chosen weights (MBs) read through
  `torch.func.functional_call`. (Before stop 37 the dense and PKM paths read the live weights,
  so the teacher moved with the student: the objective could be met by making the memory's
  effect vanish, which is what the 1e-4 runs of stops 35–36 showed; experiments/LOG.md);
- student: the same model with its memory as the experience found it (snapshot at its start;
  writes off), so the slow weights must carry what the memory added;
- loss: per-token KL(teacher ‖ student) (`strategies.lwf.token_kl`, T = 1), `steps` AdamW steps
  (lazy Adam, `cl_platform.optim.MixedAdamW`, for a static PKM's sparse value rows) on
  `batch_size` inputs drawn per step, seeded; the teacher's logits are computed per step (holding
  them would take inputs × T × V floats);
- `inputs`: what the two models read — `adapt`, the experience's adapt segments (the segments the
  memory was written on, so the targets hold what it memorised of them as well as what it learned
  of the domain), or `samples`, `anchors` texts of `anchor_length` tokens that the teacher writes
  itself when the experience ends (`cl_platform/sample.py`, from `<|endoftext|>`; no segment is
  read twice, and the targets are the memory's predictions on text it has not stored);
- `params`: which slow weights learn — `mlp` (the dense MLPs), `pkm` (a static PKM's value rows),
  `all` (every slow parameter);
- `slots` (0 = every row the step reads; `params: pkm` only): consolidation into a static PKM by
  sparse memory finetuning — each step, only the `slots` value rows of each static PKM that the
  student's forward on the new-domain inputs reads most specifically learn (TF-IDF against a
  background of `anchors` texts of `anchor_length` tokens the model writes itself before the
  first experience: `strategies.sparse_memory.SlotChoice`, the paper's score); every other row
  and slow weight stays;
- `rank` (0 = a dense update): r > 0 makes the consolidation low-rank, as LoRA (Hu et al. 2021):
  each chosen matrix W (every 2-D weight of `params`; vectors such as biases stay as they are)
  learns W + B·A with A (r × in) drawn uniform in ±1/√in from a seeded generator and B (out × r)
  zero, so the student starts as the model; only A and B take the AdamW steps, and B·A is added
  into W when the consolidation ends (no adapter outlives it; the next experience draws fresh
  ones). Each consolidation moves a matrix by a rank ≤ r update instead of every direction
  (on the reference bases' dev split the two cut forgetting alike: experiments/LOG.md, stop 37);
- `after`: `keep` the memory as adapted, or `reset` it to the experience's starting state (the
  consolidated fast content is dropped; the slots are free for later domains);
- `hold` (0 = none): every step adds `hold` · KL(teacher ‖ student reading the memory as adapted),
  on the same inputs. Under `keep` the evaluation reads the consolidated slow weights *and* the
  memory that still holds the domain, so a student that learned what the memory adds counts it
  twice while the memory keeps it (stop 37: rank-8 distillation leaves math after experience 1
  above naive's). With the term the slow weights must add the memory's effect where it is gone
  and nothing where it is still there. It starts at 0 (the student is the teacher at step 1);
- `retain` (retention term, 0 = none): every step adds `retain` · KL(previous ‖ student) on
  `batch_size` of `anchors` texts of `anchor_length` tokens that the model writes itself, from
  `<|endoftext|>`, when the experience ends, with its memory as the experience found it
  (`cl_platform/sample.py`; no stream token is kept). "previous" is the slow weights as this
  consolidation found them, with that same memory: the student must learn the new domain without
  changing what the model said before it (LwF's anchor, Li & Hoiem 2017, on self-generated
  inputs as in pseudo-rehearsal). The previous weights' logits are recomputed per step
  (`torch.func.functional_call` with a copy of the chosen weights: MBs, where the logits of all
  anchors would take anchors × length × V floats; under `rank` the previous weights are the
  model's own, which the adapters leave untouched until they are added).

`fast` mode only (in `finetune` the slow weights learn anyway). The slow weights changed here are
saved with the model in every later checkpoint; the starting-state snapshot is the strategy's
state, so a run resumed mid-experience consolidates the same way.
"""

from __future__ import annotations

from typing import Any

import torch

from cl_platform.device import HOST, model_device
from cl_platform.memory.fwpkm import memory_from_state, memory_to_state
from cl_platform.optim import MixedAdamW
from cl_platform.sample import sample
from cl_platform.strategy import Strategy, StrategyContext
from strategies.lora import init_factors, target_matrices
from strategies.lwf import token_kl
from strategies.sparse_memory import SlotChoice

PARAMS = ("mlp", "pkm", "all")
AFTER = ("keep", "reset")
INPUTS = ("adapt", "samples")


def chosen_parameters(model, which: str) -> tuple[list, list]:
    """(dense, sparse) parameters that learn under `which`."""
    from cl_platform.memory.pkm import PKM
    from cl_platform.model import MLP

    if which == "mlp":
        dense = [p for m in model.modules() if isinstance(m, MLP) for p in m.parameters()]
        return dense, []
    if which == "pkm":
        return [], [m.values.weight for m in model.modules() if isinstance(m, PKM)]
    sparse = [m.values.weight for m in model.modules() if isinstance(m, PKM)]
    ids = {id(p) for p in sparse}
    return [p for p in model.parameters() if id(p) not in ids], sparse


class Distill(Strategy):
    def __init__(self, params: str = "mlp", steps: int = 20, batch_size: int = 4, lr: float = 1e-3,
                 after: str = "keep", retain: float = 0.0, anchors: int = 16, anchor_length: int = 512,
                 inputs: str = "adapt", rank: int = 0, hold: float = 0.0, slots: int = 0, seed: int = 0):
        if params not in PARAMS:
            raise ValueError(f"distill: params must be one of {PARAMS}, got {params!r}")
        if after not in AFTER:
            raise ValueError(f"distill: after must be one of {AFTER}, got {after!r}")
        if inputs not in INPUTS:
            raise ValueError(f"distill: inputs must be one of {INPUTS}, got {inputs!r}")
        for name, value in (("steps", steps), ("batch_size", batch_size), ("anchors", anchors),
                            ("anchor_length", anchor_length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"distill: {name} must be a positive int, got {value!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"distill: rank must be an int >= 0 (0: a dense update), got {rank!r}")
        if rank and params == "pkm":
            raise ValueError("distill: rank > 0 makes low-rank updates of dense matrices; params='pkm' "
                             "learns a static PKM's sparse value rows (use rank: 0 or params: mlp)")
        if not (isinstance(lr, (int, float)) and lr > 0):
            raise ValueError(f"distill: lr must be a number > 0, got {lr!r}")
        if isinstance(hold, bool) or not (isinstance(hold, (int, float)) and hold >= 0):
            raise ValueError(f"distill: hold must be a number >= 0 (the weight of the adapted-memory term), got {hold!r}")
        if isinstance(retain, bool) or not (isinstance(retain, (int, float)) and retain >= 0):
            raise ValueError(f"distill: retain must be a number >= 0 (the retention term's weight), got {retain!r}")
        self.params, self.steps, self.batch_size, self.lr, self.after, self.seed = params, steps, batch_size, float(lr), after, seed
        self.retain, self.anchors, self.anchor_length, self.inputs = float(retain), anchors, anchor_length, inputs
        self.rank, self.hold = rank, float(hold)
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 0:
            raise ValueError(f"distill: slots must be an int >= 0 (0: every row read), got {slots!r}")
        if slots and params != "pkm":
            raise ValueError(f"distill: slots chooses a static PKM's value rows; it needs params: pkm, got {params!r}")
        # the rows each step may move (None: every row it reads)
        self.choice = SlotChoice("distill", slots, "tfidf", anchors, anchor_length, seed) if slots else None
        self.held: list[list[float]] = []  # per consolidation: the adapted-memory KL at every step (hold > 0)
        self.before = None  # the memory as the current experience found it
        self.losses: list[list[float]] = []  # per consolidation: the new-domain KL at every step
        self.retained: list[list[float]] = []  # per consolidation: the retention KL at every step (retain > 0)
        # per consolidation: ‖Δθ‖ / ‖θ‖ over the weights it changed (a step too small to matter shows here)
        self.moved: list[float] = []

    @property
    def writes_texts(self) -> bool:
        """Whether a consolidation samples texts (anchors for the retention term, or its inputs,
        or the background the chosen rows are scored against)."""
        return self.retain > 0 or self.inputs == "samples" or self.choice is not None

    def check(self, model_config, mode, stream=None) -> None:
        if stream is not None and self.writes_texts:
            seq_len = list(stream)[0].data.segments.seq_len
            if self.anchor_length > seq_len:
                raise ValueError(f"distill: anchor_length {self.anchor_length} is longer than the stream's segments "
                                 f"({seq_len} tokens), the longest text the model was trained to read")
        if mode != "fast":
            raise ValueError("distill consolidates fast memory into frozen slow weights: 'fast' mode only "
                             "(in 'finetune' the slow weights learn anyway)")
        if not model_config.fwpkm_layers:
            raise ValueError("distill: the model has no FwPKM layer, so there is nothing to consolidate")
        if self.params == "pkm" and not model_config.pkm_layers:
            raise ValueError("distill: params='pkm' needs a static PKM layer (model.pkm_layers is empty); "
                             "use params: mlp or all")
        if self.params == "mlp" and len(model_config.pkm_layers) >= model_config.n_layer:
            raise ValueError("distill: params='mlp' needs an MLP, but every layer's MLP is a PKM; use params: pkm")
        if self.choice is not None:
            self.choice.check(model_config)

    def on_experience_start(self, ctx: StrategyContext) -> None:
        self.check(ctx.model.config, ctx.mode)
        self.before = ctx.model.snapshot_memory()
        if self.choice is not None and not self.choice.df:  # the base speaking, before any experience
            self.choice.count_background(ctx.model, ctx.require("current", "distill").data.segments.eot_id)

    def anchor_texts(self, model, experience: int, start: int) -> torch.Tensor:
        """(anchors, anchor_length + 1) the texts the model writes with its memory as the
        experience found it (the memory is put back as adapted)."""
        adapted = model.snapshot_memory()
        model.restore_memory(self.before)
        try:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + experience + 500_009)
            return sample(model, self.anchors, self.anchor_length, generator=g, start=start)
        finally:
            model.restore_memory(adapted)

    def teacher_texts(self, model, experience: int, start: int) -> list[dict]:
        """`anchors` texts of `anchor_length` tokens the model writes with its memory as adapted
        (the distillation inputs of `inputs: samples`), as segments."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + experience + 1_500_007)
        texts = sample(model, self.anchors, self.anchor_length, generator=g, start=start)
        return [{"input_ids": t[:-1], "targets": t[1:]} for t in texts]

    def adapters(self, model, experience: int, device) -> dict[str, tuple]:
        """{name: (W, A, B)} for every matrix of `params` (`strategies.lora.target_matrices`), with
        LoRA's starting factors drawn from a generator seeded by the experience."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + experience + 2_000_003)
        out = {}
        for name, w in target_matrices(model, self.params).items():
            a, b = init_factors(w.detach(), self.rank, g)
            out[name] = (w, a.to(device).requires_grad_(True), b.to(device).requires_grad_(True))
        if not out:
            raise ValueError(f"distill: params={self.params!r} has no matrix for a rank-{self.rank} update")
        return out

    def consolidate(self, model, segments, experience: int = 0, start: int = 0) -> list[float]:
        """Train the chosen slow weights on `segments` (a PackedSegments-like sequence of dicts;
        under `inputs: samples` the teacher's own texts replace them); returns the new-domain KL at
        every step (the retention KL goes to `self.retained`). The model's memory ends as `after`
        says. `start`: the token the self-written texts begin with."""
        dense, sparse = chosen_parameters(model, self.params)
        if not dense and not sparse:
            raise ValueError(f"distill: the model has no parameters for params={self.params!r}")
        adapted = model.snapshot_memory()
        if self.inputs == "samples":
            segments = self.teacher_texts(model, experience, start)
        device = model_device(model)
        if self.rank:
            # LoRA factors for every chosen matrix; the slow weights stay frozen until B·A is added
            adapters = self.adapters(model, experience, device)
            trainable, opts = [], [torch.optim.AdamW([t for _, a, b in adapters.values() for t in (a, b)],
                                                     lr=self.lr, weight_decay=0.0)]

            def student(x):
                merged = {n: w + b @ a for n, (w, a, b) in adapters.items()}
                return torch.func.functional_call(model, merged, (x,), strict=False)
        else:
            trainable = dense + sparse
            # A static PKM's value rows take lazy Adam at `lr`, as sparse memory finetuning does. Not
            # SGD: a row's KL gradient is ~1e-5 of its norm (a top-32 softmax over 4 heads, averaged
            # over 8,192 tokens), so SGD at 100 x lr moved rows by 1e-6 to 1e-4 a step and did nothing
            # (experiments/LOG.md, stop 42); lazy Adam steps every read row by about lr per entry.
            opts = ([torch.optim.AdamW(dense, lr=self.lr, weight_decay=0.0)] if dense else []) + \
                   ([MixedAdamW(sparse, lr=self.lr, weight_decay=0.0, sparse=True)] if sparse else [])
            student = model
        # The slow weights as this consolidation found them: the teacher's and the retention
        # anchor's. Under `rank` the model's own weights stay so until B·A is added.
        ids = {id(p) for p in trainable}
        found = {n: p.detach().clone() for n, p in model.named_parameters() if id(p) in ids}

        def as_found(x):
            return model(x) if self.rank else torch.func.functional_call(model, found, (x,), strict=False)

        if self.retain > 0:
            texts = self.anchor_texts(model, experience, start).to(device)
            # its own generator: the new-domain draws are those of retain = 0
            g_anchor = torch.Generator().manual_seed(self.seed * 1_000_003 + experience + 1_000_033)
        retained, held = [], []
        flags = [p.requires_grad for p in trainable]
        for p in trainable:
            p.requires_grad_(True)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + experience)
        was_training = model.training
        model.eval()
        model.set_writes(False)
        losses = []
        try:
            for _ in range(self.steps):
                pick = torch.randint(0, len(segments), (min(self.batch_size, len(segments)),), generator=g,
                                     device=HOST)
                rows = [segments[int(i)] for i in pick]
                x = torch.stack([r["input_ids"] for r in rows]).to(device)
                y = torch.stack([r["targets"] for r in rows]).to(device)
                model.restore_memory(adapted)
                with torch.no_grad():
                    teacher = as_found(x)
                for opt in opts:
                    opt.zero_grad(set_to_none=True)
                if self.hold > 0:  # the student with the memory as adapted must stay the teacher
                    still = token_kl(teacher, student(x), y, 1.0)
                    # its backward now: restoring the other memory below rewrites, in place, the
                    # buffers this graph read
                    (self.hold * still).backward()
                    held.append(float(still.detach()))
                model.restore_memory(self.before)
                if self.choice is not None:
                    self.choice.record(model, True)
                loss = token_kl(teacher, student(x), y, 1.0)
                if self.choice is not None:  # the rows this new-domain forward read most specifically
                    chosen = self.choice.choose(model)
                    self.choice.record(model, False)
                total = loss
                if self.retain > 0:
                    pick = torch.randint(0, len(texts), (min(self.batch_size, len(texts)),), generator=g_anchor,
                                         device=HOST)
                    a = texts[pick.to(device)]
                    xa, ya = a[:, :-1], a[:, 1:]
                    with torch.no_grad():  # the memory is still as the experience found it
                        anchor = as_found(xa)
                    kept = token_kl(anchor, student(xa), ya, 1.0)
                    total = total + self.retain * kept
                    retained.append(float(kept.detach()))
                total.backward()
                if self.choice is not None:
                    self.choice.mask(model, chosen)
                for opt in opts:
                    opt.step()
                losses.append(float(loss.detach()))
            with torch.no_grad():
                if self.rank:
                    change = sum(float((b @ a).square().sum()) for _, a, b in adapters.values())
                    size = sum(float(w.square().sum()) for w, _, _ in adapters.values())
                    for w, a, b in adapters.values():
                        w.add_(b @ a)
                else:
                    named = dict(model.named_parameters())
                    change = sum(float((named[n] - p).square().sum()) for n, p in found.items())
                    size = sum(float(p.square().sum()) for p in found.values())
                self.moved.append((change / size) ** 0.5 if size > 0 else 0.0)
        finally:
            if self.choice is not None:
                self.choice.record(model, False)
            for p, flag in zip(trainable, flags):
                p.requires_grad_(flag)
                p.grad = None
            model.set_writes(True)
            model.train(was_training)
            model.restore_memory(adapted if self.after == "keep" else self.before)
        if self.retain > 0:
            self.retained.append(retained)
        if self.hold > 0:
            self.held.append(held)
        return losses

    def on_experience_end(self, ctx: StrategyContext) -> None:
        segments = ctx.require("current", "distill").data.segments
        # the stream's <|endoftext|>: self-written texts begin as documents do
        start = segments.eot_id if self.writes_texts else 0
        self.losses.append(self.consolidate(ctx.model, segments, ctx.experience, start))
        self.before = None

    def summary(self) -> dict[str, Any]:
        out = {"distill_kl_first_last": [[ls[0], ls[-1]] for ls in self.losses if ls],
               "relative_change": list(self.moved)}
        if self.retain > 0:
            out["retention_kl_first_last"] = [[ls[0], ls[-1]] for ls in self.retained if ls]
        if self.hold > 0:
            out["held_kl_first_last"] = [[ls[0], ls[-1]] for ls in self.held if ls]
        return out

    def state_dict(self) -> dict[str, Any]:
        out = {"before": memory_to_state(self.before), "losses": [list(ls) for ls in self.losses],
               "retained": [list(ls) for ls in self.retained], "held": [list(ls) for ls in self.held],
               "moved": list(self.moved)}
        if self.choice is not None:
            out["background"] = self.choice.state_dict()
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # checkpoints written before `hold` existed have no "held", before stop 42 no "moved";
        # "background" is there with `slots`
        want = {"before", "losses", "retained", "held", "moved"} | ({"background"} if self.choice is not None else set())
        older = [want - {"moved"}] + ([{"before", "losses", "retained"}] if self.choice is None else [])
        if set(state) != want and set(state) not in older:
            raise ValueError(f"distill: state has keys {sorted(state)}, expected {sorted(want)}")
        if self.choice is not None:
            self.choice.load_state_dict(state["background"])
        self.before = memory_from_state(state["before"])
        self.losses = [list(ls) for ls in state["losses"]]
        self.retained = [list(ls) for ls in state["retained"]]
        self.held = [list(ls) for ls in state.get("held", [])]
        self.moved = [float(v) for v in state.get("moved", [])]
