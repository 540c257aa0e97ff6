# Device call 26 (nvidia-h200; session 7):
#   1. every GPU test (one GPU) with every capture pausing the GC (call 25 failed 5 replay GPU tests mid-suite)
#   2. where the device time of a replay step goes: benchmarks/profile_kernels.py at N=1e6, B=256
#   3. benchmarks/replay.py ours at N=1e6, B=256 (per-dtype output buffers since call 22)
source benchmarks/h200_setup.sh > /dev/null 2>&1 || exit 1
FINAL=$OUT; W=/tmp/w26; mkdir -p $W/r; pack() { tar czf $FINAL/results.tgz -C $W .; }
timeout 240 python3 -m pytest -q -m gpu tests -p no:cacheprovider --tb=short --deselect tests/test_ddp_gpu.py \
  > $W/gpu_tests_all.log 2>&1; pack
cd benchmarks
timeout 120 python3 profile_kernels.py --out $W/r/profile_kernels.txt > $W/profile_kernels.log 2>&1; pack
timeout 150 python3 replay.py --family ours --sizes 1e6 --batches 256 --out $W/r/replay_ours.json > $W/replay_ours.log 2>&1; pack
tail -n 12 $W/gpu_tests_all.log; head -c 6000 $W/r/profile_kernels.txt; cat $W/r/replay_ours.md
