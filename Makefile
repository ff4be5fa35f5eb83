# The two commands a newcomer needs: `make run` and `make test`. Both bootstrap .venv.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.setup-done
PIP    := $(PY) -m pip install -q --disable-pip-version-check
HTTP   ?= 127.0.0.1:8000
GRPC   ?= 127.0.0.1:8001

.PHONY: setup prepare run test bench lint image

setup: $(STAMP)

# torch first, pinned, so nothing later can pull a CUDA build; then the package with -c.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -c constraints.txt -e ".[export,tools,dev]"
	@# perf_analyzer (bundled in the tritonclient wheel) needs Debian's libb64; the browser
	@# tests drive Debian's chromium through Playwright (no browser download).
	@dpkg -s libb64-0d chromium iproute2 haproxy >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
		(apt-get update -qq && apt-get install -y -qq libb64-0d chromium iproute2 haproxy >/dev/null) || \
		echo "note: install Debian's libb64-0d, chromium, haproxy (perf_analyzer, browser, rolling tests)"; }
	touch $(STAMP)

prepare: setup
	$(VENV)/bin/queryserve prepare

# Serves at once and prepares the models in the background, `embed` first: each model answers as
# soon as it is built; /v2/health/ready answers 503 until the last one.
run: setup
	$(VENV)/bin/queryserve serve --prepare --repository model_repository --http $(HTTP) --grpc $(GRPC)

test: prepare
	$(PY) -m pytest

# The peers (Infinity, Ray Serve, PyTriton) install into their own venvs under .peers/ (once).
bench: prepare
	$(PY) benchmarks/peers/peers.py install
	$(PY) benchmarks/run.py
	$(PY) benchmarks/reliability.py

# The server's image, localhost/queryserve:latest, with the prepared models inside: podman, no
# daemon, no registry (README.md, "Container image"). IMAGE=NAME:TAG names it otherwise.
image: prepare
	deploy/image/build.sh

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/mypy
