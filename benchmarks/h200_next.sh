# Device calls planned for the next session (each fits one 10-minute call; logs and summaries to $OUT):
#   bash benchmarks/h200_next.sh ddp-test    # nvidia-h200-x2: tests/test_ddp_gpu.py with stack dumps of a hung rank
#   bash benchmarks/h200_next.sh dqn-pong    # nvidia-h200: configs/dqn_pong.yaml for 8.5 minutes
#   bash benchmarks/h200_next.sh ga3c-pong   # nvidia-h200: configs/ga3c_pong.yaml for 8.5 minutes (orthogonal init)
source benchmarks/h200_setup.sh || exit 1
case "$1" in
  ddp-test)
    timeout 280 python3 -m pytest -x -q tests/test_ddp_gpu.py -k proportional --runxfail --timeout 270 \
      -p no:cacheprovider --tb=short > $OUT/ddp_gpu.log 2>&1; tail -60 $OUT/ddp_gpu.log ;;
  dqn-pong)
    timeout 560 python3 -m lightning_per.cli fit --config configs/dqn_pong.yaml --trainer.max_time 00:00:08:30 \
      --trainer.default_root_dir /tmp/dqn_pong > $OUT/dqn_pong.log 2>&1
    cp /tmp/dqn_pong/summary.json $OUT/dqn_pong_summary.json; cp /tmp/dqn_pong/learning_curve.png $OUT/dqn_pong_curve.png
    tail -5 $OUT/dqn_pong.log ;;
  ga3c-pong)
    timeout 560 python3 -m lightning_per.cli ga3c --config configs/ga3c_pong.yaml --max_time_s 510 --run_dir /tmp/ga3c \
      --status_interval_s 30 > $OUT/ga3c_pong.log 2>&1
    find /tmp/ga3c -name summary.json -exec cp {} $OUT/ga3c_pong_summary.json \;
    find /tmp/ga3c -name learning_curve.png -exec cp {} $OUT/ga3c_pong_curve.png \;
    tail -5 $OUT/ga3c_pong.log ;;
  *) echo "usage: $0 ddp-test|dqn-pong|ga3c-pong" >&2; exit 2 ;;
esac
