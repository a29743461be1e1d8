set -u
OUT=${OUT:-/tmp/out}
echo "##### dspark live (graphs)"
timeout 330 bash scripts/gpu/serve_demo.sh tests/serve/test_dspark_live.py -s > $OUT/dspark.log 2>&1; echo "rc $?"
grep -E "prompt of|DSpark|passed|failed|Error|assert" $OUT/dspark.log | cut -c1-400 | tail -20
echo "##### V4 live greedy + logprobs (graphs)"
timeout 200 bash scripts/gpu/serve_demo.sh tests/serve/test_server_live.py -s -k "greedy or prompt_logprobs" > $OUT/live.log 2>&1; echo "rc $?"
grep -E "greedy|prompt logprobs|W8A8|passed|failed|Error|assert" $OUT/live.log | cut -c1-400 | tail -20
