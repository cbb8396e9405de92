"""The PyTorch side of `benchmarks.peers`: the two models and their steps (plain, Opacus ghost, Opacus hooks).

Imported only when torch and Opacus are installed (`requirements-bench.txt`). Each step function runs one
training step on a fixed batch; `clipped_sum` returns Opacus' Σᵢ min(1, C/‖gᵢ‖)·gᵢ with the noise off,
so `benchmarks.peers` can check it against the JAX contenders on the same tensors.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from opacus import PrivacyEngine
from torch.utils.data import DataLoader, TensorDataset


class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention (packed QKV) and a GELU MLP, both residual."""

    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln2, self.fc, self.out = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, h):
        b, t, d = h.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln1(h)).split(d, dim=-1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return h + self.out(F.gelu(self.fc(self.ln2(h))))


class GPT(nn.Module):
    """A GPT-like language model: token + position embeddings, pre-LN blocks, final LayerNorm, tied head."""

    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int, tied: bool = True):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        for e in (self.wte, self.wpe):  # GPT-2's initialization (torch's N(0, 1) gives huge tied logits)
            nn.init.normal_(e.weight, std=0.02)
        if tied:
            self.head.weight = self.wte.weight

    def forward(self, ids):
        b, t = ids.shape
        pos = torch.arange(t, device=ids.device).repeat(b, 1)  # (B, T), contiguous: Opacus reads dim 0 as examples
        h = self.wte(ids) + self.wpe(pos)
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h))


class SimpleCNN(nn.Module):
    """Seed 003's SimpleCNN (the PyTorch per-sample-gradients tutorial), log-probabilities out."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 32, 3, 1), nn.Conv2d(32, 64, 3, 1)
        self.fc1, self.fc2 = nn.Linear(9216, 128), nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv2(F.relu(self.conv1(x)))), 2)
        return F.log_softmax(self.fc2(F.relu(self.fc1(torch.flatten(x, 1)))), dim=1)


def build(kind: str, seed: int, **gpt) -> nn.Module:
    """The torch model of `kind` ("gpt" with the GPT keyword arguments, or "cnn"), seeded."""
    torch.manual_seed(seed)
    return GPT(**gpt) if kind == "gpt" else SimpleCNN()


def _loss(kind: str, criterion, out, y):
    """The batch's loss: per sequence the mean token cross-entropy (GPT), per image the NLL (CNN); Opacus'
    ghost criterion takes `shape` to form one loss per sequence."""
    if kind == "gpt":
        kw = {"shape": out.shape} if not isinstance(criterion, nn.Module) else {}
        return criterion(out.reshape(-1, out.shape[-1]), y.reshape(-1), **kw)
    return criterion(out, y)


class Step:
    """One training step of `model` on the batch `(x, y)`: plain SGD (`mode=None`) or Opacus DP-SGD
    (`mode` "ghost" or "hooks": clip each example's gradient to C, sum, add N(0, σ²C²), divide by B, SGD)."""

    def __init__(self, kind: str, model: nn.Module, x, y, *, mode: str | None, clip_norm: float,
                 noise_multiplier: float, lr: float = 0.1):
        self.kind, self.x, self.y, self.mode = kind, x, y, mode
        model = copy.deepcopy(model)  # Opacus wraps and hooks its model: each step gets its own copy
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        nll = nn.CrossEntropyLoss() if kind == "gpt" else nn.NLLLoss()
        if mode is None:
            self.model, self.optimizer, self.criterion = model, optimizer, nll
            return
        loader = DataLoader(TensorDataset(x, y), batch_size=len(x))  # sets B; the step uses (x, y) directly
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # secure RNG, "full backward hook" notices
            made = PrivacyEngine().make_private(
                module=model, optimizer=optimizer, data_loader=loader, noise_multiplier=noise_multiplier,
                max_grad_norm=clip_norm, poisson_sampling=False, grad_sample_mode=mode, criterion=nll)
        self.model, self.optimizer = made[0], made[1]
        self.criterion = made[2] if mode == "ghost" else nll

    def backward(self):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _loss(self.kind, self.criterion, self.model(self.x), self.y).backward()

    def __call__(self):
        self.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def clipped_sum(self) -> dict[str, np.ndarray]:
        """Σᵢ min(1, C/‖gᵢ‖)·gᵢ by name (noise σ must be 0), without updating the weights."""
        self.backward()
        self.optimizer.pre_step()  # clip, sum, add noise (0), divide by B: p.grad
        b = len(self.x)
        inner = getattr(self.model, "_module", self.model)
        out = {n: p.grad.detach().numpy().astype(np.float64) * b for n, p in inner.named_parameters()}
        self.optimizer.zero_grad(set_to_none=True)
        return out
