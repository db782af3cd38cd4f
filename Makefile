# Two commands do all the setup on a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Keyed on what the install builds from: pyproject.toml and the native fast paths' C source.
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml guard/policy/_speedups.c guard/server/_otlpnative.c guard/server/_otlp_*.h guard/server/_applynative.c guard/server/_apply_end.h guard/policy/_slots.h guard/policy/_kernels.h guard/store/_rowsnative.c | cksum | cut -d' ' -f1)

.PHONY: demo test lint format bench proto clean

$(STAMP): pyproject.toml guard/policy/_speedups.c guard/server/_otlpnative.c guard/server/_otlp_*.h guard/server/_applynative.c guard/server/_apply_end.h guard/policy/_slots.h guard/policy/_kernels.h guard/store/_rowsnative.c
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo ">> installing otel-guard and its dependencies into $(VENV) (first run takes a few minutes)"
	$(PY) -m pip install --upgrade --progress-bar on pip
	$(PY) -m pip install --progress-bar on -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/otel-guard demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

test: lint
	$(PY) -m pytest -n 2 --dist loadfile

bench: $(STAMP)
	$(PY) benchmarks/run_all.py --out benchmarks/results.json

# Regenerate the checked-in gRPC stubs from proto/ (tests/test_proto_drift.py fails when they drift).
proto: $(STAMP)
	$(PY) -m guard.v1._generate

clean:
	rm -rf $(VENV) .otel-guard .pytest_cache
