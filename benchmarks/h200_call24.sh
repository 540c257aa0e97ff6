# Device call 24 (nvidia-h200; session 6): every GPU test after this session's changes (eager graphs in the samplers,
# pipelined DQN graph body, GA3C graph mode, storage fixes). test_ddp_gpu needs two GPUs (skips here).
source benchmarks/h200_setup.sh > /dev/null 2>&1 || exit 1
FINAL=$OUT; W=/tmp/w24; mkdir -p $W; pack() { tar czf $FINAL/results.tgz -C $W .; }
timeout 370 python3 -m pytest -q -m gpu tests -p no:cacheprovider --tb=line --deselect tests/test_ddp_gpu.py \
  > $W/gpu_tests_all.log 2>&1; pack
tail -n 8 $W/gpu_tests_all.log
