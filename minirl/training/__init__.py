"""One run: TrainConfig, its checks, the trainer step, SFT warm-up, checkpoints, resume, run logs
and plots. The driver that picks the loop is ``minirl.driver``: this package never imports
``minirl.scale_out``."""
