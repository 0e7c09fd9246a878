"""Model code: LLaDA and Dream architectures, loading HF checkpoint folders, tiny checkpoints."""
