"""Worker of the strategy tests: each method exercises one strategy method on every rank and reports
what the test asserts (importable by Ray workers through PYTHONPATH)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from transformers import AutoModelForCausalLM

from single_controller import Dispatch, Worker, register
from workers.head_log_probs import chunkable_head, logits_chunk_tokens, set_logits_chunk_tokens
from workers.strategy import get_strategy

LR = 1e-2


def _batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank-specific rows, left-padded (the first row of rank 1 has two padding tokens)."""
    generator = torch.Generator().manual_seed(100 + rank)
    ids = torch.randint(3, 60, (3, 12), generator=generator)
    mask = torch.ones_like(ids)
    if rank == 1:
        ids[0, :2], mask[0, :2] = 0, 0
    return ids, mask


def _full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for n, p in model.named_parameters()}


def _manual_fsdp(model_path: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The FSDP2 setup a user would write by hand: shard each decoder layer, then the root; AdamW."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=LR)


def _loss(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of the real tokens (one plain forward, the same for both models)."""
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, :-1]
    log_probs = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    return -(log_probs * mask[:, 1:]).sum() / mask[:, 1:].sum()


def _manual_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ids: torch.Tensor, mask: torch.Tensor) -> float:
    _loss(model, ids, mask).backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm.full_tensor())


class StrategyProbe(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def setup(self, model_path: str, config: dict) -> None:
        self.model_path = model_path
        self.strategy = get_strategy(config)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        self.model, self.optimizer, _ = self.strategy.prepare(model, optimizer)

    def _strategy_step(self, ids: torch.Tensor, mask: torch.Tensor) -> float:
        self.strategy.backward(_loss(self.model, ids, mask), self.model, self.optimizer)
        return self.strategy.optimizer_step(self.optimizer, self.model, name="actor")

    @register(Dispatch.ONE_TO_ALL)
    def collectives(self) -> dict:
        s, r = self.strategy, self.rank
        return {
            "mean": s.all_reduce(float(r + 1)),
            "sum": s.all_reduce(r + 1, op="sum"),
            "max": s.all_reduce(torch.tensor([r, -r], dtype=torch.float32), op="max"),
            "dict": s.all_reduce({"a": 2.0 * r, "b": torch.tensor(3.0 * r)}, op="mean"),
            "gather_tensor": s.all_gather(torch.full((2, 3), float(r))),
            "gather_scalar_tensor": s.all_gather(torch.tensor(r * 10)),
            "gather_dict": s.all_gather({"rank": r, "name": f"w{r}"}),
            "gather_list": s.all_gather([r] * (r + 1)),
        }

    @register(Dispatch.ONE_TO_ALL)
    def step_against_manual_fsdp(self) -> dict:
        """Two steps of the strategy model and of a hand-written FSDP2 model on the same rows, with an
        optimizer offload / load round trip between the strategy's steps."""
        manual, manual_opt = _manual_fsdp(self.model_path)
        ids, mask = _batch(self.rank)
        norms = [(self._strategy_step(ids, mask), _manual_step(manual, manual_opt, ids, mask))]
        before = {k: {n: t.to_local().clone() if hasattr(t, "to_local") else t.clone() for n, t in v.items()}
                  for k, v in self.optimizer.state.items()}
        objects = [t for v in self.optimizer.state.values() for t in v.values() if t.dim() > 0]
        self.strategy.maybe_offload_optimizer(self.optimizer)
        try:
            self._strategy_step(ids, mask)
            stepped_while_offloaded = True
        except RuntimeError as error:
            stepped_while_offloaded = str(error)
        # offloaded: the device storages are released (their bytes wait in host buffers), the tensors stay
        offloaded = [t for v in self.optimizer.state.values() for t in v.values() if t.dim() > 0]
        released = [t.to_local().untyped_storage().nbytes() == 0 for t in offloaded]
        self.strategy.maybe_load_optimizer(self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        after = {k: {n: t.to_local() if hasattr(t, "to_local") else t for n, t in v.items()} for k, v in self.optimizer.state.items()}
        bit_exact = all(torch.equal(before[k][n], after[k][n]) and before[k][n].dtype == after[k][n].dtype
                        for k in before for n in before[k])
        ids2, mask2 = _batch(self.rank + 7)
        norms.append((self._strategy_step(ids2, mask2), _manual_step(manual, manual_opt, ids2, mask2)))
        ours, theirs = _full_params(self.model), _full_params(manual)
        return {
            "norms": norms,
            "max_param_diff": max((ours[n] - theirs[n]).abs().max().item() for n in ours),
            "params_moved": ours["model.layers.0.mlp.down_proj.weight"].ne(_full_params(AutoModelForCausalLM.from_pretrained(self.model_path))["model.layers.0.mlp.down_proj.weight"]).any().item(),
            "bit_exact": bit_exact,
            "state_released": all(released) and len(released) == len(objects) > 0,
            "same_state_objects": all(a is b for a, b in zip(objects, offloaded, strict=True)),
            "stepped_while_offloaded": stepped_while_offloaded,
            "grad_norm_recorded": self.strategy.grad_norms["actor"],
        }

    @register(Dispatch.ONE_TO_ALL)
    def chunked_against_full_logits(self) -> dict:
        """`sequence_log_probs` (the strategy's logits_chunk_tokens) and its gradients, then the same with the
        full logits; gradients are this rank's shards after FSDP's reduce-scatter."""
        ids, mask = _batch(self.rank)
        chunk = logits_chunk_tokens(self.model)
        results = []
        for tokens in (chunk, 0):
            set_logits_chunk_tokens(self.model, tokens)
            self.optimizer.zero_grad(set_to_none=True)
            log_probs = self.strategy.sequence_log_probs(self.model, ids, mask)
            (log_probs * mask[:, 1:]).sum().backward()
            grads = {n: p.grad.to_local().clone() for n, p in self.model.named_parameters() if p.grad is not None}
            results.append((log_probs.detach(), grads))
        set_logits_chunk_tokens(self.model, chunk)
        self.optimizer.zero_grad(set_to_none=True)
        (chunked, chunked_grads), (full, full_grads) = results
        return {
            "chunk": chunk,
            "chunked_head": chunkable_head(self.model) is not None,  # the head is no FSDP unit of its own
            "values": (chunked - full).abs().max().item(),
            "grads": max((chunked_grads[n] - g).abs().max().item() for n, g in full_grads.items()),
            "same_params": sorted(chunked_grads) == sorted(full_grads),
            "largest_grad": max(g.abs().max().item() for g in full_grads.values()),
        }

    @register(Dispatch.ONE_TO_ALL)
    def checkpoint_round_trip(self, root: str) -> dict:
        ids, mask = _batch(self.rank)
        self._strategy_step(ids, mask)
        folder = self.strategy.save_checkpoint(root, 3, self.model, self.optimizer, client_state={"step": 3}, keep=1)
        saved = _full_params(self.model)
        self._strategy_step(ids, mask)
        changed = max((saved[n] - p).abs().max().item() for n, p in _full_params(self.model).items())
        state = self.strategy.load_checkpoint(root, self.model, self.optimizer)
        restored = max((saved[n] - p).abs().max().item() for n, p in _full_params(self.model).items())
        return {"folder": folder, "client_state": state, "changed": changed, "restored_diff": restored}

    @register(Dispatch.ONE_TO_ALL)
    def engine_round_trip(self, engine_type: str, inference: dict) -> dict:
        """Generate before and after training; check each result against the model's own log-probs of the
        same tokens after the same prompt (a result handed to the wrong prompt would not match)."""
        s = self.strategy
        s.setup_inference_engine(inference, engine_type=engine_type)
        prompts = [[5 + self.rank, 6, 7, 8, 9][: 3 + i] for i in range(2 + self.rank)]  # 2 or 3 prompts, lengths differ
        sampling = {"temperature": 1.0, "max_tokens": 6}

        def generate_and_score() -> float:
            s.wakeup_inference_engine()
            results = s.gather_and_generate(prompts, sampling)
            s.maybe_sleep_inference_engine()
            assert len(results) == len(prompts)
            # One forward over all of this rank's sequences (right-padded): FSDP forwards are collectives.
            sequences = [prompt + result["token_ids"] for prompt, result in zip(prompts, results)]
            width = max(map(len, sequences))
            ids = torch.tensor([seq + [0] * (width - len(seq)) for seq in sequences])
            mask = torch.tensor([[1] * len(seq) + [0] * (width - len(seq)) for seq in sequences])
            with torch.no_grad():
                own = s.sequence_log_probs(self.model, ids, mask).cpu()
            worst = 0.0
            for row, (prompt, result) in enumerate(zip(prompts, results)):
                start = len(prompt) - 1
                scored = own[row, start:start + len(result["token_ids"])]
                worst = max(worst, (scored - torch.tensor(result["log_probs"])).abs().max().item())
            return worst

        s.wakeup_inference_engine()
        s.update_engine_weights(self.model)  # the engine starts from the folder; the model trained in earlier tests
        before = generate_and_score()
        for _ in range(2):
            self._strategy_step(*_batch(self.rank))
        s.wakeup_inference_engine()
        sync = s.update_engine_weights(self.model)
        after = generate_and_score()
        unchanged_update = s.update_engine_weights(self.model)  # nothing stepped: no "must change" check
        return {"before": before, "after": after, "sync": sync, "owns_engine": s.inference.owns_engine,
                "repeat_sync": unchanged_update}

    @register(Dispatch.ONE_TO_ALL)
    def update_with_lost_tensor(self) -> str:
        """A weight stream that drops the embedding must fail verification on every rank."""
        s = self.strategy
        self._strategy_step(*_batch(self.rank))
        source = s.weight_source(self.model)
        stream = source.named_weights

        def lossy(layouts):
            return ((n, t) for n, t in stream(layouts) if n != "model.embed_tokens.weight")

        source.named_weights = lossy
        s.weight_source = lambda model: source
        try:
            s.update_engine_weights(self.model)
        except Exception as error:  # noqa: BLE001 - the test reads the type and message
            return f"{type(error).__name__}: {error}"
        finally:
            del s.weight_source
        return "no error"

    @register(Dispatch.ONE_TO_ALL)
    def world(self) -> int:
        return dist.get_world_size()


class MegatronStrategyProbe(Worker):
    """A strategy given a model folder and settings dicts: the Megatron strategy (TP 2 + sequence parallel on CPU
    through the megatron CPU shim), or the FSDP strategy the same way."""

    @register(Dispatch.ONE_TO_ALL)
    def setup(self, model_path: str, config: dict) -> None:
        self.strategy = get_strategy(config)
        self.model, self.optimizer, self.scheduler = self.strategy.prepare(model_path, {"lr": LR}, {"lr_warmup_steps": 0})

    def _loss(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        log_probs = self.strategy.sequence_log_probs(self.model, ids, mask)
        weights = (mask[:, 1:] * mask[:, :-1]).to(log_probs.device).float()  # real token after real context
        return -(log_probs * weights).sum() / weights.sum()

    def _weights(self) -> dict[str, torch.Tensor]:
        if self.strategy.backend == "fsdp2":
            return _full_params(self.model)
        engine = self.strategy._engine(self.model, "test")
        return {name: t.clone() for name, t in engine.hf_weights(torch.float32)}

    @register(Dispatch.ONE_TO_ALL)
    def step(self, ids: torch.Tensor, mask: torch.Tensor, router_losses: bool = False) -> dict:
        """One step on the batch (every TP rank sees the whole batch); offload / load round trip first. With
        `router_losses`, the routers' losses of the step's forward too (a no-grad forward before it adds none)."""
        self.strategy.maybe_offload_optimizer(self.optimizer)
        self.strategy.maybe_load_optimizer(self.optimizer)
        if router_losses:
            with torch.no_grad():
                self._loss(ids, mask)
        loss = self._loss(ids, mask)
        self.strategy.backward(loss, self.model, self.optimizer)
        grad_norm = self.strategy.optimizer_step(self.optimizer, self.model, self.scheduler, name="actor")
        out = {"loss": loss.item(), "grad_norm": grad_norm, "weights": self._weights(),
               "lr": self.scheduler.get_last_lr()[0], "sum": self.strategy.all_reduce(self.rank + 1, op="sum")}
        if router_losses:
            out["router"] = self.strategy.router_losses(self.model)
        return out

    @register(Dispatch.ONE_TO_ALL)
    def checkpoint_and_engine(self, root: str, model_path: str, ids: torch.Tensor, mask: torch.Tensor) -> dict:
        folder = self.strategy.save_checkpoint(root, 1, self.model, self.optimizer, self.scheduler, client_state={"k": 1})
        saved = self._weights()
        self.strategy.backward(self._loss(ids, mask), self.model, self.optimizer)
        self.strategy.optimizer_step(self.optimizer, self.model, self.scheduler)
        changed = max((saved[n] - t).abs().max().item() for n, t in self._weights().items())
        state = self.strategy.load_checkpoint(folder, self.model, self.optimizer, self.scheduler)
        restored = max((saved[n] - t).abs().max().item() for n, t in self._weights().items())
        self.strategy.setup_inference_engine({"model_path": model_path}, engine_type="hf")
        sync = self.strategy.update_engine_weights(self.model)
        return {"client_state": state, "changed": changed, "restored_diff": restored, "sync": sync}

    @register(Dispatch.ONE_TO_ALL)
    def engine_sync_bound(self, model_path: str) -> dict:
        """The bound the strategy's weight sync checks an HF engine in bf16 against (its tolerance and the share of
        probe tokens allowed over it), after one verified update."""
        self.strategy.setup_inference_engine({"model_path": model_path, "dtype": "bfloat16"}, engine_type="hf")
        sync = self.strategy.update_engine_weights(self.model)
        bound = self.strategy.inference.sync.bound
        return {"tolerance": bound.tolerance, "outliers": bound.outlier_fraction, "sync": sync}
