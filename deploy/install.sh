#!/bin/sh
# Install Ringmaster as users get it, from a built wheel or sdist (`python -m build`), into the
# Python environment of $PYTHON (python3 by default): the CPU build of torch first (pinned: an
# unpinned torch pulls several GB of CUDA packages), then the package itself.
#
# deploy/Dockerfile runs exactly this, and tests/project/test_installed.py runs it into fresh
# virtual environments (the wheel and the sdist), so the image and the test install the same way.
#
#   sh deploy/install.sh dist/ringmaster-VERSION-py3-none-any.whl          # or the .tar.gz
#   sh deploy/install.sh "dist/ringmaster-VERSION-py3-none-any.whl[docs]"  # with an extra
#
# TORCH_INDEX: where torch comes from (the image sets PyTorch's CPU index); unset, pip's own
# configuration decides.
set -eu
if [ "$#" -ne 1 ]; then
  echo "usage: sh deploy/install.sh WHEEL-OR-SDIST[EXTRAS]  (build one with: python -m build)" >&2
  exit 2
fi
PYTHON=${PYTHON:-python3}
if [ -n "${TORCH_INDEX:-}" ]; then
  "$PYTHON" -m pip install --no-cache-dir --disable-pip-version-check "torch==2.13.0" --index-url "$TORCH_INDEX"
else
  "$PYTHON" -m pip install --no-cache-dir --disable-pip-version-check "torch==2.13.0"
fi
"$PYTHON" -m pip install --no-cache-dir --disable-pip-version-check "$1"
