"""The distributed optimizer's state in a checkpoint, in model space: each rank writes the slices it holds of every
parameter's float32 main weight and Adam moments, named by parameter and placed by their offsets in the flattened
parameter. Any number of data-parallel ranks reads them back (each takes the slices of its own range from the files
of the ranks that held the same tensor: its tensor x pipeline coordinate, and for expert weights its expert-TP x
pipeline one, which spans TP coordinates when the expert-TP size differs from TP), so a run resumes on fewer or more
ranks, as `trainer.on_node_loss=continue` does. megatron-core's own parameter-state files are not used: they assume
a fused Adam with one global step, and torch's Adam (used without Transformer Engine or Apex) keeps a step per
parameter."""

from __future__ import annotations

import glob
import os
from typing import Any

import torch
import torch.distributed as dist

from workers.megatron.model import RankCoordinate
from workers.megatron.moe import EXPERT_GROUPS_MARK

MAIN_WEIGHT = "param"  # the key of the main weight's slice beside the optimizer state's (exp_avg, exp_avg_sq)
STEP = "step"  # torch Adam's per-parameter step counter: one value for the whole optimizer, saved once per file


def _file_name(tp_rank: int | str, pp_rank: int, rank: int | str) -> str:
    return f"optimizer_tp{tp_rank}_pp{pp_rank}_rank{rank}.pt"


def _distributed_optimizers(optimizer: Any) -> list[Any]:
    """The DistributedOptimizers under `optimizer` (Megatron chains one for dense and one for expert weights)."""
    return list(getattr(optimizer, "chained_optimizers", None) or [optimizer])


def _is_expert(param: torch.nn.Parameter) -> bool:
    return not getattr(param, EXPERT_GROUPS_MARK, True)


def _parameter_keys(backend: Any) -> dict[torch.nn.Parameter, str]:
    """Each parameter's name in the files. Expert weights are named per expert-parallel rank: local expert i of
    EP rank 0 and of EP rank 1 share a module name but are different experts."""
    ep_rank = RankCoordinate.current().ep_rank
    return {
        param: f"ep{ep_rank}/{name}" if _is_expert(param) else name for name, param in backend.gpt.named_parameters()
    }


def _held_slices(dist_opt: Any, model_param: torch.nn.Parameter) -> tuple[Any, torch.Tensor, dict[str, Any]]:
    """This rank's range of `model_param` (flattened offsets), its main weight slice and its optimizer state."""
    group_index, group_order = dist_opt.model_param_group_index_map[model_param]
    main_weight = dist_opt.optimizer.param_groups[group_index]["params"][group_order]
    held = dist_opt._get_model_param_range_map(model_param)["param"]
    return held, main_weight, dist_opt.optimizer.state[main_weight]


def _layout(backend: Any) -> dict[str, int]:
    settings = backend.settings
    return {"tp": settings.tp, "pp": settings.pp, "ep": settings.ep, "etp": settings.expert_tp}


def _saved_layout(state: dict[str, Any]) -> dict[str, int]:
    # Files written before the expert-TP size was a setting split the experts over the TP ranks.
    return {"etp": state["layout"]["tp"], **state["layout"]}


def save_optimizer_slices(backend: Any, path: str) -> None:
    keys = _parameter_keys(backend)
    pieces: dict[str, dict[str, Any]] = {}
    steps = set()
    for dist_opt in _distributed_optimizers(backend.optimizer):
        for model_param in dist_opt.model_param_group_index_map:
            held, main_weight, state = _held_slices(dist_opt, model_param)
            # copy=True: a float32 model's main weight is a view into the whole parameter (or its buffer)
            piece = {MAIN_WEIGHT: main_weight.detach().to("cpu", copy=True)}
            piece.update({k: v.detach().to("cpu", copy=True) for k, v in state.items() if k != STEP})
            steps.update(float(v) for k, v in state.items() if k == STEP)
            piece.update(start=held.start, end=held.end, numel=model_param.numel())
            pieces[keys[model_param]] = piece
    if len(steps) > 1:
        raise RuntimeError(f"the optimizer's parameters are at different steps {sorted(steps)}; cannot save one step")
    rank = RankCoordinate.current()
    state = {
        "layout": _layout(backend), "step": steps.pop() if steps else None, "pieces": pieces,
        "tp_rank": rank.tp_rank, "expert_tp_rank": rank.etp_rank,
    }
    torch.save(state, os.path.join(path, _file_name(rank.tp_rank, rank.pp_rank, dist.get_rank())))


