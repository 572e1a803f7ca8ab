"""`bfspo train`: the trainer config, the training loop, checkpoints and torchrun data parallelism."""
