"""The trainer side of a LoRA base shared with its engine, without vLLM: an FSDP2-sharded LoRA Qwen2 in this process
(CPU, gloo, one rank) whose frozen base is pointed into tensors laid out as vLLM's Qwen2 holds them (q/k/v fused
row after row, gate/up fused, the vocabulary padded to 64 rows). Pointing keeps every value and tensor object,
trains exactly as before, and the offloader never moves the shared storages."""

from __future__ import annotations

import gc

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from transformers import Qwen2Config, Qwen2ForCausalLM

from tests.offload.tiny import local, sharded_lora, train_step
from workers.fsdp.offload import Offloader, module_state_tensors
from workers.fsdp.shared_base import SharedBase, checkpoint_name
from workers.fsdp.shared_storage import shard_window
from workers.fsdp.storage_offload import device_storages
from workers.lora.spec import LoraSpec, is_adapter_parameter
from workers.training.dist_utils import single_process_group

CPU = torch.device("cpu")
CONFIG = dict(vocab_size=67, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=98, max_position_embeddings=64, tie_word_embeddings=False)
SPEC = LoraSpec(rank=4, alpha=8.0, target_modules="all-linear", exclude_modules=None)
VOCAB_PADDING = 64


@pytest.fixture(scope="module")
def process_group():
    with single_process_group(CPU):
        yield


