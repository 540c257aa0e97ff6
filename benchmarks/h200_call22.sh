# Device call 22 (nvidia-h200; session 6):
#   1. the GA3C graph-mode parity test with capturable Adam (tolerance of its device-side bias correction)
#   2. benchmarks/dqn.py ours, autotune, 8 updates per graph: pipelined replay work (side stream) vs serial
#   3. replay at N=1e6, B=256: ours (eager calls served by cached graphs, after the packing / generator changes)
#      + TorchRL's prioritized and uniform buffers (torchrl 0.11.1); replay_eager.py (host time per piece)
source benchmarks/h200_setup.sh || exit 1
FINAL=$OUT; W=/tmp/w; mkdir -p $W/r; pack() { tar czf $FINAL/results.tgz -C $W .; }
timeout 60 python3 -m pytest -q -m gpu tests/test_ga3c_graph.py -k "equal_eager" -p no:cacheprovider --tb=short \
  > $W/gpu_tests.log 2>&1; pack
cd benchmarks
timeout 300 python3 dqn.py --family ours --autotune --no-fit --per-graph 8 --out $W/r/dqn_ours.json > $W/dqn_ours.log 2>&1; pack
timeout 120 python3 replay.py --family ours --sizes 1e6 --batches 256 --out $W/r/replay_ours.json > $W/replay_ours.log 2>&1; pack
PYTHONPATH=/tmp/anchor:$PYTHONPATH timeout 45 python3 replay.py --family torchrl --sizes 1e6 --batches 256 \
  --out $W/r/replay_torchrl.json > $W/replay_torchrl.log 2>&1; pack
python3 replay.py --merge $W/r/replay_ours.json $W/r/replay_torchrl.json --out $W/r/replay_1e6.json > /dev/null 2>&1; pack
timeout 60 python3 replay_eager.py --out $W/r/replay_eager.json > $W/replay_eager.log 2>&1; pack
tail -n 3 $W/gpu_tests.log; cat $W/r/dqn_ours.md; cat $W/r/replay_1e6.md; head -14 $W/replay_eager.log
