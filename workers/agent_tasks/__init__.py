"""Built-in multi-turn tool tasks (environments the config names as `workers.agent_tasks.<module>:<Class>`)."""
