# Device call 2 (one H200): GPU tests, replay benchmark (ours + TorchRL 0.11.1 anchor), DQN update benchmark.
source benchmarks/h200_setup.sh || exit 1
FINAL=$OUT; OUT=/tmp/w; mkdir -p $OUT; trap "tar czf $FINAL/results.tgz -C /tmp/w ." EXIT
timeout 220 python3 -m pytest -q -m gpu tests/ -p no:cacheprovider --timeout 150 -W ignore::DeprecationWarning > $OUT/pytest_gpu.log 2>&1
tail -15 $OUT/pytest_gpu.log
cd benchmarks; mkdir -p $OUT/r
timeout 40 python3 profile_step.py --capacity 1000000 --batch 256 --reps 5 --cprofile --out $OUT/profile.txt > /dev/null 2>&1
timeout 130 python3 replay.py --family ours --sizes 1e5,1e6,1e7 --batches 256 --out $OUT/r/ours.json > $OUT/replay_ours.log 2>&1
PYTHONPATH=/tmp/anchor timeout 90 python3 replay.py --family torchrl --sizes 1e5,1e6,1e7 --batches 256 --out $OUT/r/trl.json > $OUT/replay_trl.log 2>&1
python3 replay.py --merge $OUT/r/ours.json $OUT/r/trl.json --out $OUT/replay.json | tail -20
timeout 150 python3 dqn.py --family ours --out $OUT/r/dqn_ours.json > $OUT/dqn_ours.log 2>&1
PYTHONPATH=/tmp/anchor timeout 60 python3 dqn.py --family torchrl --out $OUT/r/dqn_trl.json > $OUT/dqn_trl.log 2>&1
python3 dqn.py --merge $OUT/r/dqn_ours.json $OUT/r/dqn_trl.json --out $OUT/dqn.json
tail -5 $OUT/replay_trl.log $OUT/dqn_ours.log $OUT/dqn_trl.log
