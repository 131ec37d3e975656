"""benchmarks/update_profile.py: its variant grammar and its trace arithmetic (the GPU run is in docs/benchmarks.md)."""

from __future__ import annotations

import pytest

from benchmarks.update_profile import Variant, busy_seconds, kernel_kind


def test_variants_parse_and_bad_ones_say_what_is_valid():
    variant = Variant.parse("16384/8/phase", layers=14)
    assert (variant.budget, variant.recompute, variant.release, variant.name) == (16384, "8", "phase", "16384/8/phase")
    assert variant.recompute_share(14) == pytest.approx(8 / 14)
    assert Variant.parse("4096/none/micro", 14).recompute_share(14) == 0.0
    assert Variant.parse("4096/all/micro", 14).recompute_share(14) == 1.0
    model = Variant.parse("4096/3/micro", 14).actor_config("/m", 8)["model"]
    assert model["enable_gradient_checkpointing"] and model["gradient_checkpointing_layers"] == 3
    for text, message in (("16384/all", "write <tokens>"), ("16384/all/later", "not one of"), ("16384/15/phase", "1..14")):
        with pytest.raises(ValueError, match=message):
            Variant.parse(text, layers=14)


def test_busy_time_is_the_union_of_kernel_intervals():
    assert busy_seconds([(0, 2e6), (1e6, 3e6), (5e6, 6e6)]) == pytest.approx(4.0)
    assert busy_seconds([]) == 0.0


def test_kernels_are_sorted_into_kinds():
    assert kernel_kind("nvjet_sm90_tst_256x160_64x4_1x2_h_bz_coopA_NNT") == "matmul"
    assert kernel_kind("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel") == "attention"
    assert kernel_kind("ncclDevKernel_AllGather_RING_LL") == "collectives"
    assert kernel_kind("void at::native::(anonymous namespace)::multi_tensor_apply_kernel") == "optimizer"
    assert kernel_kind("Memcpy DtoD (Device -> Device)") == "copies"
    assert kernel_kind("void at::native::vectorized_elementwise_kernel<4, at::native::silu>") == "other"
