"""Model FLOPs per token for a dense decoder-only transformer.

The count MFU uses is *model* FLOPs (what the model needs), not hardware FLOPs (what
the GPU ran, including activation recomputation). For a dense transformer trained
with forward + backward, per token (PaLM, Chowdhery et al. 2022, appendix B)::

    6·N + 12·L·H·Q·T

- ``6·N``: each of the N non-embedding parameters does one multiply-add (2 FLOPs)
  in the forward pass and two in the backward pass (gradients w.r.t. input and
  weight): 2 + 4 = 6 FLOPs per parameter per token.
- ``12·L·H·Q·T``: self-attention's two matmuls (QKᵀ and attention·V), which have no
  parameters: per layer and token, 2·H·Q·T FLOPs each in the forward pass, ×3 for
  forward + backward, ×2 matmuls = 12·H·Q·T, times L layers.

L = layers, H = attention heads, Q = head dimension, T = sequence length.
docs/sdk.md has a worked example.
"""

from __future__ import annotations

import math


def _count(name: str, value: object, *, positive: bool) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{name} must be {'> 0' if positive else '>= 0'}, got {value}")
    return value


def transformer_flops_per_token(
    n_params: int, n_layers: int, n_heads: int, head_dim: int, seq_len: int
) -> float:
    """Training FLOPs per token of a dense transformer: ``6·N + 12·L·H·Q·T``.

    ``n_params`` is the non-embedding parameter count N (include the embedding only
    if it is tied to the output layer, whose matmul does run per token); ``n_layers``
    L, ``n_heads`` H, ``head_dim`` Q and ``seq_len`` T as in PaLM's appendix B.
    Pass the result as ``StepReporter(flops_per_token=...)``.

    >>> transformer_flops_per_token(124_000_000, 12, 12, 64, 1024)
    857246208.0
    """
    n = _count("n_params", n_params, positive=True)
    layers = _count("n_layers", n_layers, positive=False)
    heads = _count("n_heads", n_heads, positive=False)
    q = _count("head_dim", head_dim, positive=False)
    t = _count("seq_len", seq_len, positive=False)
    flops = float(6 * n + 12 * layers * heads * q * t)
    if not math.isfinite(flops):  # pragma: no cover - ints this large are not models
        raise ValueError("FLOPs per token overflow")
    return flops
