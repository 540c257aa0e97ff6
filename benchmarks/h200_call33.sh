# Device call 33 (nvidia-h200; session 7): every GPU test (one GPU) on the session's final code (eager graphs paused
# during capture warm-ups, write counters made with the sampler, rank graphs once the ring is full)
source benchmarks/h200_setup.sh > /dev/null 2>&1 || exit 1
FINAL=$OUT; W=/tmp/w33; mkdir -p $W; pack() { tar czf $FINAL/results.tgz -C $W .; }
timeout 200 python3 -m pytest -q -m gpu tests -p no:cacheprovider --tb=short --deselect tests/test_ddp_gpu.py \
  > $W/gpu_tests_all.log 2>&1; pack
tail -n 6 $W/gpu_tests_all.log
