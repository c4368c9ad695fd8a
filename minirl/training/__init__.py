"""One run: TrainConfig, its checks, the trainer step, SFT warm-up, checkpoints, resume, run logs
and plots, and the driver that picks the loop."""
