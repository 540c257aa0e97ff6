# Device call 42 (nvidia-h200; session 9): the main job's learner on the final code (device RNG: the DQN graph
# registers no generator with the compiled sampler). benchmarks/dqn.py ours (Inductor autotuned, 8 updates per
# graph; call 37's run of this spent its 150-s limit in autotuning), TorchRL's row in its interpreter, merged;
# then the dqn-fit row alone (the DQN LightningModule under Trainer.fit, graph mode)
source benchmarks/h200_setup.sh > /dev/null 2>&1 || exit 1
FINAL=$OUT; W=/tmp/w42; mkdir -p $W/r; pack() { tar czf $FINAL/results.tgz -C $W .; }
cd benchmarks
timeout 320 python3 dqn.py --family ours --autotune --no-fit --per-graph 8 --out $W/r/dqn_ours.json > $W/dqn_ours.log 2>&1; pack
PYTHONPATH=/tmp/anchor:$PYTHONPATH timeout 60 python3 dqn.py --family torchrl --out $W/r/dqn_torchrl.json > $W/dqn_torchrl.log 2>&1; pack
python3 dqn.py --merge $W/r/dqn_ours.json $W/r/dqn_torchrl.json --out $W/r/dqn_merged.json > /dev/null 2>&1; pack
timeout 150 python3 dqn.py --fit-only --out $W/r/dqn_fit.json > $W/dqn_fit.log 2>&1; pack
cat $W/r/dqn_merged.md; tail -n 3 $W/dqn_ours.log $W/dqn_torchrl.log; cat $W/r/dqn_fit.md; tail -n 3 $W/dqn_fit.log
