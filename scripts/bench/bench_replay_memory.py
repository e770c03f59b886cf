"""Replay memory per stored transition on Atari Pong (64 px grayscale, stack 4, segments of 20 + 10 pad).

Pushes random-action Pong segments (with the per-step statistics MuZero stores: visit distribution, root
value, legal mask) into the replay buffer and prints bytes per real transition, split into frames and the
rest, and the projection to 1M transitions; beside it, what storing each segment's frames as shipped
(padding and stack prefix duplicated) would cost.

    python scripts/bench/bench_replay_memory.py --steps 20000
"""

from __future__ import annotations

import argparse

from muzero_tune.replay.buffer import ReplayBuffer
from muzero_tune.replay.random_rollout import random_segments


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="ALE/Pong-v5")
    p.add_argument("--steps", type=int, default=20000)
    args = p.parse_args(argv)
    segs = random_segments(args.env, steps=args.steps, frame_stack=4, segment_length=20, pad_length=10)
    shipped = sum(s.frames.nbytes for s in segs)
    buf = ReplayBuffer(capacity_transitions=10**7)
    buf.push(segs)
    n = buf.num_transitions
    frames_b = buf._frames.store.nbytes
    total = buf.nbytes
    print(
        f"{args.env}: {n} real transitions in {buf.num_segments} segments; frames stored {buf.num_frames} "
        f"(received {buf._frames.frames_received})"
    )
    print(
        f"  bytes per transition: {total / n:,.0f} "
        f"(frames {frames_b / n:,.0f}, other {(total - frames_b) / n:,.0f})"
    )
    print(f"  projected 1M transitions: {total / n * 1e6 / 2**30:.2f} GiB (target <= 5 GiB)")
    print(
        f"  frames as shipped (no dedup): {shipped / n:,.0f} B/transition "
        f"-> {shipped / n * 1e6 / 2**30:.2f} GiB; "
        f"a frame copy per stack position would be {4 * frames_b / n:,.0f} B/transition"
    )


if __name__ == "__main__":
    main()
