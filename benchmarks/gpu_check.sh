#!/usr/bin/env bash
# One GPU check for issue 14, sized to finish in < 8 minutes on one CUDA GPU.
#
# Installs nothing from the internet: it uses the python found ($PYTHON, else python3) with the
# torch/transformers already installed there, plus any wheels carried with the tree under
# ./wheels (installed with --no-index). The tree itself is used through PYTHONPATH.
# Writes under $OUT (or ./gpu_results): env.json, cuda_tests.xml + .txt (static step, engine,
# quantized linears' int4 product parity), bench_decode.json,
# bench_agent.json (+ .txt logs), summary.json.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-./gpu_results}"
mkdir -p "$OUT_DIR"
PY="${PYTHON:-python3}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

if compgen -G "wheels/*.whl" > /dev/null; then
  "$PY" -m pip install --no-index --find-links wheels wheels/*.whl > "$OUT_DIR/wheels.txt" 2>&1 \
    || echo "wheel install failed (see wheels.txt)"
fi

"$PY" - > "$OUT_DIR/env.json" <<'PYEOF'
import json, torch
info = {"torch": torch.__version__, "cuda": torch.version.cuda,
        "available": torch.cuda.is_available()}
if torch.cuda.is_available():
    info["device"] = torch.cuda.get_device_name(0)
try:
    import transformers
    info["transformers"] = transformers.__version__
except Exception as exc:  # noqa: BLE001
    info["transformers"] = f"missing: {exc}"
print(json.dumps(info))
PYEOF
cat "$OUT_DIR/env.json"

status=0
timeout 200 "$PY" -m pytest -q -m cuda -p no:cacheprovider \
  integration_tests/test_static_step_devices.py tests/engine/test_engine_devices.py \
  tests/quant/test_device_matmul_devices.py \
  --junitxml "$OUT_DIR/cuda_tests.xml" > "$OUT_DIR/cuda_tests.txt" 2>&1 || status=1
tail -3 "$OUT_DIR/cuda_tests.txt"

timeout 130 "$PY" benchmarks/bench_decode.py --model smollm2 --device cuda --dtype bfloat16 \
  --batch-sizes 1 16 --context 1024 --steps 64 --rounds 3 --static \
  --json-out "$OUT_DIR/bench_decode.json" > "$OUT_DIR/bench_decode.txt" 2>&1 || status=1
tail -4 "$OUT_DIR/bench_decode.txt"

timeout 130 "$PY" benchmarks/bench_agent.py --model smollm2 --device cuda --dtype bfloat16 \
  --rounds 2 > "$OUT_DIR/bench_agent.txt" 2>&1 || status=1
grep '^{' "$OUT_DIR/bench_agent.txt" | tail -1 > "$OUT_DIR/bench_agent.json"
tail -4 "$OUT_DIR/bench_agent.txt"

echo "{\"status\": $status}" > "$OUT_DIR/summary.json"
exit $status
