# Sourced by the benchmarks/device_check*.sh scripts on a lent GPU machine: the output
# folder ($OUT, with results/ for the benchmarks' JSON and markdown), the environment the
# benchmarks and tests run in, the wheels that machine has no index for (in .gpu_wheels/),
# and the card and versions in $OUT/versions.txt.
set -u
OUT=${OUT:-/tmp/device_out}
mkdir -p "$OUT/results"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONPATH=$PWD
export NUMPYRO_UHA_RESULTS_DIR="$OUT/results"
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 --version
  python3 -m pip install -q --no-deps --no-index .gpu_wheels/*.whl 2>&1 | tail -2
  python3 -c "import jax, jaxlib, numpyro, optax, arviz; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'numpyro', numpyro.__version__, 'optax', optax.__version__, 'arviz', arviz.__version__); print(jax.devices())"
} > "$OUT/versions.txt" 2>&1
cat "$OUT/versions.txt"
