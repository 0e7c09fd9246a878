"""Structured output: a JSON schema or regex compiled into a token automaton, and the per-block dynamic
program that keeps a diffusion canvas completable (docs/structured_output.md)."""
