"""Row-wise softmax over a 1024 x 4096 float32 tensor."""

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(1024, 4096)]


def get_init_inputs() -> list:
    return []
