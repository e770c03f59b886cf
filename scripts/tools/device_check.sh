#!/usr/bin/env bash
# GPU check: one prepared run of at most ~12 minutes on a CUDA machine: the CUDA paths and their throughput.
#   0. packages: the device machine reaches no package index, so what its image lacks (gymnasium, ale-py, ray
#      and ray's jsonschema) comes in .whl/, built beforehand on this machine by scripts/tools/device_wheels.sh and
#      carried with the call (`carry: [".whl"]`); installed into /tmp/site. On a machine that reaches an
#      index and lacks them, pip installs the project instead;
#   1. the tests that need CUDA (tests/test_devices.py: the learner on cuda in fp32 and mixed precision, search),
#   2. the learner's efficiency on the Pong conv network on the GPU, fp32 and bf16 autocast (bench_learner),
#   3. train steps/s with the learner in process and as 1 learner worker on the GPU (2 where the machine has
#      two GPUs): DDP over NCCL, the driver's share of a step (bench_learner_group),
#   4. Pong throughput, sync vs async with 1 and 2 collectors, learner on the GPU (bench_throughput, 1 round),
#   5. the compiled loss on the GPU (learn.compile, fp32 and with bf16 autocast) against the eager step, on the
#      CartPole network and on $PRESET's at batch 64 (bench_learner_variants; each compile from an empty cache).
# PARTS picks the steps (default "tests learner groups throughput"; "compile" is step 5, about 5 minutes).
# Every step's output also goes to $OUT/device_check.log when $OUT is set (the device tool brings $OUT back).
#
# Usage: bash scripts/tools/device_check.sh [WALL_S_PER_PIPELINE]        (default 45)
#        PARTS="tests compile" bash scripts/tools/device_check.sh       (the CUDA tests and the compiled loss)
#        DEVICE=cpu PRESET=cartpole_muzero bash scripts/tools/device_check.sh 10   (a rehearsal on a CPU machine)
set -uo pipefail
cd "$(dirname "$0")/../.."
WALL=${1:-45}
DEVICE=${DEVICE:-cuda}
PRESET=${PRESET:-pong_muzero}
PARTS=" ${PARTS:-tests learner groups throughput} "
want() { [[ "$PARTS" == *" $1 "* ]]; }
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LOG=${OUT:+$OUT/device_check.log}
LOG=${LOG:-/dev/null}

if ls .whl/*.whl >/dev/null 2>&1; then
  echo "== packages from .whl/ into /tmp/site"
  mkdir -p /tmp/site
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && for t in .whl/*.tar.xz; do tar -xJf "$t" -C /tmp/site; done \
    || { echo "installing .whl/ failed"; exit 1; }
  # the repository itself is imported from here (no install); Ray's workers inherit PYTHONPATH
  export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
elif ! $PY -c "import muzero_tune, ray, gymnasium, ale_py" 2>/dev/null; then
  $PY -m pip install -q -e ".[test,atari]" || echo "install failed: continuing with what is importable"
fi
{
  $PY - <<'PYEOF'
import importlib.metadata as md
import torch
print("torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
for name in ("numpy", "numba", "gymnasium", "ale-py", "ray"):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, "MISSING")
PYEOF
  if want tests; then
    echo "== CUDA tests"
    timeout 240 $PY -m pytest -q -p no:cacheprovider tests/test_devices.py
  fi
  if want learner; then
    echo "== learner on the $PRESET network, learner on $DEVICE: fp32, then bf16 autocast (learn.mixed_precision)"
    timeout 120 $PY scripts/bench/bench_learner.py --preset "$PRESET" --set learn.device="$DEVICE" --steps 20 \
      --rounds 2
    timeout 120 $PY scripts/bench/bench_learner.py --preset "$PRESET" --set learn.device="$DEVICE" \
      --set learn.mixed_precision=true --steps 20 --rounds 2
  fi
  if want groups; then
    # every compared group holds its GPUs at once: 1 learner beside the in-process one, then 2 where 2 GPUs are
    NGPU=$($PY -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
    for LEARNERS in "0 1" $([ "${NGPU:-0}" -ge 2 ] && echo "0_2"); do
      echo "== learner workers on $DEVICE (${LEARNERS/_/ }), $PRESET network at its preset batch"
      timeout 240 $PY scripts/bench/bench_learner_group.py --preset "$PRESET" --set learn.device="$DEVICE" \
        --learners ${LEARNERS/_/ } --steps 10 --rounds 2
    done
  fi
  if want throughput; then
    echo "== $PRESET throughput, sync vs async (learner on $DEVICE, actors on CPU)"
    timeout $((WALL * 3 + 90)) $PY scripts/bench/bench_throughput.py --preset "$PRESET" --wall-s "$WALL" \
      --collectors 1 2 --rounds 1 --set learn.device="$DEVICE" --set mcts.num_simulations=50 \
      --set learn.train_start_after_envsteps=500 --set env.collector_env_num=8 --out-dir /tmp/device_check_runs
  fi
  if want compile; then
    # the eager step, the compiled one (its compile time printed beside it), bf16 autocast with and without it
    VARIANTS=(--variant "compiled:learn.compile=default"
              --variant "compiled_bf16:learn.compile=default,learn.mixed_precision=true"
              --variant "bf16:learn.mixed_precision=true")
    echo "== compiled loss on $DEVICE, cartpole_muzero network, batch 256"
    timeout 240 $PY scripts/bench/bench_learner_variants.py --preset cartpole_muzero --set learn.device="$DEVICE" \
      --steps 20 --rounds 3 "${VARIANTS[@]}"
    echo "== compiled loss on $DEVICE, $PRESET network, batch 64"
    timeout 300 $PY scripts/bench/bench_learner_variants.py --preset "$PRESET" --set learn.device="$DEVICE" \
      --set learn.batch_size=64 --steps 5 --rounds 2 "${VARIANTS[@]}"
  fi
} 2>&1 | tee "$LOG"
