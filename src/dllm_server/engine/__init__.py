"""The front process's engine: AsyncEngine composes scheduler, executor and planner behind the API's one surface."""
