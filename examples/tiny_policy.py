"""A tiny autoregressive policy and a rule-scored task, small enough to learn in seconds on a CPU.

Task: for prompt p, the ideal response is the tokens (p + t) mod VOCAB for t = 0..LENGTH-1. The score is
the fraction of positions right, so a random policy scores about 1/VOCAB.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB = 8
LENGTH = 4
NUM_PROMPTS = 8
START = VOCAB  # start-of-response token, outside the output vocabulary


class TinyPolicy(nn.Module):
    """logits(token t) = prompt embedding + previous-token embedding + position embedding."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.prompt = nn.Parameter(torch.randn(NUM_PROMPTS, VOCAB, generator=generator) * 0.1)
        self.previous = nn.Parameter(torch.randn(VOCAB + 1, VOCAB, generator=generator) * 0.1)
        self.position = nn.Parameter(torch.randn(LENGTH, VOCAB, generator=generator) * 0.1)

    def logits(self, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """[B] prompts, [B, LENGTH] responses -> [B, LENGTH, VOCAB] next-token logits (teacher forcing)."""
        previous = torch.cat([torch.full_like(responses[:, :1], START), responses[:, :-1]], dim=1)
        return self.prompt[prompts][:, None, :] + self.previous[previous] + self.position[None]

    def log_prob(self, prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
        """Sequence log-probability of each response, [B]."""
        logp = torch.log_softmax(self.logits(prompts, responses), dim=-1)
        return logp.gather(-1, responses[..., None]).squeeze(-1).sum(-1)

    @torch.no_grad()
    def sample(self, prompts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        tokens = torch.full((len(prompts), 1), START)
        for t in range(LENGTH):
            logits = self.prompt[prompts] + self.previous[tokens[:, -1]] + self.position[t]
            nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
            tokens = torch.cat([tokens, nxt], dim=1)
        return tokens[:, 1:]


def score(prompts: torch.Tensor, responses: torch.Tensor) -> torch.Tensor:
    """Fraction of positions equal to (prompt + position) mod VOCAB, [B] in [0, 1]."""
    target = (prompts[:, None] + torch.arange(LENGTH)[None]) % VOCAB
    return (responses == target).float().mean(-1)
