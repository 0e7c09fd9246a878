"""The front process's engine: AsyncEngine composes the scheduler, the executor and the cluster
planner loop behind the one surface the API uses."""
