# Two commands do all the setup on a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Keyed on what the install builds from: pyproject.toml and the native fast paths' C source.
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml setup.py guard/policy/_speedups.c guard/server/decode/_otlpnative.c guard/server/decode/_otlp_*.h guard/server/applier/_applynative.c guard/server/applier/_apply_end.h guard/policy/_native_common.h guard/policy/_slots.h guard/policy/_kernels.h guard/store/_rowsnative.c | cksum | cut -d' ' -f1)

# Every test run is replayable from one seed: the hash seed, the test order (pytest-randomly)
# and hypothesis's draws all come from TEST_SEED, printed at the start of the run. Replay a run
# with `make test TEST_SEED=<the printed seed>`.
ifndef TEST_SEED
TEST_SEED := $(shell od -An -N4 -tu4 /dev/urandom | tr -d ' ')
endif
# Bytecode is cached even where the environment sets PYTHONDONTWRITEBYTECODE: otherwise each
# xdist worker and every guard/agent process a test starts compiles guard's sources again, and
# pytest rewrites every test module again (the caches stay in the ignored __pycache__ folders).
# LangSmith's pytest plugin (installed with LangChain) is not used by the suite: not loading it
# saves each pytest process a second of imports.
PYTEST_SEEDED = PYTHONHASHSEED=$(TEST_SEED) PYTHONDONTWRITEBYTECODE= $(PY) -m pytest \
	-p no:langsmith_plugin --randomly-seed=$(TEST_SEED) --hypothesis-seed=$(TEST_SEED) \
	--durations=15
PYTEST_ARGS ?=

.PHONY: demo test test-exhaustive test-asan lint format docs docs-serve diagrams docs-assets bench proto clean

$(STAMP): pyproject.toml setup.py guard/policy/_speedups.c guard/server/decode/_otlpnative.c guard/server/decode/_otlp_*.h guard/server/applier/_applynative.c guard/server/applier/_apply_end.h guard/policy/_native_common.h guard/policy/_slots.h guard/policy/_kernels.h guard/store/_rowsnative.c
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo ">> installing otel-guard and its dependencies into $(VENV) (first run takes a few minutes)"
	$(PY) -m pip install --upgrade --progress-bar on pip
	@# a native extension that fails to build must not leave an older build in its place
	@find guard -name '*$(shell $(PYTHON) -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")' -delete
	$(PY) -m pip install --progress-bar on -e '.[dev]'
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/otel-guard demo

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The documentation site (mkdocs.yml), built strict: a broken link, a page missing from the nav
# or an API-reference warning fails it. The policy-file and CLI references are generated from
# the code at build time. `make docs-serve` previews it on http://127.0.0.1:8000.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir .site

docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --strict

# The architecture diagram, from its text source (Graphviz; tests/test_docs.py checks that the
# checked-in SVG is what dot draws from it).
diagrams:
	dot -Tsvg docs/assets/architecture.dot -o docs/assets/architecture.svg

# The demo's stop-reason chart on the site, drawn by a real demo run (about a minute).
docs-assets: $(STAMP) diagrams
	@dir=$$(mktemp -d) && $(VENV)/bin/otel-guard demo --data-dir $$dir && \
		cp $$dir/stop_reasons.png docs/assets/stop-reasons.png && rm -rf $$dir

# Two tiers: the core suite, then the framework integrations (real frameworks streaming from a
# local model server), whose per-test timeout is sized for a loaded machine. Both always run;
# the target fails if either did.
FRAMEWORK_TIMEOUT_S ?= 600
test: lint docs
	@echo ">> test seed $(TEST_SEED) (replay: make test TEST_SEED=$(TEST_SEED))"
	@status=0; \
	echo ">> core tier"; \
	$(PYTEST_SEEDED) -n 2 --dist loadfile --ignore=tests/integrations $(PYTEST_ARGS) || status=1; \
	echo ">> framework tier (timeout $(FRAMEWORK_TIMEOUT_S) s per test)"; \
	$(PYTEST_SEEDED) -n 2 --dist loadfile --timeout $(FRAMEWORK_TIMEOUT_S) tests/integrations \
		$(PYTEST_ARGS) || status=1; \
	exit $$status

# Every property with ten times its examples (the hypothesis profile "exhaustive").
test-exhaustive: $(STAMP)
	@echo ">> test seed $(TEST_SEED) (replay: make test-exhaustive TEST_SEED=$(TEST_SEED))"
	OTEL_GUARD_HYPOTHESIS_PROFILE=exhaustive $(PYTEST_SEEDED) -n 2 --dist loadfile \
		--timeout 1800 tests/policy tests/server tests/store tests/redisstate $(PYTEST_ARGS)

# The native extensions built with ASan+UBSan into a scratch copy (the in-place build is left
# alone), then the native differential tests and tests/native (hostile objects) under them:
# any sanitizer report fails it (scripts/asan.sh).
test-asan: $(STAMP)
	PY=$(PY) bash scripts/asan.sh $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) benchmarks/run_all.py --out benchmarks/results.json

# Regenerate the checked-in gRPC stubs from proto/ (tests/test_proto_drift.py fails when they drift).
proto: $(STAMP)
	$(PY) -m guard.v1._generate

# The sdist and this machine's manylinux binary wheel in dist/ (docs/install.md). Every native
# extension must compile: the build fails rather than ship a wheel without one.
.PHONY: wheel wheel-check
wheel: $(STAMP)
	$(PY) scripts/build_wheel.py --dist dist

# dist/'s wheel and sdist, each installed into a fresh venv with no C compiler on PATH: the
# native paths, the CLI and serve's warning are checked; one JSON line, non-zero on a failure.
wheel-check: $(STAMP)
	$(PY) scripts/check_wheel.py --dist dist

# The container image ghcr.io/otel-guard/otel-guard:<version> (docs/deploy/image.md): docker
# when a daemon answers, else buildah on local Debian bases; prints its size and build time.
# image-test runs the built image as the Helm chart does (root, buildah; tests/image).
.PHONY: image image-test
image:
	bash scripts/image.sh

image-test: $(STAMP)
	OTEL_GUARD_IMAGE_TEST=1 $(PY) -m pytest -p no:randomly -v --timeout 900 tests/image $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .otel-guard .pytest_cache .site
