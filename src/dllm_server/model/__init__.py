"""Model code: LLaDA, Dream and SDAR architectures, attention backends, HF checkpoint loading, tiny checkpoints."""
