#!/usr/bin/env bash
# One prepared run on a lent GPU machine for issue 16. Usage, from the repo root:
#   OUT=/some/dir bash benchmarks/device_check_16.sh
# Needs python3 with jax, numpyro, optax, pytest, pytest-xdist, xarray and cloudpickle (the
# H200 image has them) and the wheels in .gpu_wheels/ (carry it), made here with
#   echo /.gpu_wheels/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 -d .gpu_wheels \
#     arviz==0.23.4 xarray-einstats==0.9.1 h5netcdf==1.8.2 platformdirs==4.14.8
# In order, most wanted first (STEPS="name ..." runs some): 0. xla_flag: whether XLA
# knows the suite's CPU flag; 1. draw_overhead: one draw call taken apart (the untrained
# sonar guide; with the summary made in the device's and the host's memory); 2.
# draw_batch: draws against the cost floor (10 000 sonar / madelon draws); 3. tests: the
# draw, sharding, usage, weight-summary and warm-start-device tests on the GPU; 4.
# startup_compiles: what svi.init compiles, from JAX's compile log; 5. startup:
# start-up beside AutoNormal, with two experiments for the warm start's model-free
# steps: on the host CPU (warm_start_device="cpu") and compiled at XLA's quick GPU options
# (if either is faster on the GPU, make it the GPU default). The speed benchmark (SVI
# step and draws against AutoDAIS: results/gpu_h200_1204) and scaling on one GPU
# (results/gpu_h200*) are left out. Everything under $OUT ends in $OUT/all.tgz: the
# device tool brings back at most 8 files. About 8 minutes on an H200, at most BUDGET
# (520) seconds: run it with the tool's timeout_s at 560.
source "$(dirname "$0")/device_env.sh"
# Each step within its own limit and within BUDGET seconds in all (the device tool's
# per-call limit is 600 s): a step that would not fit is cut short or skipped, and the
# results are packed at the end whatever happened.
BUDGET=${BUDGET:-520}
# STEPS: the names of the steps to run (default: all)
STEPS=${STEPS:-"xla_flag draw_overhead draw_batch tests startup_compiles startup"}
step() {
  local t=$1 name=$2; shift 2
  case " $STEPS " in *" $name "*) ;; *) return ;; esac
  local left=$((BUDGET - SECONDS - 15))
  if [ "$left" -lt 20 ]; then echo "$name skipped: budget spent" | tee "$OUT/$name.log"; return; fi
  [ "$t" -gt "$left" ] && t=$left
  timeout "$t" "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$? (limit ${t}s)" | tee -a "$OUT/$name.log"; tail -4 "$OUT/$name.log"
}
# Whether this jaxlib's XLA knows the CPU flag the suite and the quick steps ask for (XLA
# aborts a process on an unknown flag in XLA_FLAGS: on 2026-12-04 every test worker died
# at its start on jaxlib 0.11.2; the suite and the package now leave such a flag out).
step 30 xla_flag env XLA_FLAGS=--xla_cpu_use_fusion_emitters=false python3 -c "import jax; print(jax.numpy.zeros(()).block_until_ready(), jax.devices('cpu'))"
step 60 draw_overhead python3 -m benchmarks.draw_overhead --repeats 30 --name draw_overhead_gpu
step 100 draw_batch python3 -m benchmarks.draw_batch --datasets sonar madelon --num-draws 10000 --batch-sizes 16384 --repeats 5 --name draw_batch_gpu
step 150 tests python3 -m pytest -o addopts="" -m "not slow" -n 4 --max-worker-restart=0 -q -p no:cacheprovider tests/test_suite_flags.py tests/core/test_xla_options.py tests/test_draw_batches.py tests/test_draw_call_params.py tests/test_sharding.py tests/test_guide_usage.py tests/test_save_resume.py tests/test_weight_summary.py tests/test_biased_draws.py tests/test_warm_start_device.py tests/test_xla_fused_reduction.py tests/test_laplace_start.py
step 90 startup_compiles python3 -m benchmarks.startup_compiles --model hierarchical_logistic --quick-gpu-options --name startup_compiles_gpu
# 7 fresh processes of ~15 s each on the H200 (2 repeats did not fit 200 s on 2026-12-04)
step 150 startup python3 -m benchmarks.startup --models hierarchical_logistic --repeats 1 --warm-start-device cpu --quick-gpu-options --name startup_gpu
ls "$OUT/results"
(cd "$OUT" && tar czf all.tgz --exclude=all.tgz -- * && find . -type f ! -name all.tgz -delete)
