"""Decoder-only language model with fast-weight (FwPKM) and static (PKM) product-key memories.

    config = dataclasses.replace(ModelConfig.from_preset("small"), vocab_size=tokenizer.vocab_size)
    model = FwPKMLM(config, rule=WriteRule(chunk=128))    # every FwPKM layer writes by this rule
    logits, loss = model(idx, targets)                    # targets use IGNORE_INDEX for padding
    model.set_write_rules(WriteRule(lr_values=0.5), {"fwpkm3": WriteRule(lr_values=0.1)})

Block l (docs/fwpkm.md, "The model around it"):

    h = h + FwPKM(h)                     only if l in fwpkm_layers, before the token mixer
    h = h + Attention(RMSNorm(h))        causal, RoPE, sliding window or full; with `conv_kernel`
                                         a short causal convolution on its q, k, v (below)
    h = h + MLP(RMSNorm(h))              or h = h + PKM(h) if l in pkm_layers (PKM norms its input)

then a final RMSNorm and logits through the tied embedding. The paper's backbone is Gated DeltaNet
(GDN) or GDN+SWA; this platform uses softmax attention only: sliding-window (`mixer="swa"`,
`window` tokens) or full attention trained as sliding-window with probability `pswa_prob`
("pSWA", `mixer="full"`), so that the model does not learn to ignore the memory.

`conv_kernel: K` (0: off, every preset) adds the short causal convolution of GDN's token mixer
(kernel 4 there) to attention: depthwise over the q, k, v projections, each position mixing its
own and the K − 1 previous positions' projections, so a token's query, key and value carry the few
tokens before it (a multi-token ID before " is") without attention having to learn to gather
them. Residual (`x + conv(x)`), no activation: the attention still sees every token's own
projection, whatever the conv's initial weights.

`ModelConfig` is the architecture only. How the FwPKM layers write (`WriteRule`: learning rates,
chunk, look-ahead, persistence) is a setting of the phase, given to the model and changeable
between phases (`set_write_rules`).

Shape letters: B batch, T time, V vocabulary, d model width, nh attention heads, hd head width.
"""

import functools
import math
from dataclasses import dataclass, field
from typing import Literal, Sequence, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cl_platform.check import ConfigError, check, is_int, is_number
from cl_platform.constants import IGNORE_INDEX
from cl_platform.memory.fwpkm import FastWeightState, FwPKM, FwPKMConfig, WriteRule
from cl_platform.memory.norm import RMSNorm
from cl_platform.memory.pkm import PKM, PKMConfig

Mixer = Literal["swa", "full"]


