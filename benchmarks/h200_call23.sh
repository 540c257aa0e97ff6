# Device call 23 (nvidia-h200, 16 cores, alone; session 6): GA3C graph mode with more agents than cores (agents wait
# for predictions: 16 x 16 kept 10.7 of 16 cores busy in call 21), and the capturable-Adam parity test.
source benchmarks/h200_setup.sh || exit 1
FINAL=$OUT; W=/tmp/w; mkdir -p $W/r; pack() { tar czf $FINAL/results.tgz -C $W .; }
timeout 40 python3 -m pytest -q -m gpu tests/test_ga3c_graph.py -k "equal_eager" -p no:cacheprovider --tb=short \
  > $W/gpu_tests.log 2>&1; pack
cd benchmarks
timeout 80 python3 ga3c.py --rows ga3c-static --cuda-graph --agents 24 --max-agents 32 --seconds 20 --warmup 15 \
  --out $W/r/ga3c_graph_24x16.json > $W/ga3c_24.log 2>&1; pack
timeout 80 python3 ga3c.py --rows ga3c-static --cuda-graph --agents 32 --max-agents 32 --seconds 20 --warmup 15 \
  --out $W/r/ga3c_graph_32x16.json > $W/ga3c_32.log 2>&1; pack
tail -n 2 $W/gpu_tests.log; cat $W/r/*.md
