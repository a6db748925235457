# Set-up and the everyday commands. Every target installs what it needs first (once).
PY ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: install train test benchmark clean

$(BIN)/.installed: setup.cfg pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned: pip must never resolve another (CUDA) build
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[all]"
	touch $@

install: $(BIN)/.installed

train: install  ## MAPPO on the embedded default env, mpe_spread (2M env steps)
	$(BIN)/marlkit --agent MAPPO --env mpe_spread $(ARGS)

test: install  ## the test suite (also runs both examples on a tiny budget)
	$(BIN)/python -m pytest $(ARGS)

benchmark: install  ## throughput: MAPPO training vs raw env stepping
	$(BIN)/python benchmarks/throughput.py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
