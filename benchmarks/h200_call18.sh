# Device call 18 (nvidia-h200; session 6): where the eager replay step's host time goes (replay_eager.py), and the
# replay tests against torchrl 0.11.1 + tensordict 0.11 (the oldest supported), not re-run since their import fix.
source benchmarks/h200_setup.sh || exit 1
FINAL=$OUT; W=/tmp/w; mkdir -p $W/r; pack() { tar czf $FINAL/results.tgz -C $W .; }
(cd benchmarks && timeout 150 python3 replay_eager.py --out $W/r/replay_eager.json > $W/replay_eager.log 2>&1); pack
PYTHONPATH=/tmp/anchor:$PYTHONPATH timeout 150 python3 -m pytest -q tests/test_replay_contract.py \
  tests/test_replay_direct_paths.py tests/test_replay_gather.py tests/test_replay_gpu.py -p no:cacheprovider --tb=short \
  > $W/replay_tests_torchrl011.log 2>&1; pack
python3 -c "import triton, torch; print(triton.__version__, torch.__version__)"
cat $W/replay_eager.log | head -60; tail -n 15 $W/replay_tests_torchrl011.log
