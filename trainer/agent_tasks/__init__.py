"""Built-in multi-turn tool tasks (environments the config names as `trainer.agent_tasks.<module>:<Class>`)."""
