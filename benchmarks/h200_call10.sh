# Device call 10 (nvidia-h200, the last minutes of the session's device time): replay.py at N = 1e6, B = 256,
# ours (with the 16-steps-per-launch rows) then TorchRL 0.11.1 in the same call; $OUT/results.tgz after each.
source benchmarks/h200_setup.sh || exit 1
FINAL=$OUT; W=/tmp/w; mkdir -p $W/r; pack() { tar czf $FINAL/results.tgz -C $W .; }
cd benchmarks
timeout 90 python3 replay.py --family ours --sizes 1e6 --batches 256 --out $W/r/ours.json > $W/replay_ours.log 2>&1; pack
PYTHONPATH=/tmp/anchor:$PYTHONPATH timeout 45 python3 replay.py --family torchrl --sizes 1e6 --batches 256 --out $W/r/trl.json > $W/replay_trl.log 2>&1
python3 replay.py --merge $W/r/ours.json $W/r/trl.json --out $W/replay.json > /dev/null 2>&1; pack
cat $W/replay.md 2>/dev/null || tail -20 $W/replay_ours.log
