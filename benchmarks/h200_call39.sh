# Device call 39 (nvidia-h200; session 8): the write kernel's fold runs from registers (priorities and counters
# loaded at the start); GPU tests of the kernels and replay (the eager-graphs file three times: call 37's flake),
# replay.py ours at 1e6 and 1e7 + TorchRL at 1e6 (merged), kernel profile at 1e6
source benchmarks/h200_setup.sh > /dev/null 2>&1 || exit 1
FINAL=$OUT; W=/tmp/w39; mkdir -p $W/r; pack() { tar czf $FINAL/results.tgz -C $W .; }
timeout 120 python3 -m pytest -q -m gpu tests/test_ext_kernels_gpu.py tests/test_ext_device_rng.py tests/test_ext_kernels.py \
  tests/test_replay_gpu.py tests/test_replay_eager_graphs_gpu.py -p no:cacheprovider --tb=short > $W/gpu_tests_kernels.log 2>&1; pack
for i in 1 2; do timeout 40 python3 -m pytest -q -m gpu tests/test_replay_eager_graphs_gpu.py -p no:cacheprovider --tb=short \
  > $W/gpu_tests_eager_graphs_$i.log 2>&1; done; pack
cd benchmarks
timeout 150 python3 replay.py --family ours --sizes 1e6,1e7 --batches 256 --out $W/r/replay_ours.json > $W/replay_ours.log 2>&1; pack
PYTHONPATH=/tmp/anchor:$PYTHONPATH timeout 60 python3 replay.py --family torchrl --sizes 1e6 --batches 256 \
  --out $W/r/replay_torchrl.json > $W/replay_torchrl.log 2>&1; pack
python3 replay.py --merge $W/r/replay_ours.json $W/r/replay_torchrl.json --out $W/r/replay_merged.json > /dev/null 2>&1; pack
timeout 50 python3 profile_kernels.py --out $W/r/profile_kernels.txt > $W/profile_kernels.log 2>&1; pack
tail -n 2 $W/gpu_tests_kernels.log $W/gpu_tests_eager_graphs_*.log; cat $W/r/replay_merged.md; grep -A6 "^== graph" $W/r/profile_kernels.txt
