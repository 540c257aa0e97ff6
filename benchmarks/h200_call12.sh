# Device call 12 (nvidia-h200-x2, session 4). $OUT/results.tgz is rewritten after every stage.
# Stage 1 (~2 min): the 2-GPU CLI tests (tests/test_ddp_gpu.py, after DQN.teardown releases the graph)
#   alongside the GPU tests of the packed storage / DQN changes and the GA3C learner-only benchmark.
# Stage 2 (~7 min): GPU 0 + cores 0-15: GA3C Pong; GPU 1 + cores 16-31: DQN Pong with Inductor and
#   8 updates per CUDA graph (32 envs x 8 updates per Lightning step).
source benchmarks/h200_setup.sh || exit 1
FINAL=$OUT; W=/tmp/w; mkdir -p $W; pack() { tar czf $FINAL/results.tgz -C $W .; }
(LIGHTNING_PER_DUMP_AFTER_S=60 LIGHTNING_PER_DDP_TIMEOUT_S=100 timeout 230 taskset -c 0-15 python3 -m pytest -q \
  tests/test_ddp_gpu.py --runxfail -p no:cacheprovider --tb=short > $W/ddp_gpu.log 2>&1) &
(CUDA_VISIBLE_DEVICES=1 timeout 150 taskset -c 16-31 python3 -m pytest -q -m gpu tests/test_replay_gpu.py \
  tests/test_dqn_module.py tests/test_callbacks_gpu.py tests/test_ga3c_datapath.py -p no:cacheprovider --tb=short \
  > $W/gpu_tests.log 2>&1; pack
 CUDA_VISIBLE_DEVICES=1 timeout 40 taskset -c 16-31 python3 benchmarks/ga3c.py --learner-only --out $W > $W/ga3c_learner.log 2>&1
 CUDA_VISIBLE_DEVICES=1 timeout 40 taskset -c 16-31 python3 benchmarks/ga3c.py --learner-only --synthetic-pps 18000 --predictors 2 \
  --out $W >> $W/ga3c_learner.log 2>&1) &
wait; pack; tail -3 $W/ddp_gpu.log $W/gpu_tests.log; cat $W/ga3c_learner_cuda*.md 2>/dev/null | head -40 || tail -15 $W/ga3c_learner.log
left=$((580 - SECONDS))
(CUDA_VISIBLE_DEVICES=0 timeout $left taskset -c 0-15 python3 -m lightning_per.cli ga3c --config configs/ga3c_pong.yaml \
   --max_time_s $((left - 40)) --run_dir /tmp/ga3c --status_interval_s 30 > $W/ga3c_pong.log 2>&1; echo "ga3c rc=$?" >> $W/ga3c_pong.log
 find /tmp/ga3c -name summary.json -exec cp {} $W/ga3c_pong_summary.json \;
 find /tmp/ga3c -name learning_curve.png -exec cp {} $W/ga3c_pong_curve.png \; ; pack) &
(CUDA_VISIBLE_DEVICES=1 timeout $((left - 5)) taskset -c 16-31 python3 -m lightning_per.cli fit --config configs/dqn_pong.yaml \
   --trainer.max_time 00:00:0$(( (left - 60) / 60 )):$(printf %02d $(( (left - 60) % 60 ))) --trainer.default_root_dir /tmp/dqn_pong \
   --trainer.enable_progress_bar false --model.inductor true --model.env.num_envs 32 --model.updates_per_step 8 \
   --model.updates_per_graph 8 --model.updates_per_epoch 2400 > $W/dqn_pong.log 2>&1; echo "dqn rc=$?" >> $W/dqn_pong.log
 cp /tmp/dqn_pong/summary.json $W/dqn_pong_summary.json; cp /tmp/dqn_pong/learning_curve.png $W/dqn_pong_curve.png; pack) &
wait; pack
tail -4 $W/ga3c_pong.log; grep -v Epoch $W/dqn_pong.log | tail -4
