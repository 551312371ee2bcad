#!/bin/bash
# A verifier no agent can satisfy: it asks /app/answer.txt to read both `yes` and `no`. Reward 0 always,
# written by the verifier (a run that reaches it gets 0, never None).
answer="$(cat /app/answer.txt 2>/dev/null)"
if [ "$answer" = "yes" ] && [ "$answer" = "no" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
