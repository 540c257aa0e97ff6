# Device call 32 (nvidia-h200; session 7): after the review mends (write counters made with the sampler's state,
# per-call block checks in the clash test, rank graphs with sort_every 3 and an alpha change): the replay GPU tests
source benchmarks/h200_setup.sh > /dev/null 2>&1 || exit 1
FINAL=$OUT; W=/tmp/w32; mkdir -p $W; pack() { tar czf $FINAL/results.tgz -C $W .; }
timeout 200 python3 -m pytest -q -m gpu tests/test_ext_kernels_gpu.py tests/test_replay_gpu.py \
  tests/test_replay_eager_graphs_gpu.py tests/test_dqn_pipelined.py -p no:cacheprovider --tb=short > $W/gpu_tests.log 2>&1; pack
tail -n 12 $W/gpu_tests.log
