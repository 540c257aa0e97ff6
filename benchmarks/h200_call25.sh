# Device call 25 (nvidia-h200; session 6): the GA3C graph-mode tests (x2) after moving predictors to high-priority
# streams (call 24: a predictor on a pooled stream equal to the capture stream failed test_graph_mode_fit_trains_cartpole)
source benchmarks/h200_setup.sh > /dev/null 2>&1 || exit 1
FINAL=$OUT; W=/tmp/w25; mkdir -p $W; pack() { tar czf $FINAL/results.tgz -C $W .; }
for i in 1 2; do timeout 70 python3 -m pytest -q -m gpu tests/test_ga3c_graph.py tests/test_callbacks_gpu.py -p no:cacheprovider \
  --tb=line > $W/gpu_tests_ga3c_$i.log 2>&1; pack; done
tail -n 3 $W/gpu_tests_ga3c_*.log
