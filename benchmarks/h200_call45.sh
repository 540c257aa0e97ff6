# Device call 45 (nvidia-h200-x2; session 9, right after call 44 on the same machine): call 44 found the serial
# replay faster than the second stream under Trainer.fit (1 GPU 5,038 vs 3,464 updates/s; 2 GPUs 8,166 vs 6,504
# in total), one run each, while call 43 had the default at 1.12x. Repeats, interleaved: 1 GPU default / serial
# twice, then 2 GPUs default / serial once more (same command as call 44).
source benchmarks/h200_setup.sh > /dev/null 2>&1 || exit 1
FINAL=$OUT; W=/tmp/w45; mkdir -p $W; pack() { tar czf $FINAL/results.tgz -C $W .; }
cd benchmarks
run() { timeout 100 python3 dqn.py --fit-only --fit-inductor --fit-tf32 --devices $1 --updates-per-step 8 \
  --updates-per-graph 8 $3 --out $W/fit$1_$2.json > $W/fit$1_$2.log 2>&1; pack
  python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['rows'][0]; print(sys.argv[2], round(r['updates_per_s_total']))" \
    $W/fit$1_$2.json "$1 GPU(s) $2"; }
run 1 default_a ""; run 1 serial_a --fit-serial-replay; run 1 default_b ""; run 1 serial_b --fit-serial-replay
run 2 default_c ""; run 2 serial_c --fit-serial-replay
