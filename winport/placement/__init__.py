"""GPU budget -> where the routed experts live (`winport plan`, `winport serve --vram-gib N`)."""
