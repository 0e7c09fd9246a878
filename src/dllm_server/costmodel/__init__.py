"""What work costs: step-time models, worker speed, work-ahead pricing and the simulator's cost models."""
