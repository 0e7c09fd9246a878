"""What work costs: a worker's step-time model and speed, pricing the work ahead of a request, and
the simulator's fitted (CPU) and roofline (GPU) iteration cost models."""
