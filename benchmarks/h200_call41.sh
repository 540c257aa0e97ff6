# Device call 41 (nvidia-h200; session 8): the device RNG's counter store after a barrier (every warp reads the count
# first: calls 37 and 40 had one eager-graphs comparison each whose draws differed; a late warp could read the
# stored count); the tests that compare draws, twice
source benchmarks/h200_setup.sh > /dev/null 2>&1 || exit 1
mkdir -p $OUT
for i in 1 2; do timeout 40 python3 -m pytest -q -m gpu tests/test_replay_eager_graphs_gpu.py tests/test_ext_device_rng.py \
  -p no:cacheprovider --tb=short 2>&1 | tail -n 3 | tee -a $OUT/gpu_tests_call41.log; done
