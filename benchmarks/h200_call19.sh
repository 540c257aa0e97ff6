# Device call 19 (nvidia-h200; session 6): eager sampler calls served by cached CUDA graphs (eager_graphs=True).
#   1. GPU tests of the replay (new tests/test_replay_eager_graphs_gpu.py) and of the DQN module / inductor paths
#      (their eager GPU updates sample through the graph-served calls now)
#   2. replay_eager.py (host time piece by piece, graphs vs launches) and replay.py ours rows at N=1e6, B=256
source benchmarks/h200_setup.sh || exit 1
FINAL=$OUT; W=/tmp/w; mkdir -p $W/r; pack() { tar czf $FINAL/results.tgz -C $W .; }
timeout 200 python3 -m pytest -q -m gpu tests/test_replay_eager_graphs_gpu.py tests/test_replay_gpu.py \
  tests/test_ext_kernels_gpu.py tests/test_dqn_module.py tests/test_dqn_inductor.py -p no:cacheprovider --tb=short \
  > $W/gpu_tests.log 2>&1; pack
cd benchmarks
timeout 100 python3 replay_eager.py --out $W/r/replay_eager.json > $W/replay_eager.log 2>&1; pack
timeout 150 python3 replay.py --family ours --sizes 1e6 --batches 256 --out $W/r/replay_ours.json > $W/replay.log 2>&1; pack
tail -n 25 $W/gpu_tests.log; head -16 $W/replay_eager.log; tail -n 16 $W/replay.log
