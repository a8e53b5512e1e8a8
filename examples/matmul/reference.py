"""Square matrix multiplication C = A @ B, 512 x 512 float32."""

import torch
import torch.nn as nn

N = 512


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(N, N), torch.randn(N, N)]


def get_init_inputs() -> list:
    return []
