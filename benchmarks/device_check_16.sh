#!/usr/bin/env bash
# One prepared run on a lent GPU machine for issue 16. Usage, from the repo root:
#   OUT=/some/dir bash benchmarks/device_check_16.sh
# Needs python3 with jax, numpyro, optax, pytest, pytest-xdist, xarray and cloudpickle (the
# H200 image has them) and the wheels in .gpu_wheels/ (carry it), made here with
#   echo /.gpu_wheels/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 -d .gpu_wheels \
#     arviz==0.23.4 xarray-einstats==0.9.1 h5netcdf==1.8.2 platformdirs==4.14.8
# 1. card and versions; 2. draws against sample_batch_size and the cost floor (10 000
# sonar / madelon draws; the default batch sized to the device); 3. the speed benchmark
# (SVI step and draws vs AutoDAIS and the floor); 4. scaling on the GPU; 5. start-up
# beside AutoNormal, and with the warm start's model-free steps on the host CPU
# (warm_start_device="cpu": is it faster there? then make it the GPU default); 6. one draw
# call taken apart (benchmarks.draw_overhead); 7. the draw, sharding, usage,
# weight-summary and warm-start-device tests on the GPU. Everything under $OUT ends in
# $OUT/all.tgz: the device tool brings back at most 8 files. About 8 minutes on an H200.
source "$(dirname "$0")/device_env.sh"
step() { local t=$1 name=$2; shift 2; timeout "$t" "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$?" | tee -a "$OUT/$name.log"; tail -4 "$OUT/$name.log"; }
step 100 draw_batch python3 -m benchmarks.draw_batch --datasets sonar madelon --num-draws 10000 --batch-sizes 1024 4096 16384 --repeats 5 --name draw_batch_gpu
step 130 speed python3 -m benchmarks.speed --datasets sonar madelon --runs 1 --repeats 5 --num-draws 10000 --memory-K 64 --name speed_gpu_16
step 70 scaling python3 -m benchmarks.scaling --platform gpu --devices 1 --draws 16384 --particles 64 --repeats 10 --name scaling_gpu
step 150 startup python3 -m benchmarks.startup --models hierarchical_logistic --repeats 2 --warm-start-device cpu --name startup_gpu
step 60 draw_overhead python3 -m benchmarks.draw_overhead --repeats 30 --name draw_overhead_gpu
step 150 tests python3 -m pytest -o addopts="" -m "not slow" -n 4 -q -p no:cacheprovider tests/test_draw_batches.py tests/test_sharding.py tests/test_guide_usage.py tests/test_save_resume.py tests/test_weight_summary.py tests/test_warm_start_device.py
ls "$OUT/results"
(cd "$OUT" && tar czf all.tgz --exclude=all.tgz -- * && find . -type f ! -name all.tgz -delete)