@dataclass
class ModelConfig:
    """The language model's architecture. Field defaults are the `small` (CPU) preset;
    `ModelConfig.from_preset` gives the others."""

    preset: str = "small"  # the name in PRESETS the defaults came from
    vocab_size: int | None = None  # None until set from the tokenizer
    n_layer: int = 4
    d_model: int = 256
    n_head: int = 4
    mlp_ratio: float = 4.0  # MLP hidden width = mlp_ratio · d_model
    mixer: Mixer = "swa"
    window: int = 128  # attention window in tokens, self included (paper 512)
    pswa_prob: float = 0.9  # mixer="full" only: probability a layer trains as sliding-window
    fwpkm_layers: list[int] = field(default_factory=lambda: [1, 3])
    fwpkm: FwPKMConfig = field(default_factory=FwPKMConfig)
    pkm_layers: list[int] = field(default_factory=list)
    pkm: PKMConfig = field(default_factory=PKMConfig)
    dropout: float = 0.0
    rope_base: float = 10000.0
    conv_kernel: int = 0  # short causal conv on attention's q, k, v (kernel 4 in GDN); 0: off

    def __post_init__(self):
        check(self.preset in PRESETS, self, "preset", f"must be one of {sorted(PRESETS)}")
        check(self.vocab_size is None or is_int(self.vocab_size, 1), self, "vocab_size",
              "must be a positive int (or None until the tokenizer sets it)")
        for name in ("n_layer", "d_model", "n_head"):
            check(is_int(getattr(self, name), 1), self, name, "must be a positive int")
        check(self.d_model % self.n_head == 0, self, "d_model", f"must be divisible by n_head={self.n_head}")
        check((self.d_model // self.n_head) % 2 == 0, self, "d_model",
              f"d_model / n_head = {self.d_model // self.n_head} must be even (RoPE rotates pairs of features)")
        check(is_number(self.mlp_ratio, 0, strict=True), self, "mlp_ratio", "must be a number > 0")
        check(self.mixer in get_args(Mixer), self, "mixer", f"must be one of {get_args(Mixer)}")
        check(is_int(self.window, 1), self, "window", "must be a positive int")
        check(is_number(self.pswa_prob, 0) and self.pswa_prob <= 1, self, "pswa_prob", "must be in [0, 1]")
        check(is_number(self.dropout, 0) and self.dropout < 1, self, "dropout", "must be in [0, 1)")
        check(is_number(self.rope_base, 0, strict=True), self, "rope_base", "must be a number > 0")
        check(is_int(self.conv_kernel, 0) and self.conv_kernel != 1, self, "conv_kernel",
              "must be 0 (off) or an int >= 2 (a kernel of 1 mixes no positions)")
        check(isinstance(self.fwpkm, FwPKMConfig), self, "fwpkm", "must be a FwPKMConfig")
        check(isinstance(self.pkm, PKMConfig), self, "pkm", "must be a PKMConfig")
        for name in ("fwpkm_layers", "pkm_layers"):
            layers = getattr(self, name)
            check(isinstance(layers, (list, tuple)) and all(is_int(i) for i in layers), self, name,
                  "must be a list of ints")
            bad = [i for i in layers if not 0 <= i < self.n_layer]
            check(not bad, self, name, f"layer index {bad[0] if bad else None} out of range; allowed 0..{self.n_layer - 1}")
            check(len(set(layers)) == len(layers), self, name, "has a repeated layer index")
        # The design places the episodic (FwPKM) and semantic (PKM) memories in different
        # layers; one layer holding both is an experiment nobody has asked for yet.
        both = sorted(set(self.fwpkm_layers) & set(self.pkm_layers))
        check(not both, self, "pkm_layers", f"overlaps fwpkm_layers at layer(s) {both}; a layer holds at most one memory")

    @classmethod
    def from_preset(cls, name: str) -> "ModelConfig":
        """The named preset's configuration, with `preset=name`.

        small:     4 × 256, SWA window 128, FwPKM at 1 and 3 (S=128, d_k=d_v=128, top-8);
        paper:     12 × 768, SWA window 512, FwPKM at 2, 6, 10 (S=512, d_k=d_v=512, top-8);
        paper_pkm: as paper with FwPKM at 2, 10 and a static PKM at 6 (S=512, 4 heads × top-32,
                   d_k=512, d_v=768), the paper's best combination.
        The paper also writes every 512 tokens; that chunk is part of the write rule, not of the
        architecture, so it is set with the phase (`pretrain.fwpkm.chunk: 512`), not here.
        """
        if name not in PRESETS:
            raise ConfigError(f"ModelConfig.from_preset: unknown preset {name!r}; valid presets are {sorted(PRESETS)}",
                              field="preset", value=name, why=f"must be one of {sorted(PRESETS)}", owner="ModelConfig")
        return cls(preset=name, **PRESETS[name]())


def _paper() -> dict:
    return dict(
        n_layer=12,
        d_model=768,
        n_head=12,
        window=512,
        fwpkm_layers=[2, 6, 10],
        fwpkm=FwPKMConfig(num_subkeys=512, d_key=512, d_value=512),
        pkm=PKMConfig(num_subkeys=512, d_key=512, d_value=768),
    )


# name -> the ModelConfig fields that differ from the defaults
PRESETS = {
    "small": dict,  # the field defaults
    "paper": _paper,  # docs/fwpkm.md Defaults, FwPKM at 2, 6, 10
    "paper_pkm": lambda: {**_paper(), "fwpkm_layers": [2, 10], "pkm_layers": [6]},  # the best combination
}


@functools.lru_cache(maxsize=16)
def _block_band_mask(n_blocks: int, window: int, device: torch.device) -> Tensor:
    """(n_blocks, W, 2W) bool for `sliding_window_attention`: query i of a block may attend key j
    of [previous block, own block] iff i < j <= i + W (the last W positions, itself included);
    the first block has no previous one (its first W keys are padding)."""
    with torch.inference_mode(False):
        i = torch.arange(window, device=device).unsqueeze(1)
        j = torch.arange(2 * window, device=device).unsqueeze(0)
        band = (j > i) & (j <= i + window)  # (W, 2W)
        mask = band.expand(n_blocks, window, 2 * window).clone()
        mask[0, :, :window] = False
        return mask


def sliding_window_attention(q: Tensor, k: Tensor, v: Tensor, window: int, dropout_p: float = 0.0) -> Tensor:
    """Causal attention to the last `window` positions (self included) of q, k, v (B, nh, T, hd),
    in blocks of `window` queries that each read their own block and the previous one: 2·T·W
    scores instead of the T² of a masked dense product (8x fewer at T = 2,048, W = 128). The same
    function as SDPA with a dense (T, T) band mask (tests/cl_platform/test_model.py compares
    outputs and gradients); the sums run in another order, so results agree to rounding, not bit for bit."""
    B, H, T, D = q.shape
    W = window
    pad = (-T) % W  # padded queries are dropped; padded keys lie after every real query (causal)
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    n = (T + pad) // W
    qb, kb, vb = (t.reshape(B, H, n, W, D) for t in (q, k, v))
    # Keys and values of [previous block, own block]: (B, nh, n, 2W, hd); block 0's previous is zeros (masked).
    kk = torch.cat([F.pad(kb, (0, 0, 0, 0, 1, 0))[:, :, :-1], kb], dim=3)
    vv = torch.cat([F.pad(vb, (0, 0, 0, 0, 1, 0))[:, :, :-1], vb], dim=3)
    y = F.scaled_dot_product_attention(qb, kk, vv, attn_mask=_block_band_mask(n, W, q.device), dropout_p=dropout_p)
    return y.reshape(B, H, n * W, D)[:, :, :T]


@functools.lru_cache(maxsize=16)
def _rope_cos_sin(T: int, head_dim: int, base: float, device: torch.device) -> tuple[Tensor, Tensor]:
    with torch.inference_mode(False):
        inv_freq = base ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(T, device=device, dtype=torch.float32), inv_freq)  # (T, hd/2)
        return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate feature pairs (i, i + hd/2) of x (B, nh, T, hd) by position-dependent angles."""
    x1, x2 = x.chunk(2, dim=-1)  # (B, nh, T, hd/2) each
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def causal_conv_naive(x: Tensor, weight: Tensor, prefix: Tensor | None = None) -> Tensor:
    """The reference for `CausalConv`, one position at a time: y_t = Σ_j weight[:, j] · x_{t−K+1+j}
    for x (B, T, C), weight (C, K); positions before the start are `prefix` (B, K − 1, C), or zeros."""
    B, T, C = x.shape
    K = weight.shape[1]
    past = prefix if prefix is not None else x.new_zeros(B, K - 1, C)
    full = torch.cat([past, x], dim=1)  # (B, K − 1 + T, C): input t sits at t + K − 1
    out = []
    for t in range(T):
        y = x.new_zeros(B, C)
        for j in range(K):
            y = y + weight[:, j] * full[:, t + j]
        out.append(y)
    return torch.stack(out, dim=1)


class CausalConv(nn.Module):
    """Depthwise causal convolution over time: channel c of position t mixes channel c of positions
    t − K + 1 .. t, nothing later. With a decoding cache the last K − 1 inputs are kept, so decoding
    a few tokens at a time gives what one forward over the whole sequence gives."""

    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.kernel = kernel
        # nn.Conv1d's default init for a depthwise kernel (fan-in K): U(±1/√K).
        self.weight = nn.Parameter(torch.empty(channels, kernel).uniform_(-kernel ** -0.5, kernel ** -0.5))

    def forward(self, x: Tensor, cache: "LayerCache | None" = None) -> Tensor:
        """x (B, T, C) -> (B, T, C); `cache` (if given) supplies the previous inputs and keeps the new last K − 1."""
        B, T, C = x.shape
        K = self.kernel
        past = cache.conv if cache is not None and cache.conv is not None else x.new_zeros(B, K - 1, C)
        full = torch.cat([past, x], dim=1)  # (B, K − 1 + T, C)
        if cache is not None:
            cache.conv = full[:, full.shape[1] - (K - 1):]
        y = F.conv1d(full.transpose(1, 2), self.weight.unsqueeze(1), groups=C)  # (B, C, T): valid positions only
        return y.transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_head = config.n_head
        self.head_dim = config.d_model // config.n_head
        self.mixer = config.mixer
        self.window = config.window
        self.pswa_prob = config.pswa_prob
        self.rope_base = config.rope_base
        self.dropout = config.dropout
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.conv = CausalConv(3 * config.d_model, config.conv_kernel) if config.conv_kernel else None
        self.proj = nn.Linear(config.d_model, config.d_model, bias=False)
        self.resid_drop = nn.Dropout(config.dropout)

    def uses_window(self) -> bool:
        if self.mixer == "swa":
            return True
        # pSWA: each layer draws once per forward from the global host generator (torch.manual_seed
        # replays it), on any device: the same draws on a GPU as on the CPU.
        return self.training and torch.rand((), device="cpu").item() < self.pswa_prob

    def forward(self, x: Tensor, cache: "LayerCache | None" = None) -> Tensor:
        B, T, d = x.shape
        qkv = self.qkv(x)  # (B, T, 3d)
        if self.conv is not None:
            qkv = qkv + self.conv(qkv, cache)
        q, k, v = qkv.view(B, T, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        start = cache.pos if cache is not None else 0  # absolute position of x's first token
        cos, sin = _rope_cos_sin(start + T, self.head_dim, self.rope_base, x.device)  # (start + T, hd/2)
        q, k = apply_rope(q, cos[start:], sin[start:]), apply_rope(k, cos[start:], sin[start:])  # (B, nh, T, hd)
        if cache is not None:
            return self.proj(self._cached(q, k, v, cache).transpose(1, 2).reshape(B, T, d))
        dropout_p = self.dropout if self.training else 0.0
        if self.uses_window() and T > self.window:
            y = sliding_window_attention(q, k, v, self.window, dropout_p)  # (B, nh, T, hd)
        else:  # a window at least T long is plain causal attention
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)
        return self.resid_drop(self.proj(y.transpose(1, 2).reshape(B, T, d)))


    def _cached(self, q: Tensor, k: Tensor, v: Tensor, cache: "LayerCache") -> Tensor:
        """Attention of the new positions q, k, v (B, nh, T, hd) to the cached ones and to each
        other; the cache then keeps what a later position may still see (the last window − 1
        positions under a sliding window, every position under full attention)."""
        if self.training:
            raise RuntimeError("Attention: a decoding cache is for evaluation (model.eval()); training "
                               "draws pSWA layers and dropout per forward")
        if cache.k is not None:
            k, v = torch.cat([cache.k, k], dim=2), torch.cat([cache.v, v], dim=2)  # (B, nh, P + T, hd)
        T, P = q.shape[2], k.shape[2] - q.shape[2]
        windowed = self.uses_window()
        back = (torch.arange(T, device=q.device).unsqueeze(1) + P) - torch.arange(P + T, device=q.device)  # (T, P + T)
        allowed = (back >= 0) & (back < self.window) if windowed else back >= 0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # (B, nh, T, hd)
        keep = min(self.window - 1, k.shape[2]) if windowed else k.shape[2]
        cache.k, cache.v = k[:, :, k.shape[2] - keep:], v[:, :, k.shape[2] - keep:]
        cache.pos += T
        return y


@dataclass
class LayerCache:
    """One attention layer's decoding state: the rotated keys and values (B, nh, P, hd) of the
    positions a later token may still attend to, `pos`, the tokens seen so far, and with a
    `conv_kernel` K the last K − 1 inputs of the convolution (B, K − 1, 3d)."""

    k: Tensor | None = None
    v: Tensor | None = None
    pos: int = 0
    conv: Tensor | None = None


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        hidden = int(config.mlp_ratio * config.d_model)
        self.fc = nn.Linear(config.d_model, hidden, bias=False)
        self.proj = nn.Linear(hidden, config.d_model, bias=False)
        self.drop = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, rule: WriteRule | None = None):
        super().__init__()
        d = config.d_model
        has_fwpkm = layer in config.fwpkm_layers
        self.fwpkm = FwPKM(d, config.fwpkm, rule, name=f"fwpkm{layer}") if has_fwpkm else None
        self.attn_norm = RMSNorm(d)
        self.attn = Attention(config)
        has_pkm = layer in config.pkm_layers
        self.ffn_norm = nn.Identity() if has_pkm else RMSNorm(d)  # PKM norms its own input
        self.ffn = PKM(d, config.pkm) if has_pkm else MLP(config)

    def forward(self, h: Tensor, cache: LayerCache | None = None) -> Tensor:
        if self.fwpkm is not None:
            h = h + self.fwpkm(h)
        h = h + self.attn(self.attn_norm(h), cache)
        return h + self.ffn(self.ffn_norm(h))


class FwPKMLM(nn.Module):
    """The language model. `config` is its architecture; `rule` is how every FwPKM layer writes
    (default `WriteRule()`), replaceable later with `set_write_rules`."""

    def __init__(self, config: ModelConfig, rule: WriteRule | None = None):
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("FwPKMLM: config.vocab_size is None; set it from the tokenizer first, e.g. "
                             "dataclasses.replace(config, vocab_size=tokenizer.vocab_size)")
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, layer, rule) for layer in range(config.n_layer))
        self.norm_f = RMSNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        self._init_weights()

    def _init_weights(self):
        """nanoGPT init: N(0, 0.02) for matmuls and the embedding, N(0, 0.02/√(2L)) for projections
        that write into the residual stream, so its variance does not grow with depth. The memory
        layers keep their own key/value init; the FwPKM layer's slow weights are left to it."""
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layer)
        nn.init.normal_(self.wte.weight, std=0.02)
        for block in self.blocks:
            nn.init.normal_(block.attn.qkv.weight, std=0.02)
            nn.init.normal_(block.attn.proj.weight, std=residual_std)
            if isinstance(block.ffn, MLP):
                nn.init.normal_(block.ffn.fc.weight, std=0.02)
                nn.init.normal_(block.ffn.proj.weight, std=residual_std)
            else:
                nn.init.normal_(block.ffn.out_proj.weight, std=residual_std)

    def forward(self, idx: Tensor, targets: Tensor | None = None,
                cache: list[LayerCache] | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """idx (B, T) long -> logits (B, T, V), or (logits, mean token cross-entropy) with targets
        (B, T) (IGNORE_INDEX for padding).

        `cache` (from `new_cache()`): idx continues the tokens this cache has seen, and the cache
        is advanced past it: decoding a few tokens at a time gives the logits of one forward over
        the whole sequence (to rounding). For reading only: every FwPKM layer must have writes
        off, since a write is a step over a whole chunk that piecewise calls would not see."""
        if idx.dim() != 2:
            raise ValueError(f"FwPKMLM.forward: idx must be (B, T), got shape {tuple(idx.shape)}")
        if cache is not None:
            if len(cache) != len(self.blocks):
                raise ValueError(f"FwPKMLM.forward: cache has {len(cache)} layers, the model {len(self.blocks)}")
            writing = [layer.name for layer in self.fwpkm_layers()
                       if layer.writes_enabled or layer.rule.persistence == "reset_per_call"]
            if writing:
                raise ValueError(f"FwPKMLM.forward: a decoding cache needs FwPKM writes off (set_writes(False)) "
                                 f"and a memory that persists between calls; {', '.join(writing)} do not")
        h = self.drop(self.wte(idx))  # (B, T, d)
        for i, block in enumerate(self.blocks):
            h = block(h, cache[i] if cache is not None else None)
        logits = self.lm_head(self.norm_f(h))  # (B, T, V)
        if targets is None:
            return logits
        loss = F.cross_entropy(
            logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX
        )
        return logits, loss

    def new_cache(self) -> list[LayerCache]:
        """An empty decoding cache for `forward(idx, cache=...)`, one entry per layer."""
        return [LayerCache() for _ in self.blocks]

    def fwpkm_layers(self) -> list[FwPKM]:
        return [block.fwpkm for block in self.blocks if block.fwpkm is not None]

    def snapshot_memory(self) -> list[FastWeightState]:
        """A copy of every FwPKM layer's whole fast state, in layer order."""
        return [layer.snapshot() for layer in self.fwpkm_layers()]

    def restore_memory(self, snap: list[FastWeightState]) -> None:
        """Put a `snapshot_memory()` back, bit for bit."""
        layers = self.fwpkm_layers()
        if len(snap) != len(layers):
            raise ValueError(f"restore_memory: snapshot has {len(snap)} layers, model has {len(layers)}")
        for layer, s in zip(layers, snap):
            layer.restore(s)

    def reset_memory(self, generator: torch.Generator | None = None) -> None:
        for layer in self.fwpkm_layers():
            layer.reset(generator)

    def set_writes(self, enabled: bool, layers: Sequence[int] | None = None) -> None:
        """Writes on or off in every FwPKM layer, or, with `layers` (block indices), on only in those."""
        names = None if layers is None else {f"fwpkm{i}" for i in layers}
        for layer in self.fwpkm_layers():
            layer.writes_enabled = enabled and (names is None or layer.name in names)

    def write_rules(self) -> dict[str, WriteRule]:
        """Each FwPKM layer's write rule, by layer name (`fwpkm<index>`), in layer order."""
        return {layer.name: layer.rule for layer in self.fwpkm_layers()}

    def set_write_rules(self, default: WriteRule, by_layer: dict[str, WriteRule] | None = None) -> None:
        """Every FwPKM layer writes by `default`, except those named in `by_layer`
        (`{"fwpkm3": WriteRule(...)}`). Nothing changes if a name or a rule is invalid."""
        by_layer = dict(by_layer or {})
        names = [layer.name for layer in self.fwpkm_layers()]
        unknown = sorted(set(by_layer) - set(names))
        if unknown:
            raise ValueError(f"set_write_rules: unknown FwPKM layer(s) {unknown}; the model's are {names}")
        for where, rule in [("default", default), *by_layer.items()]:
            if not isinstance(rule, WriteRule):
                raise TypeError(f"set_write_rules: the rule for {where} must be a WriteRule, got {type(rule).__name__}")
        for layer in self.fwpkm_layers():
            layer.rule = by_layer.get(layer.name, default)

    def optimizer_groups(self, weight_decay: float, lr: float) -> list[dict]:
        """Param groups for `cl_platform.optim.MixedAdamW`.

        decay:      matmul weights (≥ 2-D) and the tied embedding, nanoGPT-style;
        no_decay:   norms, biases, gates, and the static PKM's keys (decay would pull those
                    cluster centres towards the origin);
        pkm_values: static PKM value tables, sparse gradients, lazy Adam, no decay.
        Fast-weight keys/values are buffers, so they are in no group. Empty groups are dropped.
        """
        pkm_values = {id(m.values.weight) for m in self.modules() if isinstance(m, PKM)}
        pkm_keys = {id(m.keys) for m in self.modules() if isinstance(m, PKM)}
        # FwPKM's gate projection is a (1, d) matrix but a per-token scalar gate, not a matmul
        gates = {id(m.proj_g.weight) for m in self.fwpkm_layers()}
        groups = {name: [] for name in ("decay", "no_decay", "pkm_values")}
        for p in self.parameters():  # tied weights appear once
            if not p.requires_grad:
                continue
            if id(p) in pkm_values:
                groups["pkm_values"].append(p)
            elif p.ndim < 2 or id(p) in pkm_keys or id(p) in gates:
                groups["no_decay"].append(p)
            else:
                groups["decay"].append(p)
        settings = {
            "decay": dict(weight_decay=weight_decay, sparse=False),
            "no_decay": dict(weight_decay=0.0, sparse=False),
            "pkm_values": dict(weight_decay=0.0, sparse=True),
        }
        return [
            dict(name=name, params=params, lr=lr, **settings[name])
            for name, params in groups.items()
            if params
        ]


def count_parameters(model: FwPKMLM) -> dict[str, int]:
    """Parameter counts.

    total:       slow parameters + fast state;
    slow:        all nn.Parameters (tied embedding once);
    trainable:   slow parameters with requires_grad;
    fast_state:  FwPKM keys and values (buffers);
    active_slow: slow parameters one token uses: everything except the static PKM value rows it
                 does not read (it reads heads·topk rows); the tied embedding counts in full since
                 the output head uses all of it;
    active:      active_slow + the FwPKM state one token uses: all keys (each query is scored
                 against every sub-key) and the heads·topk value rows it reads.
    """
    slow = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    fast_state = sum(m.keys.numel() + m.values.numel() for m in model.fwpkm_layers())
    unread_pkm = sum(
        (m.config.num_slots - min(m.config.num_slots, m.config.heads * m.config.topk)) * m.config.d_value
        for m in model.modules()
        if isinstance(m, PKM)
    )
    fast_active = sum(
        m.keys.numel() + min(m.values.shape[0], m.config.heads * m.config.topk) * m.values.shape[1]
        for m in model.fwpkm_layers()
    )
    active_slow = slow - unread_pkm
    return dict(
        total=slow + fast_state,
        slow=slow,
        trainable=trainable,
        fast_state=fast_state,
        active_slow=active_slow,
        active=active_slow + fast_active,
    )