def lora_model(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    return sharded_lora(Qwen2ForCausalLM(Qwen2Config(**CONFIG, attn_implementation="eager")), SPEC)


def engine_like(model: torch.nn.Module) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """Copies of the base laid out as vLLM's Qwen2 holds it: (checkpoint name -> view, the engine's tensors)."""
    base = {checkpoint_name(n): local(p).detach().clone() for n, p in model.named_parameters() if not is_adapter_parameter(n)}
    views: dict[str, torch.Tensor] = {}
    tensors: list[torch.Tensor] = []

    def fused(names: list[str]) -> None:
        whole = torch.cat([base[n] for n in names])
        tensors.append(whole)
        start = 0
        for name in names:
            views[name] = whole.narrow(0, start, base[name].shape[0])
            start += base[name].shape[0]

    for i in range(CONFIG["num_hidden_layers"]):
        prefix = f"model.layers.{i}"
        for leaf in ("weight", "bias"):
            fused([f"{prefix}.self_attn.{p}.{leaf}" for p in ("q_proj", "k_proj", "v_proj")])
        fused([f"{prefix}.mlp.gate_proj.weight", f"{prefix}.mlp.up_proj.weight"])
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        rows = -(-base[name].shape[0] // VOCAB_PADDING) * VOCAB_PADDING
        padded = torch.zeros(rows, base[name].shape[1])
        padded[: base[name].shape[0]] = base[name]
        tensors.append(padded)
        views[name] = padded.narrow(0, 0, base[name].shape[0])
    for name, tensor in base.items():
        if name not in views:
            tensors.append(tensor)
            views[name] = tensor
    return views, tensors


def test_every_base_shard_points_into_the_engine_tensors_with_its_values(process_group):
    model, _ = lora_model()
    before = {n: local(p).detach().clone() for n, p in model.named_parameters()}
    objects = [*model.parameters()]
    views, tensors = engine_like(model)
    shared = SharedBase(model)
    own_storages = [StorageWeakRef(local(p).untyped_storage()) for n, p in model.named_parameters() if not is_adapter_parameter(n)]
    report = shared.attach(views)
    assert report.unshared == {} and report.fraction == 1.0
    gc.collect()
    assert all(storage.expired() for storage in own_storages)  # the actor's own copy is freed: one copy left
    assert len(report.shared) == len(views) and report.shared_bytes == sum(v.numel() * 4 for v in views.values())
    for name, param in model.named_parameters():
        assert torch.equal(local(param), before[name])
        if is_adapter_parameter(name):
            continue
        view = views[checkpoint_name(name)]
        assert local(param).data_ptr() == view.data_ptr()  # the very bytes of the engine's tensor
        assert shared.stays(view.untyped_storage())
    assert all(a is b for a, b in zip(objects, model.parameters(), strict=True))
    with torch.no_grad():  # a write through the engine's tensor is what the trainer computes with
        views["model.norm.weight"].mul_(2.0)
        assert torch.equal(local(dict(model.named_parameters())["model.norm.weight"]), 2 * before["model.norm.weight"])
    assert len(tensors) == len({t.untyped_storage().data_ptr() for t in tensors})


def test_a_lora_step_on_the_shared_base_equals_one_on_its_own_base(process_group):
    own, own_optimizer = lora_model(seed=3)
    shared_model, shared_optimizer = lora_model(seed=3)
    views, tensors = engine_like(shared_model)
    SharedBase(shared_model).attach(views)
    engine_before = [t.clone() for t in tensors]
    for seed in range(3):
        assert train_step(own, own_optimizer, seed) == train_step(shared_model, shared_optimizer, seed)
    for (name, a), b in zip(own.named_parameters(), shared_model.parameters(), strict=True):
        assert torch.equal(local(a), local(b)), name
    assert all(torch.equal(a, b) for a, b in zip(engine_before, tensors))  # training never writes the base


def test_the_offloader_moves_the_adapters_and_never_a_shared_storage(process_group):
    model, optimizer = lora_model(seed=5)
    shared = SharedBase(model)
    moves = Offloader(model, optimizer, CPU, param_offload=True, optimizer_offload=True, move_on_cpu=True, params_stay=shared.stays)
    base = [local(p) for n, p in model.named_parameters() if not is_adapter_parameter(n)]
    adapters = [local(p) for n, p in model.named_parameters() if is_adapter_parameter(n)]
    moves.offload()  # before the engine starts: the base stays (its values are compared once the engine is up)
    assert all(t.untyped_storage().nbytes() > 0 for t in base) and all(t.untyped_storage().nbytes() == 0 for t in adapters)
    moves.load(with_optimizer=True)
    views, tensors = engine_like(model)
    shared.attach(views)
    train_step(model, optimizer, seed=0)  # creates the Adam state, which moves too
    engine_before = [t.clone() for t in tensors]
    moves.offload()
    assert all(t.untyped_storage().nbytes() > 0 for t in tensors)
    assert all(t.untyped_storage().nbytes() == 0 for t in adapters)
    adapter_bytes = sum(t.numel() * t.element_size() for t in adapters)
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    assert moves.params.offloaded_bytes == adapter_bytes + buffer_bytes
    assert moves.optimizer_state.offloaded_bytes == 2 * adapter_bytes  # AdamW's two moments
    moves.load(with_optimizer=True)
    assert all(torch.equal(a, b) for a, b in zip(engine_before, tensors))
    # What the guard prevents: without it the model's storages include the engine's, which would be moved.
    pointers = {t.untyped_storage().data_ptr() for t in tensors}
    assert pointers <= {s.data_ptr() for s in device_storages(module_state_tensors(model), CPU)}
    assert not pointers & {s.data_ptr() for s in device_storages(module_state_tensors(model), CPU, shared.stays)}


def test_a_tensor_the_engine_lacks_or_holds_with_other_values_stays_the_trainers(process_group):
    model, _ = lora_model(seed=7)
    views, _ = engine_like(model)
    with torch.no_grad():
        views["model.layers.0.self_attn.k_proj.weight"][0, 0] += 1.0
    del views["model.norm.weight"]
    views["model.layers.1.mlp.down_proj.weight"] = views["model.layers.1.mlp.down_proj.weight"].t()
    own = {n: local(p).untyped_storage().data_ptr() for n, p in model.named_parameters()}
    report = SharedBase(model).attach(views)
    assert report.unshared == {
        "model.layers.0.self_attn.k_proj.base_layer.weight": "its values differ from the engine's (another layout or rounding)",
        "model.norm.weight": "the engine has no tensor of this name",
        "model.layers.1.mlp.down_proj.base_layer.weight": "shape (98, 48) in the engine, (48, 98) in the trainer",
    }
    head_dim = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]
    k_proj, norm, down_proj = CONFIG["num_key_value_heads"] * head_dim * 48, 48, 48 * 98
    assert report.base_bytes - report.shared_bytes == 4 * (k_proj + norm + down_proj)
    assert report.metrics()["lora/unshared_base_tensors"] == 3
    for name in report.unshared:
        assert local(dict(model.named_parameters())[name]).untyped_storage().data_ptr() == own[name]


def test_a_padded_last_shard_is_shared_only_where_the_engines_storage_holds_its_padding():
    fused = torch.zeros(10 + 5, 4)  # a 10-row tensor followed by 5 rows of another, in one storage
    first, second = fused[:10], fused[10:]
    # 3 ranks: shards of 4 rows; the last rank's 2 rows are padded to 4
    assert shard_window(first, rank=2, padded_rows=4, rows=2).fits(fused.numel())  # its padding reads the next tensor
    assert not shard_window(second, rank=1, padded_rows=3, rows=2).fits(fused.numel())  # past the storage's end
    window = shard_window(second, rank=1, padded_rows=3, rows=2)
    assert (window.rows_start, window.offset, window.padded_numel) == (3, (10 + 3) * 4, 12)
