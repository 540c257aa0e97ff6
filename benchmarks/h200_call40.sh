# Device call 40 (nvidia-h200; session 8): the write's global ticket taken right after the block ticket (release;
# the last holder's acquire exchange resets it), the fold in parallel with the block refreshes. GPU tests of the
# kernels (the one-launch write's clash and NaN tests among them); replay.py ours at 1e6 (+ TorchRL, merged)
source benchmarks/h200_setup.sh > /dev/null 2>&1 || exit 1
FINAL=$OUT; W=/tmp/w40; mkdir -p $W/r; pack() { tar czf $FINAL/results.tgz -C $W .; }
timeout 100 python3 -m pytest -q -m gpu tests/test_ext_kernels_gpu.py tests/test_ext_kernels.py tests/test_replay_eager_graphs_gpu.py \
  -p no:cacheprovider --tb=short > $W/gpu_tests_kernels.log 2>&1; pack
cd benchmarks
timeout 70 python3 replay.py --family ours --sizes 1e6 --batches 256 --out $W/r/replay_ours.json > $W/replay_ours.log 2>&1; pack
PYTHONPATH=/tmp/anchor:$PYTHONPATH timeout 45 python3 replay.py --family torchrl --sizes 1e6 --batches 256 \
  --out $W/r/replay_torchrl.json > $W/replay_torchrl.log 2>&1; pack
python3 replay.py --merge $W/r/replay_ours.json $W/r/replay_torchrl.json --out $W/r/replay_merged.json > /dev/null 2>&1; pack
tail -n 2 $W/gpu_tests_kernels.log; grep -B3 -A12 "^____" $W/gpu_tests_kernels.log | head -30; cat $W/r/replay_merged.md