def load_optimizer_slices(backend: Any, path: str) -> None:
    """After the DistributedOptimizer's own `load_state_dict` (which allocates the state): each parameter's slices
    from every file that holds part of this rank's range."""
    rank = RankCoordinate.current()
    folding = backend.settings.expert_tp != backend.settings.tp  # expert slices come from other TP coordinates
    pattern = _file_name("*" if folding else rank.tp_rank, rank.pp_rank, "*")
    files = sorted(glob.glob(os.path.join(glob.escape(path), pattern)))
    if not files:
        raise FileNotFoundError(
            f"no {pattern} in {path}: the distributed optimizer's state is missing (checkpoints written before "
            "the optimizer's state was saved by parameter are read only by a run of this version before it)"
        )
    saved = [torch.load(file, map_location="cpu", weights_only=True, mmap=True) for file in files]
    here = _layout(backend)
    for file, state in zip(files, saved):
        if _saved_layout(state) != here:
            raise ValueError(f"{file} was saved with layout {_saved_layout(state)}; this run has {here}: the number "
                             "of data-parallel ranks may change on resume, the tensor, pipeline and expert sizes not")
    steps = {state["step"] for state in saved}
    if len(steps) != 1:
        raise ValueError(f"the files {files} hold different optimizer steps {sorted(map(str, steps))}: more than "
                         "one checkpoint in one folder")
    step = steps.pop()
    # Files written before the ranks' coordinates were recorded are read from this rank's TP coordinate only.
    dense_sources = [state for state in saved if state.get("tp_rank", rank.tp_rank) == rank.tp_rank]
    expert_sources = [state for state in saved if state.get("expert_tp_rank", rank.etp_rank) == rank.etp_rank]
    keys = _parameter_keys(backend)
    with torch.no_grad():
        for dist_opt in _distributed_optimizers(backend.optimizer):
            for model_param in dist_opt.model_param_group_index_map:
                sources = expert_sources if _is_expert(model_param) else dense_sources
                _fill(keys[model_param], model_param, *_held_slices(dist_opt, model_param), sources, step)


def _fill(key: str, model_param: torch.nn.Parameter, held: Any, main_weight: torch.Tensor, state: dict[str, Any],
          saved: list[dict[str, Any]], step: float | None) -> None:
    targets = {MAIN_WEIGHT: main_weight, **{k: v for k, v in state.items() if k != STEP}}
    covered = 0
    for file_state in saved:
        piece = file_state["pieces"].get(key)
        if piece is None:
            continue
        if piece["numel"] != model_param.numel():
            raise ValueError(f"{key}: saved with {piece['numel']} elements, the model has {model_param.numel()}")
        if piece.keys() - {"start", "end", "numel"} != targets.keys():
            raise ValueError(f"{key}: saved optimizer state {sorted(piece.keys())}, this optimizer holds "
                             f"{sorted(targets.keys())}")
        low, high = max(held.start, piece["start"]), min(held.end, piece["end"])
        if low >= high:
            continue
        for name, target in targets.items():
            source = piece[name][low - piece["start"] : high - piece["start"]]
            target[low - held.start : high - held.start].copy_(source)
        covered += high - low
    if covered != held.end - held.start:
        raise ValueError(f"{key}: the checkpoint's files cover {covered} of the {held.end - held.start} elements "
                         f"[{held.start}, {held.end}) this rank holds")
    if step is not None:
        state[STEP] = torch.tensor(step, dtype=torch.float32)  # one tensor per parameter: Adam adds to it in place
