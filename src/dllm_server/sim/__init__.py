"""A discrete-event cluster simulator that runs our own scheduling code (the front's Scheduler,
each worker's WorkerCore, the cluster planner and regroup) on a virtual clock, replacing only the
model forward and the KV transport (docs/simulation.md)."""
