# Device calls planned for the next session (each fits one 10-minute call; logs and summaries to $OUT):
#   bash benchmarks/h200_next.sh ddp-test    # nvidia-h200-x2: tests/test_ddp_gpu.py with stack dumps of a hung rank
#   bash benchmarks/h200_next.sh ga3c-ddp    # nvidia-h200-x2: GA3C Pong with devices: 2 (one predictor/trainer group per GPU)
#   bash benchmarks/h200_next.sh dqn-pong    # nvidia-h200: configs/dqn_pong.yaml for 9 minutes, Inductor update, 40 envs x 10
#                                            #   updates per Lightning step (session 3: 16 x 4 ran 10 ms per step, host-bound)
#   bash benchmarks/h200_next.sh ddp-scaling # nvidia-h200-x2: dqn-fit 1 vs 2 GPUs with inductor (the 1.8x goal)
source benchmarks/h200_setup.sh || exit 1
case "$1" in
  ddp-test)
    timeout 280 python3 -m pytest -x -q tests/test_ddp_gpu.py -k proportional --runxfail --timeout 270 \
      -p no:cacheprovider --tb=short > $OUT/ddp_gpu.log 2>&1; tail -60 $OUT/ddp_gpu.log ;;
  ga3c-ddp)
    timeout 560 python3 -m lightning_per.cli ga3c --config configs/ga3c_pong.yaml --devices 2 --agents 32 \
      --max_time_s 500 --run_dir /tmp/ga3c --status_interval_s 30 > $OUT/ga3c_ddp.log 2>&1
    find /tmp/ga3c -name summary.json -exec cp {} $OUT/ga3c_ddp_summary.json \;
    tail -5 $OUT/ga3c_ddp.log ;;
  dqn-pong)
    timeout 570 python3 -m lightning_per.cli fit --config configs/dqn_pong.yaml --trainer.max_time 00:00:09:00 \
      --model.inductor true --model.env.num_envs 40 --model.updates_per_step 10 --trainer.default_root_dir /tmp/dqn_pong --trainer.enable_progress_bar false \
      > $OUT/dqn_pong.log 2>&1
    cp /tmp/dqn_pong/summary.json $OUT/dqn_pong_summary.json; cp /tmp/dqn_pong/learning_curve.png $OUT/dqn_pong_curve.png
    tail -5 $OUT/dqn_pong.log ;;
  ddp-scaling)
    cd benchmarks
    for N in 1 2; do timeout 150 python3 dqn.py --fit-only --fit-inductor --devices $N --updates-per-step 8 \
      --out $OUT/fit${N}.json > $OUT/fit${N}.log 2>&1; done
    python3 dqn.py --scaling $OUT/fit1.json $OUT/fit2.json --out $OUT/scaling.json; cat $OUT/scaling.md ;;
  *) echo "usage: $0 ddp-test|ga3c-ddp|dqn-pong|ddp-scaling" >&2; exit 2 ;;
esac
