"""Model FLOPs of a decoder-only language model, from its config and the batch's sequence lengths.

What is counted (the convention MFU figures are quoted in: PaLM's appendix B, verl's `perf/mfu/actor`):
- Weight matmuls: 2 FLOPs per multiply-add of every weight matrix a token passes through: per layer q/k/v/o
  and gate/up/down, then the output head (the LM head over the vocabulary, tied or not: the matmul runs either
  way; a critic's value head has one output). Not counted: the embedding lookup (no matmul), norms, rotary,
  biases, activations, softmax and the loss (none is a matmul; together well under 1% at 0.5B and up).
- Attention: QKᵀ and the weighted sum of V, 2 × 2 × heads × head_dim FLOPs per (query, key) pair that the
  causal mask leaves, L(L+1)/2 pairs for a sequence of L tokens, in every layer. Each sequence counts by its
  own length (the attention mask's sum): padding is not model work, whether or not a kernel computes it.
- Training (forward + backward) = 3 × forward: the backward computes activation gradients and weight
  gradients, each as costly as the forward. With LoRA the base weights are frozen, so their backward
  computes activation gradients only: 2 × forward for the base matmuls, 3 × for the adapters and attention.
  (Without gradient checkpointing PEFT leaves the first layer's q/k/v inputs without gradients, which skips a
  fraction under 1/layers of the base work; the count keeps it.)
- Gradient checkpointing recomputes the forward during the backward. That is hardware work, not model work:
  `recompute` gives it, for a hardware-FLOPs utilisation (HFU) beside the MFU.
- Generation: every token of the finished sequence passes through the layers once (prefill or decode: the same
  FLOPs as one causal forward over the sequence), and the LM head runs once per generated token.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trainer.memory_plan.shape import ModelShape, lora_params

FLOPS_PER_MULTIPLY_ADD = 2
# Backward passes per forward when every weight is trained: activation gradients and weight gradients.
TRAINED_BACKWARD = 2
# Backward passes per forward for frozen weights (LoRA's base): activation gradients only.
FROZEN_BACKWARD = 1
# Attention has no weights: its backward always computes the gradients of Q, K and V (two matmuls per forward one).
ATTENTION_BACKWARD = 2
HEAD_OUTPUTS = {"value": 1, "score": 1}  # a head not listed here is the LM head (vocabulary outputs)


@dataclass(frozen=True)
class Flops:
    """FLOPs of one pass split by kind; `total` is what MFU divides by time."""

    matmul: float = 0.0
    attention: float = 0.0

    @property
    def total(self) -> float:
        return self.matmul + self.attention

    def __add__(self, other: "Flops") -> "Flops":
        return Flops(self.matmul + other.matmul, self.attention + other.attention)

    def __mul__(self, factor: float) -> "Flops":
        return Flops(self.matmul * factor, self.attention * factor)

    __rmul__ = __mul__


@dataclass(frozen=True)
class ModelFlops:
    """The FLOP counts of one model: `shape` from its config.json, `head` lm | value | score, and the LoRA
    adapters when `lora_rank` > 0 (on the decoder-layer linears named in `lora_targets`)."""

    shape: ModelShape
    head: str = "lm"
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()

    # ---- per token -------------------------------------------------------------------------------------
    def layers_per_token(self) -> int:
        """Weight-matmul FLOPs of one token through every decoder layer (frozen base under LoRA); an MoE model's
        sparse layers count the router, the top-k experts a token goes to and the shared expert (MFU by active
        parameters)."""
        return FLOPS_PER_MULTIPLY_ADD * self.shape.active_multiply_adds()

    def head_per_token(self) -> int:
        outputs = HEAD_OUTPUTS.get(self.head, self.shape.vocab)
        return FLOPS_PER_MULTIPLY_ADD * self.shape.hidden * outputs

    def adapters_per_token(self) -> int:
        """The LoRA adapters' matmuls (x → rank → out) of one token over all layers; 0 without LoRA."""
        if self.lora_rank <= 0:
            return 0
        # rank x (in + out) multiply-adds per adapted linear: the adapters' parameter count. (An expert's
        # adapter runs only for the tokens routed to it; counted as if all did, an upper bound under MoE.)
        return FLOPS_PER_MULTIPLY_ADD * lora_params(self.shape, self.lora_rank, self.lora_targets)

    # ---- per batch --------------------------------------------------------------------------------------
    def attention(self, lengths: Iterable[int]) -> float:
        """QKᵀ and AV over the causal pairs of each sequence, every layer (forward only)."""
        pairs = sum(length * (length + 1) / 2 for length in lengths)  # float: compare.py passes mean lengths
        per_pair = 2 * FLOPS_PER_MULTIPLY_ADD * self.shape.heads * self.shape.head_dim
        return float(per_pair * pairs * self.shape.layers)

    def forward(self, lengths: Iterable[int], adapters: bool = True) -> Flops:
        """One forward over sequences of `lengths` tokens, the head on every token (a log-prob or value
        pass). `adapters=False`: the base model alone (the reference under LoRA)."""
        lengths = list(lengths)
        tokens = sum(lengths)
        per_token = self.layers_per_token() + self.head_per_token() + (self.adapters_per_token() if adapters else 0)
        return Flops(matmul=float(per_token * tokens), attention=self.attention(lengths))

    def train(self, lengths: Iterable[int]) -> Flops:
        """Model FLOPs of forward + backward over `lengths` (weights trained, or under LoRA the adapters)."""
        lengths = list(lengths)
        tokens = sum(lengths)
        base = (self.layers_per_token() + self.head_per_token()) * tokens
        base_backward = FROZEN_BACKWARD if self.lora_rank > 0 else TRAINED_BACKWARD
        matmul = base * (1 + base_backward) + self.adapters_per_token() * tokens * (1 + TRAINED_BACKWARD)
        return Flops(matmul=float(matmul), attention=self.attention(lengths) * (1 + ATTENTION_BACKWARD))

    def recompute(self, lengths: Iterable[int]) -> Flops:
        """What gradient checkpointing adds to `train`: the decoder layers' forward once more (the head
        sits outside the checkpointed layers)."""
        lengths = list(lengths)
        tokens = sum(lengths)
        layers = (self.layers_per_token() + self.adapters_per_token()) * tokens
        return Flops(matmul=float(layers), attention=self.attention(lengths))

    def generate(self, lengths: Iterable[int], generated: Iterable[int]) -> Flops:
        """Prefill + decode of sequences that end at `lengths` tokens, `generated` of them sampled: the
        layers (and adapters) over every token once, the LM head once per sampled token."""
        lengths = list(lengths)
        layers = (self.layers_per_token() + self.adapters_per_token()) * sum(lengths)
        head = self.head_per_token() * sum(generated)
        return Flops(matmul=float(layers + head), attention=self.attention(lengths))
