"""HTTP layer: OpenAI-compatible routes, SSE, errors, auth and metrics over AsyncEngine."""
