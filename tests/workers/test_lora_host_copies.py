"""workers/lora/host_copies.py: many small tensors copied in a few packed chunks (the LoRA adapter's host copy in
vLLM), values, shapes and the |w| fingerprint unchanged; page-locked chunks from a CUDA device only."""

from __future__ import annotations

import pytest
import torch

from workers.lora import host_copies as module
from workers.lora.host_copies import host_copies, pinned_host
from workers.rollout.verify import WeightFingerprint


def _factors() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    bf16 = [torch.randn(shape, generator=generator).to(torch.bfloat16) for shape in ((4, 8), (8, 4), (3,), (0, 5))]
    fp32 = [torch.randn(2, 3, 5, generator=generator), torch.randn(6, 2, generator=generator).t()]  # one not contiguous
    return bf16[:2] + fp32[:1] + bf16[2:] + fp32[1:]


@pytest.mark.parametrize("chunk_bytes", [16, 64, 1 << 20])  # a chunk per tensor, a few, one per dtype run
def test_copies_equal_the_tensors_and_the_fingerprint_their_abs_sum(chunk_bytes, monkeypatch):
    tensors = _factors()
    packed: list[int] = []
    copy_chunk = module._copy_chunk
    monkeypatch.setattr(
        module, "_copy_chunk", lambda t, chunk, *rest: (packed.append(len(chunk)), copy_chunk(t, chunk, *rest))
    )
    fingerprint = WeightFingerprint()
    copies = host_copies(tensors, fingerprint, chunk_bytes=chunk_bytes)
    assert len(copies) == len(tensors) and sum(packed) == len(tensors)
    for tensor, copy in zip(tensors, copies):
        assert copy.device.type == "cpu" and copy.dtype == tensor.dtype and copy.shape == tensor.shape
        assert torch.equal(copy, tensor)
    expected = WeightFingerprint()
    expected.add(tensors)
    assert fingerprint.value == pytest.approx(expected.value, rel=1e-12) and fingerprint.value > 0
    if chunk_bytes == 1 << 20:
        assert packed == [2, 1, 2, 1]  # dtype runs: bf16 x2, fp32, bf16 x2, fp32
    if chunk_bytes == 16:
        assert packed == [1, 1, 1, 2, 1]  # none packs past the budget but the empty tensor, which fits beside one


def test_a_copy_is_not_a_view_of_the_source():
    tensors = _factors()
    copies = host_copies(tensors, WeightFingerprint())
    before = [copy.clone() for copy in copies]
    for tensor in tensors:
        tensor.zero_()
    assert all(torch.equal(copy, kept) for copy, kept in zip(copies, before))


def test_only_a_copy_from_a_cuda_device_is_page_locked():
    assert pinned_host(torch.device("cuda", 0)) and pinned_host(torch.device("cuda"))
    assert not pinned_host(torch.device("cpu")) and not pinned_host(torch.device("meta"))
    copies = host_copies(_factors(), WeightFingerprint())  # pin_memory=True would raise on a build without CUDA
    assert not any(copy.is_pinned() for copy in copies)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_copies_from_a_gpu_are_page_locked_views_of_chunks_reused_by_the_next_copy():
    tensors = [tensor.cuda() for tensor in _factors()]
    fingerprint = WeightFingerprint()
    copies = host_copies(tensors, fingerprint, chunk_bytes=64)
    assert all(copy.is_pinned() for copy in copies)
    assert all(copy.dtype == t.dtype and torch.equal(copy, t.cpu()) for t, copy in zip(tensors, copies, strict=True))
    expected = WeightFingerprint()
    expected.add(tensors)
    assert fingerprint.value == pytest.approx(expected.value, rel=1e-12)
    created = torch.cuda.host_memory_stats().get("num_host_alloc")
    del copies  # the chunks freed (no other reference is left), as register_adapter drops the previous adapter
    again = host_copies(tensors, WeightFingerprint(), chunk_bytes=64)
    assert all(torch.equal(copy, tensor.cpu()) for tensor, copy in zip(tensors, again))
    if created is not None:  # the caching host allocator's count of blocks made, where this torch reports it
        assert torch.cuda.host_memory_stats()["num_host_alloc"] == created
