"""A discrete-event cluster simulator: our own scheduler, worker cores, planner and regroup on a virtual clock,
with only the forward and the KV transport simulated (docs/simulation.md)."""
