"""The central scheduler: request and worker tables, routing, leases, the handoff state machine, the Scheduler."""
