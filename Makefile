# Set-up and the everyday commands. Every target installs what it needs first (once).
PY ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=
# test processes side by side: much of the suite waits on env processes, Ray nodes and timeouts, so
# two keep a 2-core machine busy (-n 0: one process)
TEST_JOBS ?= 2
PYTEST := $(BIN)/python -m pytest -n $(TEST_JOBS) --dist loadscope
# byte-compiled once, before the tests: where PYTHONDONTWRITEBYTECODE is set, each of the hundreds of
# processes the tests start would compile marlkit's sources again (about 0.3 s of CPU each)
COMPILE := $(BIN)/python -m compileall -q marlkit tests > /dev/null

.PHONY: install train test test-fast test-exact benchmark docs clean

$(BIN)/.installed: setup.cfg pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first and pinned: pip must never resolve another (CUDA) build
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[all]"
	# mlagents-envs 1.1.0 declares Python <= 3.10.12 and old numpy/protobuf/grpcio pins, yet runs on 3.11
	# with today's versions: install it without its metadata, its runtime needs (the unity extra) with
	# pins that fit tensorboard, then rewrite its protobuf modules for protobuf >= 4
	$(BIN)/pip install --quiet --no-deps --ignore-requires-python mlagents-envs==1.1.0
	$(BIN)/pip install --quiet -e ".[unity]"
	$(BIN)/python -m marlkit.envs.unity.protos
	touch $@

install: $(BIN)/.installed

train: install  ## MAPPO on the embedded default env, mpe_spread (2M env steps)
	$(BIN)/marlkit --agent MAPPO --env mpe_spread $(ARGS)

test: install  ## the test suite (also runs both examples on a tiny budget)
	@$(COMPILE)
	$(PYTEST) $(ARGS)

# the inner loop: every test but those marked slow (learning runs, real clusters, games, timeouts)
test-fast: install
	@$(COMPILE)
	$(PYTEST) -m "not slow" $(ARGS)

# the tests that assert bit-identical results, under every ATen CPU capability this CPU can run
# besides its own, which `make test` used (torch's kernels for each round differently; a claim of
# exactness must hold under each): with several, one test process per capability, each running
# every exact test (pytest-xdist's --dist each), side by side; with one (an AVX2 CPU), TEST_JOBS
# processes under it share the exact tests out, as make test shares the suite
test-exact: install
	@$(COMPILE)
	@native=$$($(BIN)/python -c "import torch; print(torch.backends.cpu.get_cpu_capability().lower())"); \
	case $$native in avx512) caps="default,avx2";; avx2) caps="default";; *) caps="";; esac; \
	if [ -z "$$caps" ]; then echo "exact tests: no capability below this CPU's ($$native), which make test used"; \
	else echo "exact tests under ATEN_CPU_CAPABILITY=$$caps (this CPU: $$native, which make test used)"; \
	n=$$(echo $$caps | tr , ' ' | wc -w); \
	if [ $$n -eq 1 ]; then export ATEN_CPU_CAPABILITY=$$caps; dist="-n $(TEST_JOBS) --dist load"; \
	else dist="-n $$n --dist each"; fi; \
	MARLKIT_EXACT_CAPABILITIES=$$caps $(BIN)/python -m pytest $$dist -m exact $(ARGS); fi

benchmark: install  ## throughput: MAPPO training vs raw env stepping
	$(BIN)/python benchmarks/throughput.py $(ARGS)

docs: install  ## run the commands whose outputs the docs quote, and rewrite those samples
	$(BIN)/python docs/samples.py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
