# One-command set-up: `make test` and `make serve` create .venv and install everything.
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU wheel from the local disk; set TORCH_SPEC="torch" (or a CUDA build) on a GPU machine.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: install test test-fast soak serve bench bench-smoke clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q "$(TORCH_SPEC)"
	$(VENV)/bin/pip install -q -e ".[serve,test]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests

# The edit loop: everything but the tests that start real server, worker or container processes
# (the `slow` marker, tests/conftest.py), under 5 minutes on 2 cores.
test-fast: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow" tests

# The reliability suite's long form: a 10-minute soak on the demo model, then the rest of the
# suite; every figure is printed and written to reliability.json (docs/reliability.md).
soak: $(STAMP)
	DLLM_SOAK_S=600 DLLM_RELIABILITY_JSON=reliability.json $(PY) -m pytest -q -p no:cacheprovider tests/reliability

serve: $(STAMP)
	$(VENV)/bin/dllm-server serve

bench: $(STAMP)
	$(PY) -m bench.decoding
	$(PY) -m bench.scheduler
	$(PY) -m bench.http_vs_offline --threads 1
	$(PY) -m bench.handoff

bench-smoke: $(STAMP)
	$(PY) -m bench.smoke

clean:
	rm -rf $(VENV) build *.egg-info
