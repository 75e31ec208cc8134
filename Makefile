# One entry for developers and CI. `make test` is the README's test command.
VENV := .venv
BIN := $(VENV)/bin
TINY_MODEL ?= .models/qwen3_omni_tiny

.PHONY: setup lint test tiny-model clean

setup:
	bash scripts/setup.sh

lint: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports

test: lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

tiny-model: setup
	HF_HUB_OFFLINE=1 $(BIN)/vllm-omni make-tiny-model --arch qwen3_omni_moe --out $(TINY_MODEL)

clean:
	rm -rf $(VENV) .models .pytest_cache .ruff_cache
