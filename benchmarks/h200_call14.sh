# Device call 14 (nvidia-h200-x2, session 5): DQN Pong, two ways to fix the IS-weight collapse seen in session 4
# (is_weight_mean 0.004 at the end of call 13's run: buffer-normalised weights (P(i)/min_j P(j))^-beta with a
# priority floor eps = 1e-6 make the loss ~250x smaller, so Adam (eps 1.5e-4) ran in its eps-dominated regime).
#   GPU 0, cores 0-15:  A = configs/dqn_pong.yaml + replay.weight_normalization batch (Dopamine's normalisation)
#   GPU 1, cores 16-31: B = configs/dqn_pong.yaml + replay.eps 0.01 (buffer normalisation, higher priority floor)
source benchmarks/h200_setup.sh || exit 1
FINAL=$OUT; W=/tmp/w; mkdir -p $W; pack() { tar czf $FINAL/results.tgz -C $W .; }
pong() {  # $1 name, $2 gpu, $3 cores, rest: extra CLI args
  local name=$1 gpu=$2 cores=$3; shift 3
  CUDA_VISIBLE_DEVICES=$gpu timeout 575 taskset -c $cores python3 -m lightning_per.cli fit --config configs/dqn_pong.yaml \
    --trainer.max_time 00:00:09:10 --trainer.default_root_dir /tmp/$name --trainer.enable_progress_bar false "$@" \
    > $W/$name.log 2>&1; echo "$name rc=$?" >> $W/$name.log
  cp /tmp/$name/summary.json $W/${name}_summary.json; cp /tmp/$name/learning_curve.png $W/${name}_curve.png; pack
}
pong pongA 0 0-15 --model.replay.weight_normalization batch &
pong pongB 1 16-31 --model.replay.eps 0.01 &
wait; pack
for n in pongA pongB; do grep -v Epoch $W/$n.log | tail -2; done
