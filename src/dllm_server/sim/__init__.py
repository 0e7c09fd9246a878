"""A discrete-event cluster simulator that runs our own scheduling code (the front's Scheduler and
each worker's WorkerCore) on a virtual clock, replacing only the model forward and the KV
transport (docs/simulation.md):

- cluster.py: the event loop and the Simulator; stepper.py: the Stepper it gives each WorkerCore;
  transport.py: the KV transport stand-in under worker/handoff.py;
- behaviour.py: how requests denoise (parametric from published figures, or replayed traces);
- cost.py, gpu_cost.py: iteration and transfer times (fitted to this CPU; GPU rooflines);
- workload.py: workloads from loadgen's generators; calibrate.py: the CPU fit; plan.py: the planner.
"""
