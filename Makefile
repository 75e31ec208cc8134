# One entry for developers and CI. `make test` is the README's test command.
VENV := .venv
BIN := $(VENV)/bin
TINY_MODEL ?= .models/qwen3_omni_tiny

.PHONY: setup lint test test-fast tiny-model serve clean

setup:
	bash scripts/setup.sh

lint: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python scripts/check_structure.py
	$(BIN)/python scripts/check_conformance.py

test: lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The fast tier for iterating: protocol, config, audio and sessions on the scripted engine;
# no checkpoint, engine or server process (tests/conftest.py marks the rest `slow`).
test-fast: lint
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

tiny-model: setup
	HF_HUB_OFFLINE=1 $(BIN)/vllm-omni make-tiny-model --arch qwen3_omni_moe --out $(TINY_MODEL)

# Serve the tiny checkpoint on CPU (built on first use): ws://127.0.0.1:8000/v1/realtime
serve: setup
	test -f $(TINY_MODEL)/model.safetensors || $(MAKE) tiny-model
	HF_HUB_OFFLINE=1 $(BIN)/vllm-omni serve $(TINY_MODEL) --deploy-config configs/qwen3_omni_tiny_cpu.yaml \
		--host 127.0.0.1 --port 8000 --served-model-name qwen3-omni-tiny

clean:
	rm -rf $(VENV) .models .pytest_cache .ruff_cache
