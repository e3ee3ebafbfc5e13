#!/usr/bin/env bash
# One prepared run on a lent GPU machine (issues 12 and 13). Usage, from the repo root:
#   OUT=/some/dir bash benchmarks/device_check.sh
# Needs python3 with jax, numpyro, optax, pytest, xarray, pandas, matplotlib, h5py, and
# the wheels in .gpu_wheels/ (arviz, xarray-einstats, h5netcdf, platformdirs, cloudpickle,
# pytest-xdist, execnet), since that machine reaches no package index.
# 1. card and versions; 2. the guide, core, estimator, save/resume and any-model tests ON
# THE GPU (the divergence tests among them); 3. the speed benchmark on the GPU (step with
# the divergence check on / off); 4. the issue-13 reruns on that machine's 16 CPU cores in
# parallel (small sequential models are faster on CPU than on a GPU).
source "$(dirname "$0")/device_env.sh"

# issue-13 reruns on CPU, in the background
cpu() { JAX_PLATFORMS=cpu timeout "$1" python3 -m "${@:2}"; }
(cpu 430 benchmarks.student_t --dims 20 200 --K 16 64 128 --protocols default --no-dais --name student_t_after_drift_fix_d20_200 > "$OUT/st_a.log" 2>&1) &
(cpu 430 benchmarks.student_t --dims 500 --K 16 64 128 --protocols default --no-dais --name student_t_after_drift_fix_d500 > "$OUT/st_b.log" 2>&1) &
for ds in sonar ionosphere; do for seed in 0 1; do
  (cpu 430 benchmarks.logistic --datasets $ds --K 64 --extrapolate 256 --seeds $seed --methods 'plain VI' 'UHA (all)' 'UHA (all, extrapolated)' --name after_drift_fix_${ds}_s$seed > "$OUT/lr_${ds}_$seed.log" 2>&1) &
done; done
for seed in 0 1; do
  (cpu 430 benchmarks.logistic --datasets brownian_motion --K 64 --extrapolate 256 --seeds $seed --methods 'plain VI' 'UHA (all)' 'UHA (all, extrapolated)' --name after_drift_fix_brownian_s$seed > "$OUT/bm_$seed.log" 2>&1) &
done

# tests on the GPU
timeout 240 python3 -m pytest -o addopts="" -m "not slow" -n 4 -q -p no:cacheprovider \
  tests/test_guide_errors.py tests/test_save_resume.py tests/test_any_model.py tests/core \
  tests/test_guide_usage.py tests/test_estimators.py > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" >> "$OUT/gpu_tests.log"
tail -5 "$OUT/gpu_tests.log"

# speed on the GPU
timeout 150 python3 -m benchmarks.speed --datasets sonar madelon --runs 1 --repeats 5 --num-draws 10000 --memory-K 64 --name speed_gpu > "$OUT/speed.log" 2>&1
echo "speed rc=$?" >> "$OUT/speed.log"
tail -3 "$OUT/speed.log"
wait
ls "$OUT/results"
