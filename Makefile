# INRI: make demo | make test | make bench. Each target creates .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench lint clean venv dist install-check

venv: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[analysis,sim,test,distributor]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/inri demo
	@echo
	@echo "The seed's exact six-relay figure, same engine, in memory on a virtual clock (inri demo --virtual):"
	$(BIN)/inri demo --virtual
	@echo
	@echo 'The same engine at scale: a 50-relay simulated mesh (inri-sim run tiny-50), summary as JSON:'
	$(BIN)/inri-sim run tiny-50 --progress off

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests

bench: $(STAMP)
	sh benchmarks/install_bench_deps.sh
	$(BIN)/python -m pip install -q -e '.[bench]'
	HYPOTHESIS_PROFILE=full $(BIN)/python benchmarks/run_all.py

# The wheel and the sdist an operator installs without a package index (docs/operations.md, "Install"):
# the wheel is built from the sdist, so a file the sdist forgets fails here.
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m build --outdir dist .
	@ls -l dist

# The operator's path from the built wheel (tests/test_install.py): a fresh venv outside the checkout,
# `inri-bootstrap init`, `inri relay init` x3, the daemons started from the written configs, a push.
install-check: dist
	INRI_INSTALL_CHECK=1 $(BIN)/python -m pytest -q -p no:cacheprovider tests/test_install.py

lint: $(STAMP)
	$(BIN)/ruff check inri bootstrap_nodes simulations spark_analysis tests benchmarks fuzz
	$(BIN)/mypy inri bootstrap_nodes simulations spark_analysis benchmarks fuzz
	$(BIN)/python .ci/check_commits.py  # subjects <= 72 characters, no wip (since the rule began)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .hypothesis spark-warehouse metastore_db
