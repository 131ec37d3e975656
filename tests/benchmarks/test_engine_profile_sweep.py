"""benchmarks/engine_profile_sweep.py on CPU: its variants, the plan's two profile terms per variant (the dry run
writes only a config.json) and the per-logit / per-token reading of a measured peak."""

from __future__ import annotations

import json

import pytest

from benchmarks.engine_profile_sweep import Variant, main, parse_variants, reading
from trainer.memory_plan.engine_profile import SAMPLER_BYTES_PER_LOGIT, SAMPLER_FIXED_BYTES
from trainer.memory_plan.gpu import GIB

VOCAB_7B = 152064


def test_variants_are_checked_with_a_message_naming_the_item():
    assert parse_variants("1024x2048, 16X16384") == [Variant(1024, 2048), Variant(16, 16384)]
    with pytest.raises(ValueError, match=r"'1024': expected SEQSxTOKENS"):
        parse_variants("1024")
    with pytest.raises(ValueError, match=r"max_num_batched_tokens \(512\) >= max_num_seqs \(1024\)"):
        parse_variants("1024x512")


def test_the_dry_run_gives_the_plans_sampler_by_sequences_and_forward_by_tokens(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "sweep.json"
    rows = main(["--size", "7B", "--layers", "2", "--dry-run", "--variants", "1024x2048,256x2048,16x16384,16x8192",
                 "--workdir", str(tmp_path), "--out", str(out)])
    by = {(r.seqs, r.tokens): r for r in rows}
    # a dense model keeps no workspace through the sampler: its sampling peak is the sampler's own
    per_request = VOCAB_7B * SAMPLER_BYTES_PER_LOGIT / GIB
    assert by[1024, 2048].plan_sampler_gib == pytest.approx(1024 * per_request + SAMPLER_FIXED_BYTES / GIB)
    assert by[1024, 2048].plan_sampler_gib - by[256, 2048].plan_sampler_gib == pytest.approx(768 * per_request)
    assert by[1024, 2048].plan_forward_gib == by[256, 2048].plan_forward_gib  # the forward ignores the sequences
    assert by[16, 16384].plan_forward_gib == pytest.approx(2 * by[16, 8192].plan_forward_gib)
    assert by[16, 16384].plan_forward_gib == pytest.approx(8 * by[1024, 2048].plan_forward_gib)
    assert all(r.measured_gib is None for r in rows)
    assert json.loads(out.read_text())["readings"][0]["seqs"] == 1024


def test_a_reading_is_given_per_logit_and_per_token():
    seen = reading(Variant(1024, 16384), VOCAB_7B, (3.77, 2.17), 2.09)  # 7B on an H200 at vLLM's defaults
    assert seen.per_logit_bytes == pytest.approx(2.09 * GIB / (1024 * VOCAB_7B))
    assert 14.0 < seen.per_logit_bytes < 14.5
    assert seen.per_token_bytes == pytest.approx(2.09 * GIB / 16384)
    assert reading(Variant(16, 16384), VOCAB_7B, (0.1, 2.17), None).per_token_bytes is None
