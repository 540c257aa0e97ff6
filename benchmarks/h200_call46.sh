# Device call 46 (nvidia-h200; session 9, the last ~5 minutes of device time): every one-GPU test on the code
# after the new user's trial (refused replay checkpoints checked before loading, with a fresh generator of
# the sampler's device; the CLI's resume rules; GA3C's time limit and shutdown of starting agents).
source benchmarks/h200_setup.sh > /dev/null 2>&1 || exit 1
mkdir -p $OUT
timeout 170 python3 -m pytest -q -m gpu tests -p no:cacheprovider --tb=short --deselect tests/test_ddp_gpu.py \
  > $OUT/gpu_tests_call46_all.log 2>&1
tail -n 4 $OUT/gpu_tests_call46_all.log; grep -A12 "^____" $OUT/gpu_tests_call46_all.log | head -40
