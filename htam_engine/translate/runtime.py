"""The small shape helpers a written `ModelNew` calls in forward, copied into it by
source (`inspect.getsource`): sizes come from the tensors at run time, never from the
shapes the reference was traced at."""

from __future__ import annotations

from collections.abc import Sequence


def _product(sizes: Sequence[int]) -> int:
    result = 1
    for size in sizes:
        result *= size
    return result


def _split(shape: Sequence[int], first: int, last: int) -> tuple[int, int, int]:
    """(outer, size, inner): the shape as three dims around dims first..last-1."""
    return _product(shape[:first]), _product(shape[first:last]), _product(shape[last:])


def _broadcast(*shapes: Sequence[int]) -> tuple[int, ...]:
    rank = max(len(shape) for shape in shapes)
    padded = [(1,) * (rank - len(shape)) + tuple(shape) for shape in shapes]
    return tuple(max(sizes) for sizes in zip(*padded, strict=True))


def _reduced(shape: Sequence[int], dims: Sequence[int], keepdim: bool) -> tuple[int, ...]:
    return tuple(
        1 if k in dims else size for k, size in enumerate(shape) if keepdim or k not in dims
    )


def _pooled(
    sizes: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    ceil_mode: bool,
) -> tuple[int, ...]:
    """A pooling's output sizes, by torch's rule (a last window must start inside)."""
    out = []
    for size, k, s, p, d in zip(sizes, kernel, stride, padding, dilation, strict=True):
        span = size + 2 * p - d * (k - 1) - 1
        count = (span + (s - 1 if ceil_mode else 0)) // s + 1
        if ceil_mode and (count - 1) * s >= size + p:
            count -= 1
        out.append(count)
    return tuple(out)


def _convolved(
    shape: Sequence[int],
    weight: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    transposed: bool,
    output_padding: Sequence[int],
    groups: int,
) -> tuple[int, ...]:
    """A convolution's output shape (batch, channels, sizes...)."""
    channels = weight[1] * groups if transposed else weight[0]
    sizes = []
    for k, size in enumerate(shape[2:]):
        reach = dilation[k] * (weight[2 + k] - 1)
        if transposed:
            sizes.append((size - 1) * stride[k] - 2 * padding[k] + reach + output_padding[k] + 1)
        else:
            sizes.append((size + 2 * padding[k] - reach - 1) // stride[k] + 1)
    return (shape[0], channels, *sizes)
