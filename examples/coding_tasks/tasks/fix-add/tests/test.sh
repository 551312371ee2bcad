#!/bin/bash
# Runs from the working directory (/app); writes the reward Harbor reads.
if python3 -m pytest -q -p no:cacheprovider /tests/test_calc.py; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
