#!/usr/bin/env bash
# `make gpu-check`: every GPU path in one call on a bare CUDA box, one table at the end. Each step runs under
# its own time limit and its log stays in $LOGS; a failed step does not stop the next. Exit 1 if any failed.
#   install        scripts/install.sh (the vllm wheel and the torch it pins)
#   gpu tests      pytest -m gpu: NCCL and IPC weight sync with an abort, offload, packed attention on CUDA
#                  against the CPU oracle, TP (skips below 4 GPUs)
#   colocated sync bench.gpu_sync: the shipped model over IPC against the HBM copy floor
#   train          relayrl train on the default recipe, 3 steps
set -uo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
LOGS=${LOGS:-gpu-check-logs}
mkdir -p "$LOGS"
export WANDB_MODE=offline
rows=()
failed=0

step() {  # step <name> <limit s> <command...>: run, time, keep the log's last line as the detail
    local name=$1 limit=$2
    shift 2
    local t0=$SECONDS log="$LOGS/${name// /_}.log" status=ok
    timeout "$limit" "$@" >"$log" 2>&1 || { status="FAIL rc=$?"; failed=1; }
    local detail
    detail=$(grep -v '^\s*$' "$log" | tail -n 1 | cut -c1-110)
    rows+=("| $name | $status | $((SECONDS - t0)) s | ${detail//|/\\|} |")
    echo "gpu-check: $name: $status ($((SECONDS - t0)) s)" >&2
}

nvidia-smi -L >/dev/null 2>&1 || { echo "gpu-check: no CUDA device (nvidia-smi -L failed); run it on a GPU box" >&2; exit 2; }
step install 300 bash scripts/install.sh "$VENV"
step "gpu tests" 300 "$VENV/bin/python" -m pytest -m gpu -q -rs -p no:cacheprovider tests
step "colocated sync" 120 "$VENV/bin/python" -m bench.gpu_sync
sync_table=$(grep '^|' "$LOGS/colocated_sync.log" 2>/dev/null)
step train 180 "$VENV/bin/relayrl" train --config-name grpo_arith run.steps=3 logging.wandb=disabled

echo
nvidia-smi -L | head -n 4
echo "| step | status | time | last line |"
echo "| --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
[ -n "$sync_table" ] && { echo; echo "$sync_table"; }
exit "$failed"
