"""The weight tensors of a vLLM model under the trainer's (Hugging Face) parameter names, as views.

Runs inside the vLLM worker holding the engine's weights: the whole engine (tensor parallel 1), or one shard of
it (tensor parallel k, one shard per trainer rank), whose tensors are then this shard's parts: each of the
checkpoint's linears contributes its shard of rows (q/k/v, gate/up, the vocabulary) or of columns (o_proj,
down_proj), and the norms are whole. vLLM fuses some of the
checkpoint's linears into one weight: Qwen2/Llama's `qkv_proj` holds q_proj, k_proj and v_proj one after
another along the output rows, `gate_up_proj` holds gate_proj then up_proj (the model's
`packed_modules_mapping` names them in that order, the layer's `output_partition_sizes` gives their row
counts). A row range of a contiguous [out, in] weight is itself contiguous, so each checkpoint tensor is a
view of the fused one. The input embedding and the LM head hold the vocabulary padded to a multiple of 64
rows (the first `org_vocab_size` rows are the checkpoint's). Everything else (o_proj, down_proj, the norms)
is the checkpoint's tensor as it is. A LoRA engine wraps each adapted linear in a layer holding the original
as `base_layer`; its weight is the same tensor, so the wrapper only changes the parameter's name.

A weight the engine keeps in another layout (a quantized or repacked one, e.g. vLLM's CPU build packs every
linear for oneDNN and drops the [out, in] tensor) has another shape than the checkpoint's and is left out
by the caller's shape check.
"""

from __future__ import annotations

import torch
from torch import nn

LORA_WRAPPED = ".base_layer"  # vLLM's LoRA layers keep the original layer under this name
# vLLM's fused-MoE parameter -> transformers' fused experts parameter (same [E, rows, cols] layout at TP1).
FUSED_EXPERT_WEIGHTS = {"w13_weight": "gate_up_proj", "w2_weight": "down_proj"}
EXPERTS_MODULE = "experts"  # transformers' module holding a layer's fused experts (`mlp.experts`)


def _parts(model: nn.Module, module_name: str, module: nn.Module) -> list[tuple[str, int]] | None:
    """(checkpoint module name, rows) of a fused linear in its row order, or None for an unfused module."""
    packed: dict[str, list[str]] = getattr(model, "packed_modules_mapping", None) or {}
    prefix, _, leaf = module_name.rpartition(".")
    names = packed.get(leaf)
    sizes = getattr(module, "output_partition_sizes", None)
    if not names or sizes is None or len(names) != len(sizes):
        return None
    return [(f"{prefix}.{name}" if prefix else name, int(rows)) for name, rows in zip(names, sizes)]


def _vocabulary_rows(module: nn.Module) -> int | None:
    """Rows of the checkpoint's vocabulary in a (padded) embedding or LM head, or in this tensor-parallel shard's
    part of it (its first rows; the padding follows them); None for other modules."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    if not isinstance(module, VocabParallelEmbedding):
        return None
    if getattr(module, "tp_size", 1) == 1:
        return int(module.org_vocab_size)
    indices = module.shard_indices
    return int(indices.org_vocab_end_index - indices.org_vocab_start_index)


def _experts_name(module_name: str) -> str | None:
    """The transformers name of the experts module holding a fused-MoE layer: `module_name` itself when it is a
    layer's `experts`, or its nearest ancestor of that name; None outside a mixture of experts' experts."""
    parts = module_name.split(".")
    if EXPERTS_MODULE not in parts:
        return None
    last = len(parts) - 1 - parts[::-1].index(EXPERTS_MODULE)
    return ".".join(parts[: last + 1])


def checkpoint_views(model: nn.Module) -> dict[str, torch.Tensor]:
    """Checkpoint (HF) parameter name -> a view of the engine's tensor holding exactly that parameter."""
    views: dict[str, torch.Tensor] = {}
    modules = dict(model.named_modules())
    for name, param in model.named_parameters():  # tied parameters come once, under their first name
        module_name, _, leaf = name.rpartition(".")
        module = modules[module_name]
        public = module_name.replace(LORA_WRAPPED, "")
        tensor = param.detach()
        parts = _parts(model, public, module)
        vocabulary = _vocabulary_rows(module)
        experts = _experts_name(public) if leaf in FUSED_EXPERT_WEIGHTS else None
        if experts is not None:
            views[f"{experts}.{FUSED_EXPERT_WEIGHTS[leaf]}"] = tensor
        elif parts is not None and tensor.dim() >= 1 and tensor.shape[0] == sum(rows for _, rows in parts):
            start = 0
            for part, rows in parts:
                views[f"{part}.{leaf}"] = tensor.narrow(0, start, rows)
                start += rows
        elif vocabulary is not None and tensor.dim() == 2 and tensor.shape[0] >= vocabulary:
            views[f"{public}.{leaf}"] = tensor.narrow(0, 0, vocabulary)
        else:
            views[f"{public}.{leaf}"] = tensor
    return views


def keep_plain_cpu_weights() -> None:
    """vLLM's CPU build: keep each linear's [out, in] weight and compute with torch's linear.

    By default that build repacks every unquantized linear for its oneDNN kernel when the weights are
    loaded and replaces the weight with an empty tensor (vllm/model_executor/layers/utils.py,
    `dispatch_cpu_unquantized_gemm`, which takes oneDNN whenever `vllm._custom_ops._supports_onednn`):
    nothing would be left to share. With the flag off it keeps the weight and calls `F.linear` on it. The
    flag is read at each layer's load, so this must run before the engine is built; it affects the engines
    this process builds afterwards (a hybrid actor process builds one). Were a later build to repack by
    other means, its repacked weights would fail the caller's shape check and stay unshared."""
    from vllm import _custom_ops

    _custom_ops._supports_onednn = False
