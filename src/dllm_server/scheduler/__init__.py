"""The central scheduler: the request and worker tables, routing (placement.py), leases, the
disaggregated handoff state machine, and the Scheduler that composes them."""
