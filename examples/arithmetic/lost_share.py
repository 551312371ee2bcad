"""What exporting only the final branch would have kept of a rollout file's generated tokens.

    python examples/arithmetic/lost_share.py long.jsonl

A rollout whose history was rewritten has several branches; each generated token is counted once, in the branch
that generated it. Before every branch became a training sample, trainers got the final branch alone.
"""

from __future__ import annotations

import sys

from tito_core.runner import read_records
from tito_core.runner.samples import generated_tokens


def main(path: str) -> None:
    counts = generated_tokens(read_records(path))
    print(
        f"{path}: {counts.rollouts} rollouts, {counts.branches} branches; {counts.all_branches} tokens generated in "
        f"all, {counts.final_branch} in the final branches ({counts.final_share:.1%}): the final branch alone "
        f"would have dropped {counts.all_branches - counts.final_branch} ({1 - counts.final_share:.1%})"
    )


if __name__ == "__main__":
    main(sys.argv[1])
