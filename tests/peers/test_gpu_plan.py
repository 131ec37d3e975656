"""benchmarks/peers GPU comparison, checked on CPU without running a side: every side gets the same settings
(EOS ignored, the same batch and optimizer), the pairs differ only where they should (padded vs packed),
the time limits keep one call inside its budget, and the table is built from each side's own output format."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.e2e_step import engine_overrides
from benchmarks.gpu_grpo_step import grpo_overrides
from benchmarks.peers.compare import compare_folders
from benchmarks.peers.gpu_settings import GpuGRPO, ours_overrides
from benchmarks.peers.trl_gpu import PhaseClock, history, trl_config_kwargs
from benchmarks.peers.verl_gpu import MIN_SIDE_S, RESERVE_S, parse_limits, parse_sides, time_for
from benchmarks.peers.verl_settings import verl_overrides
from trainer.config_loader import load_config

WORK = Path("/w")


def as_dict(overrides: list[str]) -> dict[str, str]:
    return dict(item.lstrip("+").split("=", 1) for item in overrides)


def test_gpu_settings_equal_the_e2e_benchmark_they_extend():
    """At the defaults, our sides change none of e2e_step's own values: the settings name what it runs."""
    base = as_dict(grpo_overrides(WORK, WORK / "t", WORK / "v", 4, "[jsonl]") + engine_overrides("vllm", False))
    for side in ("ours_packed", "ours_padded"):
        ours = as_dict(ours_overrides(GpuGRPO(), side))
        shared = sorted(set(base) & set(ours))
        assert len(shared) >= 10
        assert {k: float(base[k]) if base[k][0].isdigit() else base[k] for k in shared} == {
            k: float(ours[k]) if ours[k][0].isdigit() else ours[k] for k in shared}


def test_our_sides_load_and_differ_only_in_padding(tmp_path):
    common = grpo_overrides(tmp_path, tmp_path / "t", tmp_path / "v", 4, "[jsonl]") + engine_overrides("vllm", False)
    configs = {side: load_config(common + ours_overrides(GpuGRPO(), side)) for side in ("ours_packed", "ours_padded")}
    for cfg in configs.values():
        assert cfg.actor_rollout_ref.rollout.ignore_eos is True and cfg.data.max_response_length == 256
        assert cfg.actor_rollout_ref.actor.use_kl_loss is True and cfg.actor_rollout_ref.actor.optim.lr == 1e-6
    assert configs["ours_packed"].actor_rollout_ref.model.use_remove_padding is None  # the toolkit's default: packed
    assert configs["ours_padded"].actor_rollout_ref.model.use_remove_padding is False
    packed, padded = (as_dict(ours_overrides(GpuGRPO(), s)) for s in ("ours_packed", "ours_padded"))
    assert set(padded) - set(packed) == {"actor_rollout_ref.model.use_remove_padding"}
    with pytest.raises(ValueError, match="ours_packed and ours_padded"):
        ours_overrides(GpuGRPO(), "ours")


def test_peers_get_the_same_work():
    s = GpuGRPO()
    verl = as_dict(verl_overrides(WORK / "m", WORK / "t", WORK / "v", WORK, 4, s))
    assert verl["actor_rollout_ref.rollout.ignore_eos"] == "true" and verl["trainer.use_v1"] == "false"
    assert verl["actor_rollout_ref.model.use_remove_padding"] == "false"
    assert verl["data.max_response_length"] == "256" and verl["actor_rollout_ref.rollout.n"] == "8"
    assert float(verl["actor_rollout_ref.actor.kl_loss_coef"]) == s.kl_beta
    trl = trl_config_kwargs(s, WORK, 4, on_gpu=True)
    assert trl["use_vllm"] and trl["vllm_mode"] == "colocate" and trl["generation_kwargs"] == {"ignore_eos": True}
    assert trl["per_device_train_batch_size"] * trl["gradient_accumulation_steps"] == s.responses_per_step == 128
    assert trl["steps_per_generation"] == trl["gradient_accumulation_steps"]  # one optimizer step per rollout step
    assert (trl["max_completion_length"], trl["beta"], trl["learning_rate"], trl["epsilon"]) == (256, 1e-3, 1e-6, 0.2)
    assert trl["vllm_max_model_length"] == 96 + 256 and trl["bf16"] and not trl["mask_truncated_completions"]
    cpu = trl_config_kwargs(s.tiny(), WORK, 2, on_gpu=False)  # the dry run: what a CPU cannot do, nothing else
    assert {k for k in cpu if cpu[k] != trl[k]} == {"max_steps", "max_completion_length", "vllm_max_model_length",
                                                   "bf16", "use_cpu", "vllm_enable_sleep_mode"}


def test_side_limits_are_cut_to_the_budget():
    limits = parse_limits(["trl=100"])
    assert limits["trl"] == 100 and limits["verl"] == 420
    assert time_for("verl", limits, budget_s=540, elapsed_s=100) == 420
    assert time_for("verl", limits, budget_s=540, elapsed_s=200) == 540 - 200 - RESERVE_S
    assert time_for("verl", limits, budget_s=540, elapsed_s=540 - RESERVE_S - MIN_SIDE_S + 1) == 0.0
    with pytest.raises(SystemExit, match="SIDE=SECONDS"):
        parse_limits(["vllm=10"])
    assert parse_sides("verl,trl") == ["verl", "trl"]
    for bad in ("ours", "verl,verl", ""):
        with pytest.raises(SystemExit, match="--sides takes distinct names"):
            parse_sides(bad)


