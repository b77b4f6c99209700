# Every target works from a fresh clone: it creates .venv, installs the project with its pinned
# dependencies (constraints.txt) and the pinned local Kinesis (devstack/package-lock.json).
# The servers a target starts are its own children and stop with it, also when interrupted.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
NODE_INSTALLED := devstack/node_modules/.installed
PYTEST_ARGS ?=
# make test runs the suite on this many processes (pytest-xdist), a file per process at a time;
# each starts its own local stack. Three on this machine's two cores: with two, a quarter of the
# CPU sat idle while tests waited on servers and subprocesses (the same commit, quiet: 1,211 s on
# two, 1,030 s on three); four were hardly faster than three (935 s against 942-963 s) and loaded
# kinesis-local past the proxy's bound once. TEST_PROCESSES=0 runs it in this process.
TEST_PROCESSES ?= 3
XDIST := $(if $(filter 0,$(TEST_PROCESSES)),,-n $(TEST_PROCESSES) --dist loadfile)
EFO_CHAOS_ITERATIONS ?= 3
# make chaos also runs the lease plane in simulated time with every fault at random, this many seeds
# (bench/sim_seeds.py: python -m efo.sim seeds in two processes, one per core; every seed runs, and each
# violation is printed with the command that replays its seed; docs/simulation.md lists them).
EFO_SIM_SEEDS ?= 1000
EFO_SIM_FIRST_SEED ?= 1
# The simulation runs with fixed str hashing, as 'python -m efo.sim' does, so a seed a test prints replays.
export PYTHONHASHSEED := 0

.PHONY: install demo demo-stream test test-unit test-integration chaos lint format clean bench bench-quick

install: $(INSTALLED) $(NODE_INSTALLED)

# editable_mode=compat: the project's directory on sys.path (a .pth line), as a wheel's files would be,
# so that Spark's lookup of Python data sources (pkgutil.iter_modules) finds pyspark_efo; setuptools'
# default editable install is an import hook that iter_modules does not see.
$(INSTALLED): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[spark,dev,bench]' --config-settings editable_mode=compat
	touch $@

$(NODE_INSTALLED): devstack/package.json devstack/package-lock.json
	npm ci --prefix devstack --no-audit --no-fund --loglevel=error
	touch $@

demo: install
	$(BIN)/python devstack/demo.py

# efo as a Spark Structured Streaming source (spark.readStream.format("efo")) on the local stack: a
# query into Parquet and a windowed count while a shard splits, then Trigger.AvailableNow.
demo-stream: install
	$(BIN)/python examples/stream_query.py

# Every benchmark in one run (about 15 minutes here, and the fleet section much longer: DynamoDB Local
# at 1,024 x 16 bounded by per-phase timeouts, then the simulated sizes within a budget of 120 minutes,
# bench/run_all.py FLEET_SIM_BUDGET_MIN), written to docs/benchmarks.md; the quick one
# runs tiny sizes in about a minute (its figures mean nothing) to check that the chain works.
bench: install
	$(BIN)/python bench/run_all.py

bench-quick: install
	$(BIN)/python bench/run_all.py --quick --out .efo-bench/benchmarks-quick.md

test: install lint
	$(BIN)/python -m pytest tests $(XDIST) $(PYTEST_ARGS)

test-unit: install
	$(BIN)/python -m pytest tests/unit $(PYTEST_ARGS)

test-integration: install
	$(BIN)/python -m pytest tests/integration $(PYTEST_ARGS)

# Every chaos scenario at full size (tests/chaos; make test runs one iteration of a reduced set),
# EFO_CHAOS_ITERATIONS times each; prints the table and writes it to docs/chaos.md.
# EFO_CHAOS_SEED=<the seed it printed> make chaos replays a run. Then the tests too long for make test
# (marked long: the quick run of every benchmark, 256 shards subscribed at once), and EFO_SIM_SEEDS simulated runs with random faults
# (docs/simulation.md); a violation prints the command that replays its seed.
chaos: install
	EFO_CHAOS_SIZE=full EFO_CHAOS_ITERATIONS=$(EFO_CHAOS_ITERATIONS) EFO_CHAOS_TABLE=docs/chaos.md \
		$(BIN)/python -m pytest tests/chaos $(PYTEST_ARGS)
	EFO_LONG_TESTS=1 $(BIN)/python -m pytest tests -m long $(PYTEST_ARGS)
	EFO_HYPOTHESIS=explore $(BIN)/python -m pytest tests/unit -m "not long" $(PYTEST_ARGS)
	$(BIN)/python bench/sim_seeds.py --count $(EFO_SIM_SEEDS) --first $(EFO_SIM_FIRST_SEED) --out docs/simulation.md

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) devstack/node_modules .efo-dev .efo-bench .pytest_cache .mypy_cache .ruff_cache
