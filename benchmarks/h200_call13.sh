# Device call 13 (nvidia-h200-x2, session 4, the last ~11 minutes of device time). $OUT/results.tgz after every stage.
#   GPU 0, cores 0-15:  DQN Pong (configs/dqn_pong.yaml + Inductor, 32 envs x 8 updates per Lightning step, 8 updates
#                       per CUDA graph) after the fix that zeroes gradients between the updates of one graph
#   GPU 1, cores 16-31: GPU tests of the DQN/replay changes; benchmarks/dqn.py (ours incl. autotune and x8 rows, then
#                       TorchRL 0.11.1's prioritized buffer with the same learner); replay.py at N = 1e6 (ours, TorchRL)
source benchmarks/h200_setup.sh || exit 1
FINAL=$OUT; W=/tmp/w; mkdir -p $W/r; pack() { tar czf $FINAL/results.tgz -C $W .; }
(CUDA_VISIBLE_DEVICES=0 timeout 480 taskset -c 0-15 python3 -m lightning_per.cli fit --config configs/dqn_pong.yaml \
   --trainer.max_time 00:00:07:00 --trainer.default_root_dir /tmp/dqn_pong --trainer.enable_progress_bar false \
   --model.inductor true --model.env.num_envs 32 --model.updates_per_step 8 --model.updates_per_graph 8 \
   --model.updates_per_epoch 2400 > $W/dqn_pong.log 2>&1; echo "dqn rc=$?" >> $W/dqn_pong.log
 cp /tmp/dqn_pong/summary.json $W/dqn_pong_summary.json; cp /tmp/dqn_pong/learning_curve.png $W/dqn_pong_curve.png; pack) &
(export CUDA_VISIBLE_DEVICES=1
 timeout 100 taskset -c 16-31 python3 -m pytest -q -m gpu tests/test_dqn_module.py tests/test_dqn_inductor.py \
   tests/test_replay_gpu.py -p no:cacheprovider --tb=short > $W/gpu_tests.log 2>&1; pack
 cd benchmarks
 timeout 240 taskset -c 16-31 python3 dqn.py --family ours --autotune --no-fit --out $W/r/dqn_ours.json > $W/dqn_ours.log 2>&1; pack
 PYTHONPATH=/tmp/anchor timeout 40 taskset -c 16-31 python3 dqn.py --family torchrl --no-fit --iters 300 \
   --out $W/r/dqn_trl.json > $W/dqn_trl.log 2>&1
 python3 dqn.py --merge $W/r/dqn_ours.json $W/r/dqn_trl.json --out $W/dqn.json > /dev/null 2>&1; pack
 timeout 60 taskset -c 16-31 python3 replay.py --family ours --sizes 1e6 --batches 256 --out $W/r/rp_ours.json > $W/replay_ours.log 2>&1
 PYTHONPATH=/tmp/anchor:$PYTHONPATH timeout 30 taskset -c 16-31 python3 replay.py --family torchrl --sizes 1e6 --batches 256 \
   --out $W/r/rp_trl.json > $W/replay_trl.log 2>&1
 python3 replay.py --merge $W/r/rp_ours.json $W/r/rp_trl.json --out $W/replay.json > /dev/null 2>&1; pack) &
wait; pack
tail -2 $W/gpu_tests.log; cat $W/dqn.md; cat $W/replay.md; grep -v Epoch $W/dqn_pong.log | tail -3
