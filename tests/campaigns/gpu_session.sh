#!/usr/bin/env bash
# One GPU session's checks in one call (the device tool's machine: torch, transformers, peft and
# accelerate installed; the other wheels carried in .whl/): install, `mmrl bench gpu` within a
# budget, then the GPU-marked tests. Results and logs land in $OUT (or ./gpu-out).
#   [BENCH_GROUPS=full,lora] [CACHES=static,static_plain,dynamic] [TOWERS=trained,frozen] [TRL=defaults,best]
#   [REPEATS=3] [STEPS=5] bash tests/campaigns/gpu_session.sh [BENCH_BUDGET_S] [TEST_TIMEOUT_S]
# (the speed rows: every row REPEATS times of one warm-up + STEPS steps; size a call to one pair, TOWERS=frozen)
# (TEST_TIMEOUT_S 0: no tests)
set -o pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
BUDGET=${1:-420}; TESTS=${2:-100}
BENCH_GROUPS=${BENCH_GROUPS:-full,fit448,optimizers,lora,generator}; CACHES=${CACHES:-dynamic,static,static_plain,vllm}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >"$OUT/pip.log" 2>&1 || echo "wheel install failed: see pip.log"
  export PYTHONPATH=/tmp/site
  python3 -c "import torchao" 2>/dev/null || { echo "torchao does not import here: removed (adamw_bf16_sr rows fail)"; rm -rf /tmp/site/torchao*; }
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$OUT/pip.log" 2>&1 || {
  echo "editable install failed: installing a copy"; python3 -m pip install -q --no-deps --no-build-isolation --target /tmp/site . >>"$OUT/pip.log" 2>&1; }
python3 -c "import torch, transformers, peft, accelerate, trl, datasets, diffusers, mmrl
print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__, 'trl', trl.__version__,
      'datasets', datasets.__version__, 'diffusers', diffusers.__version__, torch.cuda.get_device_name())"
timeout $((BUDGET + 40)) python3 -m mmrl bench gpu --budget "$BUDGET" --steps "${STEPS:-5}" --warmup 1 \
  --repeats "${REPEATS:-3}" --towers "${TOWERS:-trained,frozen}" --trl "${TRL:-defaults,best}" --caches "$CACHES" \
  --groups "$BENCH_GROUPS" --out /tmp/bench 2>&1 | tee "$OUT/bench.log" | grep -v "Loading weights"
cp /tmp/bench/speed.md /tmp/bench/speed.json /tmp/bench/rows.jsonl "$OUT/" 2>/dev/null
if [ "$TESTS" -gt 0 ]; then
  timeout "$TESTS" python3 -m pytest -m gpu tests/test_gpu.py tests/test_static_cache.py tests/test_image_preprocessing.py \
    -q -p no:cacheprovider --no-header 2>&1 | tee "$OUT/tests.log" | tail -15
fi
