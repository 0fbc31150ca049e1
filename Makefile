# Set-up, demo and tests. Every target creates or refreshes the virtual environment first.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DEMO   ?= demo

.PHONY: venv test demo lint bench mutants clean

venv: $(STAMP)

# Re-install when pyproject.toml changes (new dependency) or the venv is missing.
$(STAMP): pyproject.toml
	@test -x $(PY) || "$$(scripts/find-python)" -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,tt]'
	@touch $(STAMP)

test: venv
	$(PY) -m ruff check .
	$(PY) -m pytest -q

demo: venv
	$(VENV)/bin/alpamayo demo --out $(DEMO) --draft lookup

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: venv
	$(PY) benchmarks/text_backbone.py

# Plant each known bug of tests/mutants.py in a copy of the checkout and run the tests that must catch it (after
# an unmutated baseline run); `make test` runs the same set as tests/test_mutation_check.py.
mutants: venv
	$(PY) -m tests.mutants

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
