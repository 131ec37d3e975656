"""A reward function that also records which prompt each scored response answers (its `extra_info.index`),
one line per response, in the file named by $RECORDED_PROMPTS: the prompts a run trained on, in order."""

import os

from trainer.rewards.registry import compute_score as rule_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    with open(os.environ["RECORDED_PROMPTS"], "a") as log:
        log.write(f"{extra_info['index']}\n")
    return rule_score(data_source, solution_str, ground_truth, extra_info)
