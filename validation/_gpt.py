"""The GPT-style transformer the GPU acceptance runs train (``gpu_train_validation``,
``gpu_healthy_alerts``): pre-norm blocks of causal self-attention and a 4x GELU MLP, no
biases, an untied output head. torch is imported when a model is made, not before."""

from __future__ import annotations

from typing import Any


def gpt(d_model: int, n_layers: int, n_heads: int, vocab: int) -> Any:
    """A new model (on the CPU, float32): ``model(idx)`` returns the logits."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    head_dim = d_model // n_heads

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(d_model)
            self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
            self.proj = nn.Linear(d_model, d_model, bias=False)
            self.ln2 = nn.LayerNorm(d_model)
            self.fc1 = nn.Linear(d_model, 4 * d_model, bias=False)
            self.fc2 = nn.Linear(4 * d_model, d_model, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, n_heads, head_dim).unbind(2)
            a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                               v.transpose(1, 2), is_causal=True)  # fmt: skip
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d_model))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(n_layers))
            self.ln = nn.LayerNorm(d_model)
            self.head = nn.Linear(d_model, vocab, bias=False)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            x = self.emb(idx)
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.ln(x))

    return GPT()


def non_embedding_params(model: Any) -> int:
    """N of 6N FLOPs per token: every parameter whose matmul runs per token (the blocks
    and the output head), not the embedding lookup."""
    return sum(p.numel() for n, p in model.named_parameters() if not n.startswith("emb"))
