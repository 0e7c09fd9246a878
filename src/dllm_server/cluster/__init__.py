"""Cluster changes (DiLaServe's reconfiguration): the capacity table, stage 1 and stage 2 ILPs, the
periodic planner, and the regroup that the server and the simulator both run."""
