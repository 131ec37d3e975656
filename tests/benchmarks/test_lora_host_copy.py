"""benchmarks/lora_host_copy.py without a GPU: the factor shapes, the arguments, and the refusal."""

from __future__ import annotations

import pytest
import torch

from benchmarks.lora_host_copy import factor_shapes, main, pageable_chunks
from workers.rollout.verify import WeightFingerprint


def test_the_factors_are_the_30b_a3b_experts_a_and_b_at_the_rank():
    shapes = factor_shapes(layers=48, experts=128, rank=16)
    assert len(shapes) == 36_864
    assert set(shapes) == {(16, 2048), (768, 16), (16, 768), (2048, 16)}
    assert shapes[:2] == [(16, 2048), (16, 2048)] and shapes[128] == (768, 16)
    assert sum(rows * columns for rows, columns in shapes) * 2 == 48 * 128 * 3 * (16 * 2048 + 16 * 768) * 2  # 1.55 GiB


def test_the_pageable_baseline_copies_and_sums_what_it_is_given():
    tensors = [torch.randn(shape, dtype=torch.bfloat16) for shape in factor_shapes(1, 3, 4)]
    fingerprint, expected = WeightFingerprint(), WeightFingerprint()
    copies = pageable_chunks(tensors, fingerprint, chunk_bytes=3 * 4 * 2048 * 2)
    expected.add(tensors)
    assert all(torch.equal(copy, tensor) for copy, tensor in zip(copies, tensors, strict=True))
    assert fingerprint.value == pytest.approx(expected.value, rel=1e-12)


@pytest.mark.parametrize("argv", [["--repeats", "1"], ["--variants", "pinned_chunks,nope"], ["--rank", "0"]])
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    assert "error:" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is of a machine without a GPU")
def test_a_machine_without_a_gpu_is_refused_saying_so():
    with pytest.raises(SystemExit, match="needs a GPU"):
        main([])
