"""A worker whose front died before it ran exits at once instead of waiting (in a rendezvous, say) for a
front that is gone: it compares its parent with the pid the front gave it at spawn."""
import subprocess
import sys

CODE = "import os, sys; from dllm_server.executor.worker_main import _die_with_parent; " \
       "_die_with_parent(int(sys.argv[1])); print('alive')"


def test_a_worker_whose_spawning_front_is_gone_exits_and_one_whose_front_lives_goes_on():
    mine = subprocess.run([sys.executable, "-c", CODE, "0"], capture_output=True, text=True, timeout=60)
    assert mine.returncode == 0 and mine.stdout.strip() == "alive"
    import os
    ours = subprocess.run([sys.executable, "-c", CODE, str(os.getpid())], capture_output=True, text=True, timeout=60)
    assert ours.returncode == 0 and ours.stdout.strip() == "alive"
    gone = subprocess.run([sys.executable, "-c", CODE, "1"], capture_output=True, text=True, timeout=60)
    assert gone.returncode == 1 and gone.stdout == ""       # spawned by pid 1? its front is not its parent now
