"""The process seam: starting worker processes (local subprocesses or Ray actors), the channels to
them (pipes or sockets), liveness and the watchdog, and the worker process's entry point."""
