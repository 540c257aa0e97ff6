# Device call 28 (nvidia-h200; session 7): the one-launch priority write without atomics (block owners; NaN default over the batch)
#   1. GPU tests of the kernels and the replay core
#   2. device time per kernel (profile_kernels.py); 3. replay.py ours at 1e6 and 1e7 + TorchRL at 1e6 (merged);

source benchmarks/h200_setup.sh > /dev/null 2>&1 || exit 1
FINAL=$OUT; W=/tmp/w28; mkdir -p $W/r; pack() { tar czf $FINAL/results.tgz -C $W .; }
timeout 150 python3 -m pytest -q -m gpu tests/test_ext_kernels_gpu.py tests/test_replay_gpu.py \
  tests/test_replay_eager_graphs_gpu.py -p no:cacheprovider --tb=short > $W/gpu_tests.log 2>&1; pack
cd benchmarks
timeout 90 python3 profile_kernels.py --out $W/r/profile_kernels.txt > $W/profile_kernels.log 2>&1; pack
timeout 200 python3 replay.py --family ours --sizes 1e6,1e7 --batches 256 --out $W/r/replay_ours.json > $W/replay_ours.log 2>&1; pack
PYTHONPATH=/tmp/anchor:$PYTHONPATH timeout 60 python3 replay.py --family torchrl --sizes 1e6 --batches 256 \
  --out $W/r/replay_torchrl.json > $W/replay_torchrl.log 2>&1; pack
python3 replay.py --merge $W/r/replay_ours.json $W/r/replay_torchrl.json --out $W/r/replay_merged.json > /dev/null 2>&1; pack

tail -n 6 $W/gpu_tests.log; grep -A9 "^== " $W/r/profile_kernels.txt | head -40; cat $W/r/replay_merged.md
