"""Decode policy of the front process: the commit rule each block runs with. base.py holds the fixed rules;
slo.py the SLO policy, built from progress, predictor, thresholds and load_control (step times: costmodel/)."""
from ..config import ServerConfig


def make_policy(config: ServerConfig, model_folder, load=None):
    """The server's decode policy from its config; `load` is the scheduler's WorkerLoadModel, shared with SLOPolicy."""
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
