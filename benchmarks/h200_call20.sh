# Device call 20 (nvidia-h200; session 6):
#   1. GPU tests: the replay tests under torchrl 0.11.1 + tensordict 0.11 (after the storage fixes) and under
#      torchrl 0.14.1 (x3: the former CUDA failure of a batch longer than the ring was intermittent); the DQN
#      module tests (new: full-scope graph updates, priority update on a side stream, equal eager updates)
#   2. benchmarks/dqn.py ours, autotune, 8 updates per graph (rows with and without the side-stream priorities)
source benchmarks/h200_setup.sh || exit 1
FINAL=$OUT; W=/tmp/w; mkdir -p $W/r; pack() { tar czf $FINAL/results.tgz -C $W .; }
RT="tests/test_replay_contract.py tests/test_replay_direct_paths.py tests/test_replay_gather.py tests/test_replay_gpu.py"
PYTHONPATH=/tmp/anchor:$PYTHONPATH timeout 100 python3 -m pytest -q $RT -p no:cacheprovider --tb=short \
  > $W/replay_tests_torchrl011.log 2>&1; pack
for i in 1 2 3; do timeout 60 python3 -m pytest -q tests/test_replay_direct_paths.py -p no:cacheprovider --tb=short \
  > $W/direct_paths_$i.log 2>&1; done
timeout 150 python3 -m pytest -q -m gpu tests/test_dqn_module.py tests/test_dqn_inductor.py -p no:cacheprovider \
  --tb=short > $W/gpu_tests_dqn.log 2>&1; pack
cd benchmarks
timeout 330 python3 dqn.py --family ours --autotune --no-fit --per-graph 8 --out $W/r/dqn_ours.json > $W/dqn_ours.log 2>&1; pack
tail -n 4 $W/replay_tests_torchrl011.log; tail -n 1 $W/direct_paths_*.log; tail -n 3 $W/gpu_tests_dqn.log; cat $W/r/dqn_ours.md
