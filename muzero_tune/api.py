"""The one entry point the command line and the Tune trainable call: train with the pipeline a config
selects, evaluate a checkpoint, and load a trained policy.

What this module owns
    :func:`train` (sync or async by ``policy.async_pipeline.enabled``), :func:`evaluate` (greedy episodes
    of a checkpoint's evaluated snapshot) and the re-export of
    :func:`~muzero_tune.runs.checkpoint.load_policy`. It sits above the pipeline, the distributed drivers
    and the run outputs; nothing below imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from muzero_tune.config import ExperimentConfig
from muzero_tune.pipeline.core import RunSummary, one_torch_thread
from muzero_tune.pipeline.sync_driver import train_muzero_segment
from muzero_tune.runs.checkpoint import load_policy
from muzero_tune.runs.reporter import Reporter


def train(
    cfg: ExperimentConfig, *, reporter: Reporter | None = None, resume_from: str | dict | None = None
) -> RunSummary:
    """Run the pipeline the config selects: async when ``policy.async_pipeline.enabled``, else sync (with
    ``learn.num_learners`` learner workers when it is above 0)."""
    if cfg.policy.async_pipeline.enabled:
        from muzero_tune.distributed.async_driver import train_muzero_segment_async  # starts Ray: lazy

        return train_muzero_segment_async(cfg, reporter=reporter, resume_from=resume_from)
    if cfg.learn.num_learners > 0:
        from muzero_tune.distributed.learner_group import train_sync_with_learners  # starts Ray: lazy

        return train_sync_with_learners(cfg, reporter=reporter, resume_from=resume_from)
    return train_muzero_segment(cfg, reporter=reporter, resume_from=resume_from)


@dataclass(frozen=True)
class Evaluation:
    """:func:`evaluate`'s result: the checkpoint file it read, the snapshot's version, the mean and std of
    the episode returns, the returns themselves, and the mean the run reported for that snapshot."""

    checkpoint: str
    version: int
    reward_mean: float
    reward_std: float
    episode_returns: tuple[float, ...]
    reported_reward_mean: float | None
    videos: tuple[str, ...] = ()  # the mp4 files written (``video_dir``)


@one_torch_thread
def evaluate(
    checkpoint: str,
    *,
    episodes: int | None = None,
    seed: int | None = None,
    overrides: Mapping[str, object] | None = None,
    on_skipped: Callable[[str, str], None] | None = None,
    video_dir: str | None = None,
    video_episodes: int = 1,
) -> Evaluation:
    """Greedy evaluation episodes of the evaluated snapshot in ``checkpoint`` (a checkpoint file or a run
    folder: its latest undamaged checkpoint; ``on_skipped(path, problem)`` hears of each damaged one).
    ``overrides``: eval.* / mcts.* settings to evaluate with (validated); ``seed`` defaults to the run's
    evaluation seed, ``episodes`` to ``eval.n_episodes``. ``video_dir``: record the first env's first
    ``video_episodes`` episodes there as mp4 files (and into the run's MLflow run, when it has one)."""
    from muzero_tune.pipeline.core import EVAL_SEED_OFFSET, check_video_for
    from muzero_tune.pipeline.evaluator import Evaluator
    from muzero_tune.runs.checkpoint import find_checkpoint, policy_from_checkpoint
    from muzero_tune.runs.videos import log_videos_to_run, write_videos

    found = find_checkpoint(checkpoint)
    for path, problem in found.skipped:
        if on_skipped is not None:
            on_skipped(path, problem)
    ckpt = found.checkpoint
    cfg, policy, model = policy_from_checkpoint(ckpt, overrides=dict(overrides or {}))
    eval_seed = cfg.seed + EVAL_SEED_OFFSET if seed is None else seed
    if video_dir is not None:
        check_video_for(cfg, asked_by=("--video", video_dir))
    # more than one recorded episode: every episode on the first (recording) env, in the same seed order
    one_env = video_dir is not None and video_episodes > 1
    evaluator = Evaluator(cfg, policy, policy.spec, seed=eval_seed, video=video_dir is not None,
                          num_envs=1 if one_env else None)  # fmt: skip
    version = ckpt["evaluated"]["version"]
    try:
        res = evaluator.evaluate(
            model, n_episodes=episodes, policy_version=version,
            video_name=f"eval_v{version}" if video_dir is not None else None, video_episodes=video_episodes,
        )  # fmt: skip
    finally:
        evaluator.close()
    videos = write_videos(video_dir, res.videos) if video_dir is not None else ()
    if videos:
        log_videos_to_run(found.run_dir, cfg, videos)
    return Evaluation(
        checkpoint=found.path,
        version=res.policy_version,
        reward_mean=res.reward_mean,
        reward_std=res.reward_std,
        episode_returns=tuple(float(x) for x in res.episode_returns),
        reported_reward_mean=ckpt["evaluated"]["metrics"].get("reward_mean"),
        videos=videos,
    )


__all__ = ["Evaluation", "evaluate", "load_policy", "train"]
