"""Request side: tokenizer, request state and output assembly (shared by the offline LLM and
the serving engine), the central scheduler and the worker pool."""
