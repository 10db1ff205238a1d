#!/usr/bin/env bash
# The gpuq demo: a private daemon on fake GPUs (or the real ones, if NVML sees
# any), a few real jobs including a small PyTorch training run on the CPU,
# shown packed and queued, then their results. Leaves nothing running.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$here/.venv/bin/python}"
gpuq() { "$python" -m gpuq.cli.entry "$@"; }
say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
# A word the shell would split or expand is shown in single quotes, so that a
# command can be copied from the demo's output and run.
quoted() {
  local word out=()
  for word in "$@"; do
    case $word in
      '' | *[!A-Za-z0-9_./:=%,+@-]*) out+=("'${word//\'/\'\\\'\'}'") ;;
      *) out+=("$word") ;;
    esac
  done
  printf '%s' "${out[*]}"
}
run() { say "gpuq $(quoted "$@")"; gpuq "$@"; }

work="$(mktemp -d /tmp/gpuq-demo.XXXXXX)"
export GPUQ_CONFIG="$work/config.toml"
if "$python" -c 'from gpuq.gpus import GpuConfig, make_backend; make_backend(GpuConfig(backend="nvml"))' 2>/dev/null; then
  gpus='backend = "nvml"'
  echo "NVML sees GPUs: the demo uses them."
else
  gpus='backend = "fake"
[[gpus.fake]]
name = "Fake 24G"
memory = "24G"
count = 2'
  echo "No GPU here: the demo declares two fake 24G GPUs."
fi
cat > "$GPUQ_CONFIG" <<TOML
[daemon]
state_dir = "$work/state"
runtime_dir = "$work/run"
kill_grace = "2s"
[gpus]
$gpus
TOML
cleanup() { gpuq daemon stop >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
cd "$here"

say "gpuq submit --name mlp --gpu-mem 6G -- python examples/mlp/train.py"
train=$(gpuq submit -q --name mlp --gpu-mem 6G -- "$python" examples/mlp/train.py --steps 400)
for i in 1 2 3 4; do
  say "gpuq submit --name pack$i --gpu-mem 8G -- sleep 8"
  gpuq submit --name "pack$i" --gpu-mem 8G -- sleep 8
done
run submit --name whole --gpus 1 -- sh -c 'echo whole GPU: $CUDA_VISIBLE_DEVICES'
run submit --name sweep --gpus 0 --array 0-3%2 -- sh -c 'echo sweep task $GPUQ_ARRAY_INDEX'
run submit --name flaky --gpus 0 --retries 1 -- sh -c 'exit 3'
run submit --name report --gpus 0 --after "$train" -- sh -c 'echo training finished; date'
# Show the queue once the four packed jobs run (starting takes a moment on a busy machine).
for _ in $(seq 150); do
  packed=$(gpuq ls --json --name pack | "$python" -c \
    'import json,sys; print(sum(j["state"] == "running" for j in json.load(sys.stdin)["jobs"]))')
  [ "$packed" -ge 4 ] && break
  sleep 0.2
done
run ls
run gpus
say "gpuq wait $train   # block until the training job ends"
gpuq wait "$train" >/dev/null
run logs "$train"
say "gpuq wait (every job)"
ids=$(gpuq ls --all --json | "$python" -c 'import json,sys; print(" ".join(str(j["id"]) for j in json.load(sys.stdin)["jobs"]))')
gpuq wait $ids >/dev/null || true
run ls --all
run show "$(gpuq ls --all --name flaky --json | "$python" -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["id"])')"