def test_dry_run_prints_every_side(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks.peers.verl_gpu", "--dry-run", "--out-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(" ")[0] for line in lines[::2]] == ["ours_padded", "verl", "ours_packed", "trl"]
    assert "PYTHONPATH=/tmp/verl_site" in lines[2] and "PYTHONPATH=/tmp/trl_site" in lines[6]
    assert "use_remove_padding=false" in lines[1] and "use_remove_padding" not in lines[5]
    assert not list(tmp_path.iterdir())  # nothing run, nothing written


def test_trl_history_splits_the_step_like_ours():
    clock = PhaseClock.__new__(PhaseClock)
    clock.seconds = {0: {"rollout": 5.0, "generate_and_sync": 3.0, "sync_weights": 0.5, "reward": 0.2, "old_log_prob": 0.6,
                         "ref_log_prob": 0.7}, 1: {"rollout": 4.0, "generate_and_sync": 2.5, "sync_weights": 0.4}}
    logs = [{"num_tokens": 1000.0, "completions/mean_length": 256.0, "reward": 0.0},
            {"num_tokens": 2100.0, "completions/mean_length": 256.0, "reward": 0.5}]
    first, second = history(clock, [0.0, 9.0, 16.0], logs, peak_gib=3.0)
    assert first["timing/wall_step_s"] == 9.0 and first["timing/update_actor_s"] == 4.0
    assert first["timing/generate_s"] == 2.5 and first["timing/sync_weights_s"] == 0.5
    assert first["timing/advantage_s"] == pytest.approx(5.0 - 2.5 - 0.5 - 0.2 - 0.6 - 0.7)
    assert (first["perf/tokens"], second["perf/tokens"]) == (1000.0, 1100.0)
    assert second["timing/wall_step_s"] == 7.0 and second["reward/mean"] == 0.5 and second["perf/peak_allocated_gib"] == 3.0


def _ours(path: Path, steps: list[tuple[float, float]]) -> None:
    rows = [{"timing/wall_step_s": s, "timing/generate_s": g, "perf/tokens": 1000.0, "response/length_mean": 256.0} for s, g in steps]
    path.write_text(json.dumps({"results": [{"history": rows}]}))


def test_table_from_each_sides_format_across_two_calls(tmp_path):
    first, second = tmp_path / "call3", tmp_path / "call4"
    first.mkdir(), second.mkdir()
    _ours(first / "ours_padded_e2e.json", [(9.0, 3.0), (4.0, 1.0), (6.0, 2.0)])
    verl = [{"step": i, "data": {"timing_s/step": t, "timing_s/gen": 1.5, "perf/total_num_tokens": 1000.0,
                                  "response_length/mean": 256.0}} for i, t in enumerate((30.0, 15.0, 15.0), 1)]
    (first / "verl_metrics.jsonl").write_text("\n".join(json.dumps(r) for r in verl))
    (first / "runs.json").write_text(json.dumps({"ours_padded": {"exit": 0, "wall_s": 100.0, "gpu_used_peak_gib": 40.0},
                                                 "verl": {"exit": 0, "wall_s": 250.0, "gpu_used_peak_gib": 50.0}}))
    _ours(second / "ours_packed_e2e.json", [(8.0, 3.0), (4.0, 1.0), (4.0, 1.0)])
    (second / "trl_gpu.json").write_text(json.dumps({"error": "vllm is not importable"}))
    (second / "runs.json").write_text(json.dumps({"ours_packed": {"exit": 0, "wall_s": 90.0}, "trl": {"exit": 3, "wall_s": 5.0}}))
    table = compare_folders([first, second])
    assert table["steps"] == {"ours_packed": 3, "ours_padded": 3, "verl": 3}
    assert table["rows"]["step_s"] == {"ours_packed": 4.0, "ours_padded": 5.0, "verl": 15.0}
    assert table["rows"]["tokens_per_s"]["verl"] == pytest.approx(1000 / 15)
    assert table["rows"]["run_wall_s"]["verl"] == 250.0 and table["rows"]["gpu_used_peak_gib"]["ours_packed"] is None
    assert table["ratios"]["ours_padded/verl"]["step_s"] == pytest.approx(5 / 15)
    assert set(table["ratios"]) == {"ours_padded/verl", "ours_packed/verl"}  # no TRL figures: no TRL ratios
    assert "vllm is not importable" in table["errors"]["trl"] and "exit 3" in table["errors"]["trl"]


def test_trl_side_reports_why_it_cannot_run(tmp_path):
    """No importable trl (a stand-in package that fails to import, first on the path): one `error:` line,
    exit 3, and the reason in the JSON the table reads."""
    blocker = tmp_path / "site" / "trl"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('trl blocked by the test')\n")
    out = tmp_path / "out" / "trl_gpu.json"
    done = subprocess.run([sys.executable, "-m", "benchmarks.peers.trl_gpu", "--model", str(tmp_path), "--train",
                           str(tmp_path / "train.parquet"), "--out", str(out)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(tmp_path / "site")})
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: TRL side not run: trl is not importable")
    assert "trl blocked by the test" in json.loads(out.read_text())["error"]
    table = compare_folders([out.parent])
    assert table["steps"] == {} and "trl is not importable" in table["errors"]["trl"]
