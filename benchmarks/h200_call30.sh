# Device call 30 (nvidia-h200; session 7): the rank-based sampler on the kernels backend beside the proportional
# one (replay.py ours at 1e6, one run), and benchmarks/dqn.py ours (autotune, 8 per graph) after the one-launch write
source benchmarks/h200_setup.sh > /dev/null 2>&1 || exit 1
FINAL=$OUT; W=/tmp/w30; mkdir -p $W/r; pack() { tar czf $FINAL/results.tgz -C $W .; }
cd benchmarks
timeout 150 python3 replay.py --family ours --sizes 1e6 --batches 256 --out $W/r/replay_ours.json > $W/replay_ours.log 2>&1; pack
timeout 300 python3 dqn.py --family ours --autotune --no-fit --per-graph 8 --out $W/r/dqn_ours.json > $W/dqn_ours.log 2>&1; pack
cat $W/r/replay_ours.md; cat $W/r/dqn_ours.md; tail -3 $W/dqn_ours.log
