"""Vision-language models on the workers: which folders hold one, their image processing, their forward inputs."""
