# Device call 35 (nvidia-h200; session 8): the GPU tests changed for the device RNG (kernel vs reference sampler
# fed the documented Philox uniforms); warps per program of the sample + gather and write kernels (tune_warps.py)
source benchmarks/h200_setup.sh > /dev/null 2>&1 || exit 1
FINAL=$OUT; W=/tmp/w35; mkdir -p $W/r; pack() { tar czf $FINAL/results.tgz -C $W .; }
timeout 150 python3 -m pytest -q -m gpu tests/test_ext_kernels_gpu.py tests/test_ext_device_rng.py tests/test_ext_kernels.py \
  tests/test_replay_eager_graphs_gpu.py tests/test_replay_gather.py tests/test_replay_gpu.py -p no:cacheprovider --tb=short \
  > $W/gpu_tests_rng.log 2>&1; pack
cd benchmarks
timeout 240 python3 tune_warps.py --sizes 1e6,1e7 --out $W/r/tune_warps.json > $W/tune_warps.log 2>&1; pack
tail -n 4 $W/gpu_tests_rng.log; cat $W/tune_warps.log
