"""RMSNorm, shared by the model, the static PKM and the FwPKM layer."""

import torch
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x²) + eps) · weight over the last dimension.

    Computed in float32 whatever the input dtype (the mean of squares underflows in bf16/fp16),
    then cast back to the input dtype.
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        y = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (y * self.weight.to(y.dtype)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
