#!/usr/bin/env bash
# One prepared run on a lent GPU machine for issue 16. Usage, from the repo root:
#   OUT=/some/dir bash benchmarks/device_check_16.sh
# Needs python3 with jax, numpyro, optax, pytest and the wheels in .gpu_wheels/ (arviz,
# xarray, xarray-einstats, h5netcdf, platformdirs, cloudpickle, pytest-xdist, execnet).
# 1. card and versions; 2. draws against sample_batch_size and the cost floor (10 000
# sonar / madelon draws; the default batch sized to the device); 3. the speed benchmark
# (SVI step and draws vs AutoDAIS and the floor); 4. scaling on the GPU; 5. start-up
# beside AutoNormal; 6. the draw, sharding and usage tests on the GPU.
source "$(dirname "$0")/device_env.sh"
step() { local t=$1 name=$2; shift 2; timeout "$t" "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$?" | tee -a "$OUT/$name.log"; tail -4 "$OUT/$name.log"; }
step 100 draw_batch python3 -m benchmarks.draw_batch --datasets sonar madelon --num-draws 10000 --batch-sizes 1024 4096 16384 --repeats 5 --name draw_batch_gpu
step 130 speed python3 -m benchmarks.speed --datasets sonar madelon --runs 1 --repeats 5 --num-draws 10000 --memory-K 64 --name speed_gpu_16
step 70 scaling python3 -m benchmarks.scaling --platform gpu --devices 1 --draws 16384 --particles 64 --repeats 10 --name scaling_gpu
step 80 startup python3 -m benchmarks.startup --models hierarchical_logistic --repeats 1 --name startup_gpu
step 120 tests python3 -m pytest -o addopts="" -m "not slow" -n 4 -q -p no:cacheprovider tests/test_draw_batches.py tests/test_sharding.py tests/test_guide_usage.py tests/test_save_resume.py
ls "$OUT/results"
