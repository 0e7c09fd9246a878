"""Cluster reconfiguration (DiLaServe): capacity table, stage 1 and 2 ILPs, planner, and the shared regroup."""
