"""Device assignment rules that need no GPU to check."""
import pytest

from dllm_server.devices import check_gpu_count


def test_gpu_count_rule_for_nccl_handoffs():
    """NCCL refuses two ranks on one GPU: placements that hand KV over need a GPU per worker."""
    check_gpu_count("colocated", 4, 1)                 # colocated workers share round-robin
    check_gpu_count("disaggregated", 2, 2)
    for placement in ("disaggregated", "hybrid"):
        with pytest.raises(ValueError, match="one GPU per worker"):
            check_gpu_count(placement, 2, 1)
