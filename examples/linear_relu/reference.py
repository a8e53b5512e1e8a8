"""Fused linear + bias + ReLU: relu(x @ W^T + b), batch 128, 1024 -> 1024 features."""

import torch
import torch.nn as nn

BATCH, IN_FEATURES, OUT_FEATURES = 128, 1024, 1024


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


def get_inputs() -> list[torch.Tensor]:
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs() -> list:
    return [IN_FEATURES, OUT_FEATURES]
