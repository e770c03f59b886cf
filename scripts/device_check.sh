#!/usr/bin/env bash
# GPU device check, one prepared run of at most ~8 minutes on a machine with an NVIDIA GPU:
#   1. install (skipped when the packages are already importable),
#   2. the tests that need CUDA (tests/test_devices.py: learner on cuda, fp32 and mixed precision, search),
#   3. the learner's efficiency on the Pong conv network on the GPU (bench_learner),
#   4. Pong throughput, sync vs async with 1 and 2 collectors, learner on the GPU (bench_throughput).
# Usage: bash scripts/device_check.sh [WALL_S_PER_PIPELINE]   (default 60)
set -uo pipefail
cd "$(dirname "$0")/.."
WALL=${1:-60}
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if ! $PY -c "import muzero_tune, ray, gymnasium, ale_py" 2>/dev/null; then
  $PY -m pip install -q -e ".[test,atari]" || echo "install failed: continuing with what is importable"
fi
$PY - <<'PYEOF'
import torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
PYEOF
echo "== CUDA tests"
timeout 120 $PY -m pytest -q tests/test_devices.py
echo "== learner on the Pong conv net (batch 256, K=5, SSL on)"
timeout 150 $PY scripts/bench_learner.py --preset pong_muzero --set learn.device=cuda --steps 20 --rounds 2
echo "== Pong throughput, sync vs async (learner on cuda, actors on CPU)"
timeout $((WALL * 3 + 120)) $PY scripts/bench_throughput.py --preset pong_muzero --wall-s "$WALL" --collectors 1 2 \
  --set learn.device=cuda --set mcts.num_simulations=50 --set learn.train_start_after_envsteps=500 \
  --set env.collector_env_num=8
