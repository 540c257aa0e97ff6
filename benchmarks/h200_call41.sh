# Device call 41 (nvidia-h200; session 9; a call 41 planned at the end of session 8 was refused, no device time
# left, and never ran): the final kernel code (the device RNG's counter stored after a barrier, the domain word,
# 64-bit seeds, the self-check of the device-RNG kernels) on the GPU:
#   1. the tests that compare graph-served with launched draws and the device-RNG tests, four times (the race
#      that the barrier fixes showed in ~1 of 6 runs); 2. every GPU test (one GPU); 3. replay.py ours at 1e6
#      and 1e7 + TorchRL at 1e6 (merged); 4. the host floor under the eager step (host_floor.py)
source benchmarks/h200_setup.sh > /dev/null 2>&1 || exit 1
FINAL=$OUT; W=/tmp/w41; mkdir -p $W/r; pack() { tar czf $FINAL/results.tgz -C $W .; }
for i in 1 2 3 4; do timeout 60 python3 -m pytest -q -m gpu tests/test_replay_eager_graphs_gpu.py tests/test_ext_device_rng.py \
  -p no:cacheprovider --tb=short >> $W/gpu_tests_rng_x4.log 2>&1; tail -n 1 $W/gpu_tests_rng_x4.log; done; pack
timeout 200 python3 -m pytest -q -m gpu tests -p no:cacheprovider --tb=short --deselect tests/test_ddp_gpu.py \
  > $W/gpu_tests_all.log 2>&1; pack
tail -n 3 $W/gpu_tests_all.log; grep -A12 "^____" $W/gpu_tests_all.log | head -30
cd benchmarks
timeout 170 python3 replay.py --family ours --sizes 1e6,1e7 --batches 256 --out $W/r/replay_ours.json > $W/replay_ours.log 2>&1; pack
PYTHONPATH=/tmp/anchor:$PYTHONPATH timeout 50 python3 replay.py --family torchrl --sizes 1e6 --batches 256 \
  --out $W/r/replay_torchrl.json > $W/replay_torchrl.log 2>&1; pack
python3 replay.py --merge $W/r/replay_ours.json $W/r/replay_torchrl.json --out $W/r/replay_merged.json > /dev/null 2>&1; pack
timeout 50 python3 host_floor.py --cprofile --out $W/r/host_floor.json > $W/host_floor.log 2>&1; pack
cat $W/r/replay_merged.md; head -n 14 $W/host_floor.log; tail -n 3 $W/replay_ours.log
