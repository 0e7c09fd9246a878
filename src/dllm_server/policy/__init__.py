"""Decode policy of the front process: which commit rule each block runs with.

- base.py: the DecodePolicy interface, FixedPolicy (today's rule) and ThresholdSchedule.
- slo.py: SLOPolicy (DiLaServe): per block, the highest candidate threshold whose predicted
  remaining latency fits the request's SLO, under a cluster-wide cap from load control.
  It composes pure parts: progress.py (what a request's denoising looks like so far, the
  predictor's features), predictor.py (remaining forwards), thresholds.py (the choice) and
  load_control.py (the cap); iteration times come from costmodel/.
"""

from ..config import ServerConfig


def make_policy(config: ServerConfig, model_folder, load=None):
    """The decode policy a server runs, from its config (and trace mode around it); `load`: the
    scheduler's WorkerLoadModel, shared with the SLO policy."""
    from .base import FixedPolicy
    if config.threshold_policy == "slo":
        from .predictor import load_predictor
        from .slo import SLOPolicy
        policy = SLOPolicy(config, load_predictor(config.step_predictor, model_folder), load)
    else:
        policy = FixedPolicy(config.threshold)
    if config.trace_dir is not None:
        from .tracing import TracingPolicy
        policy = TracingPolicy(policy, config.trace_dir, config.candidate_thresholds)
    return policy
