"""Worker side: KV pages, admission policy, the model runner and the per-iteration core."""
