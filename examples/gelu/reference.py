"""Element-wise GELU (exact, erf form) on a 2048 x 2048 float32 tensor."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(2048, 2048)]


def get_init_inputs() -> list:
    return []
