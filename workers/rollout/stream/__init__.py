"""Asynchronous rollout on vLLM (rollout.async_training=true): engines generate continuously into a bounded stream of
finished prompt groups while the trainer trains, and take new weights between two engine steps.

- `jobs.py`: `TurnJob` (one model turn, each token tagged with the weights version that sampled it) and
  `ContinuousEngine` (vLLM's `LLMEngine` stepped one step at a time; parks and resumes turns around updates);
- `episodes.py`: one response of a prompt (single turn, or a multi-turn agent conversation) and the group of
  `rollout.n` responses that finishes together;
- `generation_stream.py`: the background thread driving the engine, its inbox of prompt groups, its outbox of
  finished groups, and the pause the weight sync takes;
- `worker_methods.py`: the rollout worker's methods the driver calls.
"""
