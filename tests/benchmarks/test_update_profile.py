"""benchmarks/update_profile.py: its variant grammar and its trace arithmetic (the GPU run is in docs/benchmarks.md)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.update_profile import Variant, busy_seconds, kernel_kind, main


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
    assert kernel_kind("void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<...>") == "routing"
    assert kernel_kind("void at::native::sbtopk::gatherTopK<c10::BFloat16, unsigned int, 2>") == "routing"
    assert kernel_kind("void at::native::indexFuncLargeIndex<float, long, unsigned int, 2, 2, -2, true>") == "routing"


def test_a_mixture_of_experts_update_runs_full_and_with_lora_adapters_only_trained(tmp_path):
    """The tiny Qwen3-MoE on CPU: a full update trains every parameter; --lora-rank trains the adapters alone,
    fewer with --lora-targets naming attention and the router than with every linear layer (the experts too)."""
    common = ["--shape", "tiny-moe", "--variants", "256/all/phase", "--repeats", "1", "--workdir", str(tmp_path)]
    full, all_linear, attention = (
        main(common + extra + ["--out", str(tmp_path / f"{name}.json")])["rows"][0]
        for name, extra in (
            ("full", []),
            ("all", ["--lora-rank", "4"]),
            ("attention", ["--lora-rank", "4", "--lora-targets", "q_proj,k_proj,v_proj,o_proj,gate"]),
        )
    )
    for row in (full, all_linear, attention):
        assert "error" not in row and row["update_s"] > 0 and row["tokens"] > 0
    assert full["trainable_parameters"] > 10 * all_linear["trainable_parameters"]
    assert all_linear["trainable_parameters"] > attention["trainable_parameters"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is of a machine without a GPU")
def test_a_shape_that_needs_a_gpu_is_refused_on_cpu_naming_the_cpu_shapes(capsys):
    with pytest.raises(SystemExit):
        main(["--shape", "30B-A3B"])
    assert "tiny-moe" in capsys.readouterr().err
