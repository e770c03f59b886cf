"""What a replay buffer's segments show of collects that were not pushed whole, read from the segments alone.

Each collector env's stream is told by its first observation, which the env's seed fixes (the seeds
:class:`~muzero_tune.distributed.actors.CollectorWorker` gives each actor, incarnation and env), so a check
needs neither the driver's records of what it handled nor its counters of them.
"""

from __future__ import annotations

import numpy as np

from muzero_tune.distributed.actors import COLLECTOR_SEED_STRIDE
from muzero_tune.pipeline.collector import env_factory


def first_observations(cfg, incarnations: int) -> dict[tuple[int, int, int], np.ndarray]:
    """(actor id, incarnation, env index) -> the first observation of that collector env, which its seed fixes
    (seeded as ``CollectorWorker`` seeds it), for every actor and ``incarnations`` incarnations."""
    make = env_factory(cfg)
    out = {}
    for actor in range(cfg.policy.async_pipeline.num_collector_actors):
        for inc in range(incarnations):
            for i in range(cfg.env.collector_env_num):
                env = make(cfg.seed + COLLECTOR_SEED_STRIDE * actor + 100 * inc + i)
                out[(actor, inc, i)] = np.asarray(env.reset()[0])
                env.close()
    return out


def partial_collects(cfg, segments, env_steps: int, *, incarnations: int,
                    dropped=frozenset()) -> tuple[list[str], dict]:  # fmt: skip
    """What the buffer's ``segments`` (in push order) show of collects that were not pushed whole.

    Each stream (one env of one collector incarnation) is told by its first observation
    (:func:`first_observations`). A stream must start at its episode 0, step 0 and go on without a gap or a
    repeat (an episode's segments back to back, the next episode after a ``done`` one); no stream may come
    from an incarnation in ``dropped`` (actor id, incarnation) whose first collect was dropped. The envs of
    one incarnation step together and a segment leaves a stream once it holds ``game_segment_length + pad``
    steps, so each stream's real transitions lie within that many steps of the incarnation's env steps T;
    and the run's ``env_steps`` is the sum over incarnations of num_envs x T. Returns the problems found and
    {(actor, incarnation): [real transitions per env]}."""
    rc, n_envs = cfg.replay, cfg.env.collector_env_num
    full = rc.game_segment_length + rc.num_unroll_steps + rc.td_steps
    origins = first_observations(cfg, incarnations)
    problems, streams, steps = [], {}, {}
    for seg in segments:
        streams.setdefault(seg.stream_id, []).append(seg)
    for sid, segs in streams.items():
        first = segs[0]
        if (first.episode_index, first.episode_step0) != (0, 0):
            problems.append(f"stream {sid} starts at {first.episode_index}/{first.episode_step0}")
            continue
        obs = first.stacked_obs(np.array([0]))[0, -1]
        who = [o for o, x in origins.items() if np.array_equal(x, obs)]
        if len(who) != 1:
            problems.append(f"stream {sid}: its first observation is no collector env's ({len(who)} match)")
            continue
        actor, inc, env = who[0]
        if (actor, inc) in dropped:
            problems.append(f"stream {sid} of collector {actor} incarnation {inc}, whose collect was dropped")
        for prev, seg in zip(segs, segs[1:]):
            nxt = (prev.episode_index + 1, 0) if prev.done else (prev.episode_index,
                                                                  prev.episode_step0 + prev.num_real)
            if (seg.episode_index, seg.episode_step0) != nxt:
                at, was = (seg.episode_index, seg.episode_step0), (prev.episode_index, prev.episode_step0)
                problems.append(f"stream {sid}: episode/step {at} after {was} + {prev.num_real}")
        steps.setdefault((actor, inc), [0] * n_envs)[env] = sum(s.num_real for s in segs)
    for key, per_env in steps.items():
        if max(per_env) - min(per_env) >= full:
            problems.append(f"collector {key[0]} incarnation {key[1]}: its envs hold {per_env} transitions")
    lo = sum(n_envs * max(v) for v in steps.values())
    hi = sum(n_envs * (min(v) + full - 1) for v in steps.values())
    if not lo <= env_steps <= hi:
        problems.append(f"{env_steps} env steps counted, the buffer's streams say {lo}..{hi}")
    return problems, steps
