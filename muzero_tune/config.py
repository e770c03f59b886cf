"""The experiment configuration: one frozen dataclass tree, presets as data, dotted overrides, validation.

This module owns every setting the library reads. Each field carries a one-line doc (``--help`` and the
README are generated from it) and its allowed range. Every way of changing a setting -- a preset, a YAML
file, ``--set key=value`` on the command line, a Tune ``param_space`` -- goes through :func:`apply_overrides`,
and :func:`validate` runs before any environment, process or network is created. A bad value stops the run
with a :class:`ConfigError` naming the dotted key, the value and what is allowed.

It must never import torch, Ray or gymnasium at module load: the CLI's ``--help`` and validation stay fast.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from muzero_tune.errors import ConfigError, ConfigWarning, PathError, UserError
from muzero_tune.policies.registry import POLICY_TYPES  # light: names only, no policy code


def param(
    default: Any = dataclasses.MISSING,
    doc: str = "",
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: tuple | None = None,
    default_factory: Any = dataclasses.MISSING,
) -> Any:
    """A dataclass field with its doc line and its allowed range (checked by :func:`validate`)."""
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


# ---------------------------------------------------------------------------------------------- sections


@dataclass(frozen=True)
class EnvConfig:
    """Which environment, how its frames are preprocessed, and how many copies run."""

    env_id: str = param("CartPole-v1", "gymnasium id: classic control (CartPole-v1, ...) or ALE/<Game>-v5")
    frame_stack: int = param(1, "frames stacked into one model input (Atari: 4)", ge=1, le=32)
    frame_size_px: int = param(64, "Atari frame side after resizing, pixels", choices=(64, 96))
    grayscale: bool = param(True, "Atari: grayscale frames (False: RGB)")
    sticky_action_prob: float = param(0.25, "Atari v5 sticky-action probability", ge=0.0, le=1.0)
    noop_max: int = param(30, "Atari: up to this many no-op actions at reset", ge=0)
    clip_rewards: bool = param(False, "Atari: clip rewards to their sign for training")
    episodic_life: bool = param(False, "Atari: a lost life ends the training episode")
    max_episode_steps: int | None = param(None, "cap on agent steps per episode (None: the env's own)", ge=1)
    collector_env_num: int = param(8, "environments stepped together by one collector", ge=1, le=4096)
    evaluator_env_num: int = param(8, "environments stepped together by one evaluator", ge=1, le=4096)


@dataclass(frozen=True)
class ModelConfig:
    """The MuZero network: representation, dynamics and prediction functions."""

    kind: str = param(
        "mlp", "network family: mlp (vector observations) or conv (images)", choices=("mlp", "conv")
    )
    latent_dim: int = param(64, "mlp: size of the hidden state", ge=1)
    hidden_dim: int = param(128, "mlp: width of hidden layers", ge=1)
    num_hidden_layers: int = param(1, "mlp: hidden layers per function", ge=1, le=16)
    num_channels: int = param(64, "conv: channels of the hidden state", ge=1)
    num_res_blocks: int = param(1, "conv: residual blocks per stage", ge=1, le=32)
    downsample: bool = param(True, "conv: downsample 64/96 px frames to a 4x4/6x6 hidden state")
    value_support_size: int = param(300, "value is categorical over integer bins -S..S of h(value)", ge=1)
    reward_support_size: int = param(300, "reward is categorical over integer bins -S..S of h(reward)", ge=1)
    projection_dim: int = param(128, "width of the SSL projection head", ge=1)
    channels_last: bool = param(
        False, "conv: weights (so activations) in channels-last (NHWC) layout: learner, actors, checkpoints"
    )


@dataclass(frozen=True)
class MctsConfig:
    """The tree search run at every collect and evaluation step (and for reanalyze)."""

    num_simulations: int = param(25, "simulations per search", ge=1, le=10_000)
    pb_c_base: float = param(19652.0, "pUCT c2", gt=0.0)
    pb_c_init: float = param(1.25, "pUCT c1", ge=0.0)
    discount: float = param(0.997, "discount factor gamma, in search and value targets", gt=0.0, le=1.0)
    root_dirichlet_alpha: float = param(
        0.3, "Dirichlet noise concentration at the root when collecting", gt=0.0
    )
    root_noise_weight: float = param(
        0.25, "weight of the root Dirichlet noise when collecting", ge=0.0, le=1.0
    )
    value_delta_max: float = param(0.01, "smallest min-max range used to normalise Q", ge=0.0)
    unvisited_q: str = param(
        "min",
        "pUCT, collect and reanalyze searches: an unvisited child's Q is min (0 after min-max) or parent "
        "(its parent's mean value)",
        choices=("min", "parent"),
    )
    q_transform: str = param(
        "tree_min_max",
        "pUCT: the range Q is normalised over: tree_min_max (every Q in the tree, the root's own value "
        "included) or parent_and_siblings (per node: its value and its visited children's Qs, as mctx)",
        choices=("tree_min_max", "parent_and_siblings"),
    )
    deterministic_eval: bool = param(True, "evaluation breaks score ties by the lowest action index")


@dataclass(frozen=True)
class CollectConfig:
    """How collectors turn search results into actions."""

    temperature: float = param(0.25, "visit-count temperature for sampling actions (fixed)", gt=0.0)
    temperature_decay: bool = param(
        False, "decay temperature 1.0 -> 0.5 -> 0.25 at 50% / 75% of temperature_decay_train_iter"
    )
    temperature_decay_train_iter: int = param(100_000, "train_iter horizon of the temperature decay", ge=1)


@dataclass(frozen=True)
class ReplayConfig:
    """Game segments, the prioritized replay buffer, targets and reanalyze."""

    capacity_transitions: int = param(1_000_000, "real transitions kept; oldest segments are evicted", ge=1)
    game_segment_length: int = param(50, "real transitions per game segment", ge=1)
    num_unroll_steps: int = param(5, "K: dynamics steps unrolled per training sample", ge=1, le=64)
    td_steps: int = param(10, "n of the n-step value target", ge=1)
    off_policy_transitions_per_step: int = param(
        0,
        "EfficientZero's off-policy correction: a sample's n-step horizon is td_steps minus one per this "
        "many transitions pushed after it, down to td_steps_min (0: off, every sample uses td_steps)",
        ge=0,
    )
    td_steps_min: int = param(1, "the off-policy correction's shortest n-step horizon", ge=1)
    use_priority: bool = param(True, "prioritized replay (else uniform)")
    priority_alpha: float = param(0.6, "PER exponent alpha", ge=0.0)
    priority_beta: float = param(0.4, "PER importance-weight exponent beta", ge=0.0, le=1.0)
    use_max_priority_for_new_data: bool = param(
        True, "new transitions get the buffer's max priority (else |root value - predicted value|)"
    )
    reanalyze_ratio: float = param(
        0.0,
        "fraction of each sampled batch whose policy targets are re-searched with the target model",
        ge=0.0,
        le=1.0,
    )
    buffer_reanalyze_freq: float = param(
        0.0,
        "buffer reanalyze calls per collect epoch (>=1: int(freq) calls spread over its train budget; "
        "<1: once every round(1/freq) epochs; 0: off)",
        ge=0.0,
    )
    reanalyze_batch_size: int = param(160, "segments positions re-searched per buffer reanalyze call", ge=1)
    reanalyze_partition: float = param(
        0.75, "buffer reanalyze draws from this oldest fraction of the buffer", gt=0.0, le=1.0
    )


@dataclass(frozen=True)
class LearnConfig:
    """The learner: losses, optimizer, schedule, target network and the train/collect ratio."""

    batch_size: int = param(256, "samples per train step", ge=1)
    optimizer: str = param("adam", "optimizer", choices=("adam", "adamw", "sgd"))
    learning_rate: float = param(3e-3, "initial learning rate", gt=0.0)
    momentum: float = param(0.9, "sgd momentum", ge=0.0, lt=1.0)
    weight_decay: float = param(1e-4, "L2 weight decay", ge=0.0)
    lr_schedule: str = param(
        "constant", "learning-rate schedule", choices=("constant", "piecewise", "cosine")
    )
    lr_milestones: tuple[int, ...] = param(
        (100_000, 200_000), "piecewise: train_iter milestones where the lr is multiplied by lr_decay_factor"
    )
    lr_decay_factor: float = param(0.1, "piecewise: multiplier at each milestone", gt=0.0, le=1.0)
    lr_total_train_iter: int = param(100_000, "cosine: train_iter at which the lr reaches 0", ge=1)
    grad_clip_norm: float = param(10.0, "clip the global gradient norm to this", gt=0.0)
    value_loss_weight: float = param(0.25, "weight of the value cross-entropy", ge=0.0)
    reward_loss_weight: float = param(1.0, "weight of the reward cross-entropy", ge=0.0)
    policy_loss_weight: float = param(1.0, "weight of the policy cross-entropy", ge=0.0)
    unroll_loss_scale: str = param(
        "whole",
        "scale of the loss over the K unrolled steps: per_step (MuZero's pseudocode: root terms x 1, each "
        "unrolled step x 1/K) or whole (LightZero's: the whole sum x 1/K, root included)",
        choices=("per_step", "whole"),
    )
    ssl_loss_weight: float = param(0.0, "weight of the SSL consistency loss (0: off)", ge=0.0)
    target_update_interval: int = param(100, "hard target-network copy every this many train steps", ge=1)
    target_update_tau: float = param(
        0.0, "if > 0, soft target update with this rate every step", ge=0.0, le=1.0
    )
    update_per_collect: int | None = param(
        None, "train steps per collect (None: replay_ratio x real transitions collected)", ge=1
    )
    replay_ratio: float = param(
        0.25, "train steps per real transition collected (the fraction left over is carried)", gt=0.0
    )
    train_start_after_envsteps: int = param(0, "collect only until this many env steps", ge=0)
    min_replay_transitions: int | None = param(
        None, "real transitions needed before training (None: batch_size)", ge=1
    )
    resume_warmup_transitions: int = param(
        1000, "after a resume without a saved buffer, fresh real transitions collected before training", ge=0
    )
    device: str = param("cpu", "learner device: cpu, auto (cuda when present) or cuda[:N]")
    mixed_precision: bool = param(
        False,
        "autocast the learner's loss forward: bf16 on CUDA (fp16 where bf16 is missing) and on CPUs with "
        "native bf16 (AVX-512/AMX; fp32 with a warning elsewhere); weights and optimizer stay fp32",
    )
    overlap_bootstrap: bool = param(
        True,
        "run the target network's bootstrap forward on a helper thread beside the loss's forward (same "
        "values; faster where the process has a second core to spare)",
    )
    num_threads: int = param(
        1,
        "CPU cores the learner's step may use: torch's intra-op threads for its loss forward less the one "
        "the bootstrap helper takes (learn.overlap_bootstrap), and for its backward and optimizer step, less "
        "that one too where the helper works beside them (learn.prefetch_next_batch); 1: one thread, as "
        "every process here; more only where those cores are the learner's alone -- beside busy actors it "
        "is slower",
        ge=1,
    )
    bootstrap_piece_rows: int = param(
        0,
        "the target network's bootstrap forward in calls of this many positions (0: one call over the "
        "batch's B x (K+1)); beside the backward a conv network's piece stays in cache (Pong presets: 32). "
        "A different split may round a value differently, so it is set here, never picked by timing",
        ge=0,
    )
    helper_ssl_encodings: int = param(
        0,
        "how many of the SSL loss's K target encodings (the last ones) run on the bootstrap helper thread "
        "beside the loss's unroll; the same results bit for bit (with learn.overlap_bootstrap, and a policy "
        "whose loss takes them: muzero, efficientzero, gumbel_muzero, muzero_context, the sampled ones)",
        ge=0,
    )
    prefetch_next_batch: bool = param(
        True,
        "build the next batch and start its bootstrap forward on the helper thread while this step's "
        "backward runs (only where nothing can change it: the target network stays, no in-batch "
        "reanalyze); thrown away unused if the buffer, the RNG or the target network changed since, so the "
        "batches and results are the same as without",
    )


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation: greedy search, no noise, on separate environments."""

    eval_freq: int = param(200, "evaluate every this many train steps", ge=1)
    n_episodes: int = param(8, "episodes per evaluation", ge=1)
    max_episode_steps: int | None = param(None, "cap on steps per evaluation episode", ge=1)
    unvisited_q: str = param(
        "parent",
        "pUCT, evaluation searches (no root noise): an unvisited child's Q is parent (its parent's mean "
        "value) or min (0 after min-max)",
        choices=("parent", "min"),
    )


@dataclass(frozen=True)
class AsyncPipelineConfig:
    """``policy.async_pipeline``: the async segment pipeline (spec section 4.2); defaults are the spec's."""

    enabled: bool = param(False, "run the async pipeline (Ray actors); --async-pipeline sets it")
    num_collector_actors: int = param(1, "collector actors", ge=1, le=1024)
    num_evaluator_actors: int = param(1, "evaluator actors", ge=1, le=1024)
    max_collect_inflight: int | None = param(
        None, "max concurrently running collect tasks (None: num_collector_actors)", ge=1
    )
    max_eval_inflight: int = param(1, "max concurrently running eval tasks", ge=1)
    max_train_chunk_steps: int = param(
        4, "max consecutive learner updates before handling actor results", ge=1
    )
    weight_sync_interval: int = param(1, "min train_iter gap between weight snapshot publishes", ge=1)
    max_policy_lag: int = param(0, "max collector policy lag; exceeding it forces a publish (<0: off)")
    max_train_budget_queue_size: int | None = param(
        None, "train-budget queue cap (backpressure, once trainable; None: 2 x num_collector_actors)", ge=1
    )
    eval_at_start: bool = param(False, "run one evaluation before training starts")
    collector_num_cpus: float = param(1.0, "Ray CPUs per collector actor", ge=0.0)
    evaluator_num_cpus: float = param(1.0, "Ray CPUs per evaluator actor", ge=0.0)
    collector_num_gpus: float = param(0.0, "Ray GPUs per collector actor (fractional allowed)", ge=0.0)
    evaluator_num_gpus: float = param(0.0, "Ray GPUs per evaluator actor (fractional allowed)", ge=0.0)
    buffer_stats_interval: int = param(100, "log buffer statistics every this many train_iter", ge=1)
    poll_interval_s: float = param(0.1, "driver event-loop poll interval, seconds", gt=0.0)
    shutdown_timeout_s: float = param(30.0, "actor shutdown timeout at exit, seconds", gt=0.0)
    ray_local_mode: bool = param(False, "Ray local mode (debugging)")
    max_actor_restarts: int = param(
        3, "restarts allowed per actor slot before the run stops with an error", ge=0
    )
    actor_restart_delay_s: float = param(1.0, "wait before restarting a failed actor, seconds", ge=0.0)
    collect_timeout_s: float = param(
        600.0, "a collect running longer is treated as a hung actor, seconds", gt=0.0
    )
    eval_timeout_s: float = param(1800.0, "an evaluation running longer is treated as hung, seconds", gt=0.0)
    actor_start_timeout_s: float = param(
        120.0, "wait this long for the placement group and actors to start, seconds", gt=0.0
    )
    placement_strategy: str = param(
        "PACK",
        "the run's (or trial's) placement group strategy: PACK (as few nodes as possible), SPREAD "
        "(bundles on distinct nodes where Ray can), STRICT_SPREAD (every bundle on its own node: needs as "
        "many nodes as bundles)",
        choices=("PACK", "SPREAD", "STRICT_SPREAD"),
    )
    verify_segment_digests: bool = param(
        False,
        "collectors hash their segments and the driver re-hashes them on arrival (counts "
        "pipeline/segment_digest_mismatches; costs a hash of every segment on both sides)",
    )


@dataclass(frozen=True)
class PolicyConfig:
    """Which MuZero-family policy type, and the async pipeline settings."""

    type: str = param("muzero", "policy type", choices=POLICY_TYPES)
    # efficientzero
    lstm_horizon_len: int = param(
        5, "efficientzero: value-prefix LSTM state reset every this many steps", ge=1
    )
    lstm_hidden_size: int = param(64, "efficientzero: value-prefix LSTM hidden size", ge=1)
    # gumbel_muzero
    max_num_considered_actions: int = param(
        16, "gumbel_muzero: actions sampled at the root (Gumbel-top-k) for sequential halving", ge=1
    )
    gumbel_scale: float = param(1.0, "gumbel_muzero: scale of the root Gumbel noise when collecting", ge=0.0)
    gumbel_c_visit: float = param(50.0, "gumbel_muzero: c_visit of the completed-Q transform", gt=0.0)
    gumbel_c_scale: float = param(0.1, "gumbel_muzero: c_scale of the completed-Q transform", gt=0.0)
    # sampled_muzero, sampled_efficientzero
    num_samples: int = param(20, "sampled_*: actions sampled at every search node (K)", ge=1)
    sampled_prior: str = param(
        "auto",
        "sampled_*: prior of the K sampled edges: uniform (1/K, the paper's rule for independent draws "
        "from the policy), density (the policy renormalised over the samples, right for distinct discrete "
        "actions drawn without replacement) or auto (uniform for continuous actions, density for discrete)",
        choices=("auto", "uniform", "density"),
    )
    policy_entropy_weight: float = param(
        5e-3, "sampled_* and unizero: weight of the policy entropy bonus in the policy loss", ge=0.0
    )
    # stochastic_muzero
    chance_space_size: int = param(8, "stochastic_muzero: number of chance outcomes (codebook size)", ge=1)
    afterstate_policy_loss_weight: float = param(
        1.0, "stochastic_muzero: afterstate (chance) policy loss", ge=0.0
    )
    afterstate_value_loss_weight: float = param(0.25, "stochastic_muzero: afterstate value loss", ge=0.0)
    commitment_loss_weight: float = param(1.0, "stochastic_muzero: chance-encoder commitment loss", ge=0.0)
    # muzero_context, muzero_rnn_full_obs
    context_length_init: int = param(
        5,
        "muzero_context / muzero_rnn_full_obs: re-encode / reset the carried state every this many steps",
        ge=1,
    )
    rnn_hidden_size: int = param(64, "muzero_rnn_full_obs: GRU history state size", ge=1)
    # unizero (sampled_unizero)
    world_model_layers: int = param(2, "unizero: transformer layers", ge=1, le=64)
    world_model_heads: int = param(2, "unizero: attention heads (embed_dim / heads must be even)", ge=1)
    world_model_embed_dim: int = param(
        64, "unizero: token size E (observation latents, action embeddings, transformer width)", ge=2
    )
    context_tokens: int = param(
        8,
        "unizero: a root's context holds the env's last context_tokens // 2 observations and the actions "
        "between them (the search appends up to max(2K+1, context_tokens+1) tokens, then slides)",
        ge=2,
    )
    positional: str = param(
        "learned", "unizero: learned absolute positions or rope", choices=("learned", "rope")
    )
    latent_norm: str = param(
        "layernorm",
        "unizero: observation-latent norm and latent loss: layernorm (MSE) or simnorm (group KL)",
        choices=("layernorm", "simnorm"),
    )
    simnorm_group_size: int = param(8, "unizero: SimNorm group size (divides world_model_embed_dim)", ge=2)
    latent_loss_weight: float = param(10.0, "unizero: weight of the next-latent loss", ge=0.0)
    kv_cache: bool = param(
        True, "unizero: reuse per-env and per-node keys/values (exact either way; False recomputes windows)"
    )
    kv_cache_clear_interval: int = param(
        2000,
        "unizero: drop an env's cached keys (recomputed from its raw window) every this many episode steps; "
        "0: never",
        ge=0,
    )
    async_pipeline: AsyncPipelineConfig = param(
        default_factory=AsyncPipelineConfig, doc="async segment pipeline"
    )


@dataclass(frozen=True)
class TuneConfig:
    """Ray Tune sweeps: storage, checkpoints, failures and MLflow (used by ``muzero-tune sweep``)."""

    storage_path: str = param(
        "runs/tune", "sweep results folder (made absolute); MLflow's sqlite store lives here"
    )
    save_replay_buffer: bool = param(False, "put the replay buffer in every checkpoint (large; exact resume)")
    checkpoint_num_to_keep: int | None = param(
        3, "checkpoints kept per trial (best by reward_mean + latest)", ge=1
    )
    max_failures: int = param(1, "trial retries from its last checkpoint after an error", ge=0)
    max_concurrent_trials: int | None = param(
        None, "trials run at once (None: the search space's default)", ge=1
    )
    mlflow: bool = param(True, "log every trial as an MLflow run")
    mlflow_tracking_uri: str | None = param(
        None, "MLflow tracking URI (None: sqlite:///<storage_path>/mlflow.db)"
    )
    sync_period_s: float = param(
        1.0, "how often Tune syncs experiment state to storage (fresh restores)", gt=0.0
    )


@dataclass(frozen=True)
class LoggingConfig:
    """Where runs write and how often they print."""

    output_dir: str = param("runs", "runs are written to <output_dir>/<exp_name>/")
    progress_interval_s: float = param(5.0, "seconds between progress lines (0: every loop)", ge=0.0)
    quiet: bool = param(False, "no progress lines")
    mlflow: bool = param(False, "standalone runs: log every evaluation to MLflow (metric step = env steps)")
    mlflow_tracking_uri: str | None = param(
        None, "standalone MLflow tracking URI (None: sqlite:///<output_dir>/mlflow.db)"
    )
    mlflow_experiment: str = param(
        "standalone", "standalone MLflow experiment (compare its runs with muzero-tune compare)"
    )


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything one training run reads."""

    exp_name: str = param("cartpole_muzero", "run name; outputs go under <logging.output_dir>/<exp_name>/")
    seed: int = param(0, "seed of environments, search and learner", ge=0)
    max_env_step: int = param(100_000, "stop after this many env steps", ge=1)
    max_train_iter: int = param(1_000_000, "stop after this many train steps", ge=1)
    stop_value: float | None = param(195.0, "stop when eval reward_mean reaches this (None: never)")
    max_wall_s: float | None = param(
        None, "stop after this many seconds of run wall time (None: no limit)", gt=0.0
    )
    env: EnvConfig = param(default_factory=EnvConfig, doc="environment")
    model: ModelConfig = param(default_factory=ModelConfig, doc="network")
    mcts: MctsConfig = param(default_factory=MctsConfig, doc="tree search")
    collect: CollectConfig = param(default_factory=CollectConfig, doc="collection")
    replay: ReplayConfig = param(default_factory=ReplayConfig, doc="replay buffer")
    learn: LearnConfig = param(default_factory=LearnConfig, doc="learner")
    eval: EvalConfig = param(default_factory=EvalConfig, doc="evaluation")
    policy: PolicyConfig = param(default_factory=PolicyConfig, doc="policy type and async pipeline")
    tune: TuneConfig = param(default_factory=TuneConfig, doc="Ray Tune sweeps")
    logging: LoggingConfig = param(default_factory=LoggingConfig, doc="outputs")


# ---------------------------------------------------------------------------------------------- presets

PRESETS: dict[str, dict[str, Any]] = {
    # CartPole-v1, solved at eval mean >= 195 over 8 episodes (goal: within 30k env steps): a small MLP, short
    # segments so fresh data reaches the buffer often.
    "cartpole_muzero": {
        "exp_name": "cartpole_muzero",
        "env.env_id": "CartPole-v1",
        "env.collector_env_num": 8,
        "env.evaluator_env_num": 8,
        "model.kind": "mlp",
        "model.latent_dim": 64,
        "model.hidden_dim": 128,
        "model.value_support_size": 50,
        "model.reward_support_size": 5,
        "mcts.num_simulations": 25,
        "replay.game_segment_length": 50,
        "replay.num_unroll_steps": 5,
        "replay.td_steps": 10,
        "learn.batch_size": 256,
        "learn.optimizer": "adam",
        "learn.learning_rate": 1e-3,  # 3e-3 leaves some seeds on a long 100-170 plateau
        "learn.weight_decay": 1e-4,
        "learn.replay_ratio": 0.25,
        # Visit-count temperature 1 (the MuZero paper's early-training value): 0.25 collects too greedily.
        "collect.temperature": 1.0,
        "eval.eval_freq": 200,
        "eval.n_episodes": 8,
        "max_env_step": 30_000,
        "stop_value": 195.0,
    },
    # The other discrete policy types on CartPole: the MuZero preset with the type switched (see below).
    # Atari Pong with the reference system's settings (spec section 4.1; reference notes section 2).
    "pong_muzero": {
        "exp_name": "pong_muzero",
        "env.env_id": "ALE/Pong-v5",
        "env.frame_stack": 4,  # 4 grayscale frames per model input
        "env.frame_size_px": 64,  # 64x64 frames -> 4x4 hidden state
        "env.grayscale": True,
        "env.sticky_action_prob": 0.25,  # the v5 default
        "env.collector_env_num": 8,
        "env.evaluator_env_num": 3,
        "model.kind": "conv",
        "model.num_channels": 64,
        "model.num_res_blocks": 1,
        "model.downsample": True,
        "model.value_support_size": 300,
        "model.reward_support_size": 300,
        "model.projection_dim": 256,
        "mcts.num_simulations": 50,  # reference: 50 simulations per move
        "replay.game_segment_length": 20,  # reference segment length
        "replay.num_unroll_steps": 5,  # K = 5
        "replay.td_steps": 5,
        "replay.capacity_transitions": 1_000_000,
        "learn.batch_size": 256,
        "learn.optimizer": "sgd",  # SGD, momentum 0.9, wd 1e-4
        "learn.learning_rate": 0.2,
        "learn.lr_schedule": "piecewise",  # 0.2 -> 0.02 at 100k -> 0.002 at 200k train steps
        "learn.lr_milestones": (100_000, 200_000),
        "learn.weight_decay": 1e-4,
        "learn.replay_ratio": 0.25,
        "learn.ssl_loss_weight": 2.0,  # SSL consistency loss on (EfficientZero)
        # the last 3 of its 5 target encodings beside the unroll, on the bootstrap helper thread (same
        # results, a faster step: docs/performance.md)
        "learn.helper_ssl_encodings": 3,
        # the next batch's bootstrap forward in pieces of 32 observations beside the backward: each piece's
        # activations stay in cache (docs/performance.md)
        "learn.bootstrap_piece_rows": 32,
        "model.channels_last": True,  # a faster conv learner on CPUs (models/layout.place_model)
        "learn.train_start_after_envsteps": 2_000,
        "learn.device": "auto",
        "eval.eval_freq": 2_000,
        "eval.n_episodes": 3,
        "max_env_step": 1_000_000,
        "stop_value": 20.0,
    },
}


for _ptype in (
    "efficientzero",
    "gumbel_muzero",
    "stochastic_muzero",
    "muzero_context",
    "muzero_rnn_full_obs",
):
    PRESETS[f"cartpole_{_ptype}"] = {
        **PRESETS["cartpole_muzero"],
        "exp_name": f"cartpole_{_ptype}",
        "policy.type": _ptype,
    }

# stochastic_muzero: the CartPole preset above with its chance codebook spelled out, and the same on the
# slippery CartPole (muzero_tune/StochasticCartPole-v1: the chosen action is replaced by a random one with
# p = 0.3; solved at eval mean >= 195 over 8 episodes).
PRESETS["cartpole_stochastic_muzero"] = {
    **PRESETS["cartpole_stochastic_muzero"],
    "policy.chance_space_size": 8,
}
PRESETS["stochastic_cartpole_stochastic_muzero"] = {
    **PRESETS["cartpole_stochastic_muzero"],
    "exp_name": "stochastic_cartpole_stochastic_muzero",
    "env.env_id": "muzero_tune/StochasticCartPole-v1",
    "max_env_step": 50_000,
    "stop_value": 195.0,
}

# gumbel_muzero: sequential halving needs few simulations (2 actions: 8 visits each). The completed-Q
# transform rescales each node's Q values to [0, 1] (as mctx), so with 2 actions any Q gap, however small,
# becomes the full sigma gap (c_visit + N) * c_scale = 5.8 logits and the policy target is near one-hot.
# A span floor of 30 value units (CartPole values are 0 .. ~300) keeps small gaps small (floors from 3 to 100
# were compared; 30 had the best median and worst case). The Gumbel policy target (the improved policy)
# learns faster with MuZero's loss convention (root terms at full weight, each unrolled step at 1/K).
PRESETS["cartpole_gumbel_muzero"] = {
    **PRESETS["cartpole_gumbel_muzero"],
    "mcts.num_simulations": 16,
    "mcts.value_delta_max": 30.0,
    "learn.unroll_loss_scale": "per_step",
}

# muzero_context: roots are carried up to context_length_init - 1 dynamics steps, so the SSL consistency loss
# (dynamics latents pulled towards the re-encoded observations; the reference CartPole config's weight) is
# on (without it one seed of three took several times longer to reach 195).
PRESETS["cartpole_muzero_context"] = {**PRESETS["cartpole_muzero_context"], "learn.ssl_loss_weight": 2.0}


# ---------------------------------------------------------------------------------------------- sampled types
# Sampled MuZero / Sampled EfficientZero (K actions sampled per search node). Continuous tasks: actions in
# [-1, 1], mapped to the env's bounds by the env wrapper; the reference's Pendulum settings (K 20, segment 50,
# batch 256, replay_ratio 0.25, 8 collector envs) with 25 simulations and Adam, sized for a small CPU.
PRESETS["pendulum_sampled_efficientzero"] = {
    "exp_name": "pendulum_sampled_efficientzero",
    "policy.type": "sampled_efficientzero",
    "env.env_id": "Pendulum-v1",  # 200 steps, reward in [-16.3, 0]: returns -1600 .. 0
    "env.collector_env_num": 8,
    "env.evaluator_env_num": 8,
    "model.kind": "mlp",
    "model.latent_dim": 64,
    "model.hidden_dim": 128,
    "model.value_support_size": 50,  # h(1600) = 41.6 fits
    "model.reward_support_size": 10,  # h(16.3) = 3.1 fits
    "policy.num_samples": 20,  # K (the reference's; it reports K = 3 or 10 plateauing near -600)
    "policy.policy_entropy_weight": 5e-3,
    "mcts.num_simulations": 25,
    "replay.game_segment_length": 50,
    "replay.num_unroll_steps": 5,
    # 10-step value targets (the reference's 5 left a seed on a plateau just short of -250; sampled_muzero
    # keeps 5)
    "replay.td_steps": 10,
    "learn.batch_size": 256,
    "learn.optimizer": "adam",
    "learn.learning_rate": 1e-3,
    "learn.weight_decay": 1e-4,
    "learn.replay_ratio": 0.25,
    "eval.eval_freq": 2_000,
    "eval.n_episodes": 8,
    "max_env_step": 50_000,
    "stop_value": -250.0,
}
PRESETS["pendulum_sampled_muzero"] = {
    **PRESETS["pendulum_sampled_efficientzero"],
    "exp_name": "pendulum_sampled_muzero",
    "policy.type": "sampled_muzero",
    "replay.td_steps": 5,
}
PRESETS["lunarlander_cont_sampled_efficientzero"] = {
    **PRESETS["pendulum_sampled_efficientzero"],
    "exp_name": "lunarlander_cont_sampled_efficientzero",
    "env.env_id": "LunarLanderContinuous-v3",  # the box2d extra; solved at 200
    "model.value_support_size": 300,
    "model.reward_support_size": 50,  # shaping rewards up to +-100 (crash / landing)
    "replay.td_steps": 10,
    "eval.eval_freq": 10_000,
    "max_env_step": 1_000_000,
    "stop_value": 200.0,
}
PRESETS["inverted_pendulum_sampled_efficientzero"] = {
    **PRESETS["pendulum_sampled_efficientzero"],
    "exp_name": "inverted_pendulum_sampled_efficientzero",
    "env.env_id": "InvertedPendulum-v5",  # the mujoco extra; reward 1 per step, 1000 steps, solved at 950
    "model.value_support_size": 50,
    "model.reward_support_size": 5,
    "replay.td_steps": 10,
    "eval.eval_freq": 2_000,
    "max_env_step": 30_000,
    "stop_value": 950.0,
}
# Discrete sampled search: CartPole with K = |A| = 2 (every action sampled), Pong with K = 3 of its 6 actions.
PRESETS["cartpole_sampled_muzero"] = {
    **PRESETS["cartpole_muzero"],
    "exp_name": "cartpole_sampled_muzero",
    "policy.type": "sampled_muzero",
    "policy.num_samples": 2,
}
PRESETS["cartpole_sampled_efficientzero"] = {
    **PRESETS["cartpole_sampled_muzero"],
    "exp_name": "cartpole_sampled_efficientzero",
    "policy.type": "sampled_efficientzero",
}
PRESETS["pong_sampled_efficientzero"] = {
    **PRESETS["pong_muzero"],
    "exp_name": "pong_sampled_efficientzero",
    "policy.type": "sampled_efficientzero",
    "policy.num_samples": 3,
}

# unizero: the reference's CartPole world model (2 layers, 2 heads, E = 64, K = 5, context 8 tokens,
# batch 256, 25 simulations, replay_ratio 0.25, clip 5; loss weights latent 10 / value 0.5 / reward 1 /
# policy 1, entropy 5e-3, EMA target 0.05).
PRESETS["cartpole_unizero"] = {
    **PRESETS["cartpole_muzero"],
    "exp_name": "cartpole_unizero",
    "policy.type": "unizero",
    "policy.world_model_layers": 2,
    "policy.world_model_heads": 2,
    "policy.world_model_embed_dim": 64,
    "policy.context_tokens": 8,
    "policy.policy_entropy_weight": 5e-3,
    "model.reward_support_size": 50,
    "learn.grad_clip_norm": 5.0,
    "learn.value_loss_weight": 0.5,
    "learn.target_update_tau": 0.05,
}
# Pong with the reference's Atari UniZero settings (2 layers, 8 heads, E = 768, K = 10, batch 64, context 8
# tokens, 601-atom supports, 50 simulations); meant for a GPU learner (learn.device=auto).
PRESETS["pong_unizero"] = {
    **PRESETS["pong_muzero"],
    "exp_name": "pong_unizero",
    "policy.type": "unizero",
    "policy.world_model_layers": 2,
    "policy.world_model_heads": 8,
    "policy.world_model_embed_dim": 768,
    "policy.context_tokens": 8,
    "policy.latent_norm": "simnorm",
    "policy.policy_entropy_weight": 1e-4,
    "replay.num_unroll_steps": 10,
    "replay.td_steps": 5,
    "learn.batch_size": 64,
    "learn.optimizer": "adamw",
    "learn.learning_rate": 1e-4,
    "learn.lr_schedule": "constant",
    "learn.weight_decay": 1e-2,
    "learn.grad_clip_norm": 5.0,
    "learn.ssl_loss_weight": 0.0,
    "learn.helper_ssl_encodings": 0,  # its loss has no SSL targets to move
    "learn.value_loss_weight": 0.5,
    "learn.target_update_tau": 0.05,
    "learn.replay_ratio": 0.25,
}

# sampled_unizero: the reference's Pendulum settings (K 20, batch 64, K = 10 unroll steps, context 4 steps =
# 8 tokens, discount 0.99, entropy weight 5e-2, 2 layers) with cartpole_unizero's world model (E 64, 2 heads
# against the reference's 256 / 8: on a small CPU a train step at E 128 / 4 heads costs about 3x one at
# E 64), its loss weights and EMA target; evaluation every 5,000 train steps = 20k env steps at
# replay_ratio 0.25 (8 episodes of 200 steps cost about as much as 1.6k collected env steps).
PRESETS["pendulum_sampled_unizero"] = {
    **PRESETS["pendulum_sampled_efficientzero"],
    "exp_name": "pendulum_sampled_unizero",
    "policy.type": "sampled_unizero",
    "replay.td_steps": 5,
    "policy.world_model_layers": 2,
    "policy.world_model_heads": 2,
    "policy.world_model_embed_dim": 64,
    "policy.context_tokens": 8,
    "policy.policy_entropy_weight": 5e-2,
    "mcts.discount": 0.99,
    "replay.num_unroll_steps": 10,
    "learn.batch_size": 64,
    "learn.grad_clip_norm": 5.0,
    "learn.value_loss_weight": 0.5,
    "learn.target_update_tau": 0.05,
    "eval.eval_freq": 5_000,
    "stop_value": -300.0,  # the world-model type's goal (the MLP sampled presets stop at -250)
}
# The discrete sampled search on CartPole with K = |A| = 2 (every action sampled): cartpole_unizero otherwise.
PRESETS["cartpole_sampled_unizero"] = {
    **PRESETS["cartpole_unizero"],
    "exp_name": "cartpole_sampled_unizero",
    "policy.type": "sampled_unizero",
    "policy.num_samples": 2,
}


# ---------------------------------------------------------------------------------------------- other tasks
# Acrobot-v1 (3 actions, reward -1 per step until the tip swings above the bar, 500 steps; the goal here: eval
# mean >= -100 over 8 episodes within 50k env steps). Every action looks the same to MuZero until training
# episodes reach the goal (the value is one constant, the visit targets stay uniform, collection is random),
# and random play reaches it in only about 3% of 500-step episodes (median 1,700 steps without a limit), so
# training episodes run up to 2,000 steps (evaluation keeps the env's 500). discount 0.99 and a target copy
# every 25 train steps bring the value's offset (-1 / (1 - discount)) in within a few thousand env steps;
# 50-step value targets carry a reached goal back over a swing-up at once, and the off-policy correction
# shortens them for old data (50 for data younger than 200 transitions, one step less per 200 more, 10 past
# 8k), so an older policy's slower swing-ups do not pull the values down. Collection anneals its temperature
# 1.0 -> 0.5 -> 0.25 at 25k / 37.5k env steps, so early training episodes explore enough to reach the goal.
# Twice CartPole's replay ratio (evaluations kept every 4k env steps).
PRESETS["acrobot_muzero"] = {
    **PRESETS["cartpole_muzero"],
    "exp_name": "acrobot_muzero",
    "env.env_id": "Acrobot-v1",
    "env.max_episode_steps": 2_000,
    "eval.max_episode_steps": 500,
    "mcts.discount": 0.99,
    "learn.target_update_interval": 25,
    "learn.replay_ratio": 0.5,
    "replay.td_steps": 50,
    "replay.off_policy_transitions_per_step": 200,
    "replay.td_steps_min": 10,
    "collect.temperature_decay": True,
    "collect.temperature_decay_train_iter": 25_000,  # 50k env steps at replay_ratio 0.5
    "model.value_support_size": 20,  # h(100) = 9.1
    "model.reward_support_size": 5,
    "eval.eval_freq": 2_000,  # every 4k env steps: an unsolved evaluation is 8 x 500 steps
    "max_env_step": 50_000,
    "stop_value": -100.0,
}
# LunarLander-v3, discrete (4 actions; the box2d extra): shaped rewards, about +-100 at a crash or a landing,
# episodes up to 1000 steps, solved at 200; the learning goal here is eval mean >= 100 over 8 episodes within
# 150k env steps. h(100) = 9.2 fits the reward support, h(1000) = 31.6 the value support. Evaluations are
# long (8 episodes of up to 1000 steps), so they run every 10k env steps.
PRESETS["lunarlander_muzero"] = {
    **PRESETS["cartpole_muzero"],
    "exp_name": "lunarlander_muzero",
    "env.env_id": "LunarLander-v3",
    "model.value_support_size": 50,
    "model.reward_support_size": 10,
    "replay.td_steps": 10,
    "eval.eval_freq": 2_500,
    "max_env_step": 150_000,
    "stop_value": 100.0,
}
PRESETS["lunarlander_efficientzero"] = {
    **PRESETS["lunarlander_muzero"],
    "exp_name": "lunarlander_efficientzero",
    "policy.type": "efficientzero",
}
# CartPole with its velocities hidden (muzero_tune/CartPoleNoVel-v1: only the cart position and the pole angle
# are observed; solved at eval mean >= 195 over 8 episodes): the velocities have to be inferred from the
# history, which the recurrent, context and UniZero types carry; plain muzero with frame_stack 1 sees only
# one frame. Each is the type's CartPole preset with the env switched.
for _ptype in ("muzero_rnn_full_obs", "muzero_context", "unizero", "muzero"):
    PRESETS[f"cartpole_novel_{_ptype}"] = {
        **PRESETS[f"cartpole_{_ptype}"],
        "exp_name": f"cartpole_novel_{_ptype}",
        "env.env_id": "muzero_tune/CartPoleNoVel-v1",
        "env.frame_stack": 1,
        "max_env_step": 50_000,
        "stop_value": 195.0,
    }

# ---------------------------------------------------------------------------------------------- overrides


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def iter_fields(
    cls: type = ExperimentConfig, prefix: str = ""
) -> Iterator[tuple[str, Any, dataclasses.Field]]:
    """Yield (dotted key, type, field) for every leaf setting, in declaration order."""
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        key = f"{prefix}{f.name}"
        if _is_section(tp):
            yield from iter_fields(tp, key + ".")
        else:
            yield key, tp, f


def leaf_keys() -> list[str]:
    return [k for k, _, _ in iter_fields()]


def _type_name(tp: Any) -> str:
    if tp in (int, float, str, bool):
        return tp.__name__
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("None" if a is type(None) else _type_name(a) for a in args)
    if origin is tuple:
        return f"tuple[{_type_name(args[0])}, ...]"
    return str(tp)


def _coerce(key: str, tp: Any, value: Any) -> Any:
    """Convert ``value`` (possibly a string from the CLI) to type ``tp`` or raise ConfigError."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null", "~")):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(key, inner[0], value)
    if isinstance(value, str) and tp is not str:
        raw = value
        value = yaml.safe_load(raw)
        if isinstance(value, str) and tp in (int, float):
            try:  # YAML 1.1 reads "1e-3" as a string
                value = float(raw)
            except ValueError:
                pass
    if origin is tuple:
        (elem,) = typing.get_args(tp)[:1]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, value, f"expected a list of {_type_name(elem)}")
        return tuple(_coerce(key, elem, v) for v in value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(key, value, "expected a bool (true/false)")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
            raise ConfigError(key, value, "expected an integer")
        return int(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, value, "expected a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, value, "expected a string")
        return value
    raise ConfigError(key, value, f"unsupported type {tp}")


def _unknown_key(key: str) -> ConfigError:
    keys = leaf_keys()
    close = difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
    hint = (
        f"did you mean {' or '.join(repr(c) for c in close)}?" if close else "run `muzero-tune train --help`"
    )
    return ConfigError(key, "<unknown key>", f"no such setting; {hint}")


def _set(cfg: Any, path: list[str], value: Any, full_key: str) -> Any:
    hints = _hints(type(cfg))
    names = {f.name for f in dataclasses.fields(cfg)}
    head = path[0]
    if head not in names:
        raise _unknown_key(full_key)
    tp = hints[head]
    if len(path) == 1:
        if _is_section(tp):
            if not isinstance(value, Mapping):
                raise ConfigError(full_key, value, f"is a section; set its keys, e.g. {full_key}.<key>=...")
            out = getattr(cfg, head)
            for k, v in value.items():
                out = _set(out, [k], v, f"{full_key}.{k}")
            return dataclasses.replace(cfg, **{head: out})
        return dataclasses.replace(cfg, **{head: _coerce(full_key, tp, value)})
    if not _is_section(tp):
        raise _unknown_key(full_key)
    return dataclasses.replace(cfg, **{head: _set(getattr(cfg, head), path[1:], value, full_key)})


def apply_overrides(cfg: ExperimentConfig, overrides: Mapping[str, Any]) -> ExperimentConfig:
    """Return ``cfg`` with each dotted key set; the one function behind presets, YAML, CLI and Tune.

    Values may be typed (YAML, Tune) or strings (``--set``), which are parsed as YAML scalars.
    Unknown keys and ill-typed values raise :class:`ConfigError`; ranges are checked by :func:`validate`.
    """
    for key, value in overrides.items():
        cfg = _set(cfg, key.split("."), value, key)
    return cfg


def parse_set_args(items: list[str]) -> dict[str, str]:
    """``["a.b=3", "c=x"]`` -> ``{"a.b": "3", "c": "x"}`` (CLI ``--set``)."""
    out: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(item, item, "expected --set key=value")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dict (a YAML file) -> dotted keys."""
    out: dict[str, Any] = {}
    for k, v in mapping.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def load_yaml(path: str) -> dict[str, Any]:
    """A YAML settings file as dotted keys; a missing file or a syntax error names the file (line, column)."""
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except OSError as e:
        raise PathError(f"--config {path}: cannot read the YAML file ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else path
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise UserError(f"--config {where}: not valid YAML ({what})") from None
    if not isinstance(data, Mapping):
        raise ConfigError("--config", path, "a YAML file must hold a mapping of settings")
    return flatten(data)


def to_flat_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """Every leaf setting by dotted key (MLflow params, checkpoints)."""
    out: dict[str, Any] = {}
    for key, _, _ in iter_fields():
        obj: Any = cfg
        for part in key.split("."):
            obj = getattr(obj, part)
        out[key] = list(obj) if isinstance(obj, tuple) else obj
    return out


def from_flat_dict(flat: Mapping[str, Any]) -> ExperimentConfig:
    return apply_overrides(ExperimentConfig(), flat)


# ---------------------------------------------------------------------------------------------- validation


def _check_field(key: str, value: Any, f: dataclasses.Field) -> None:
    m = f.metadata
    if value is None:
        return
    vals = value if isinstance(value, tuple) else (value,)
    for v in vals:
        if m.get("choices") is not None and v not in m["choices"]:
            close = difflib.get_close_matches(str(v), [str(c) for c in m["choices"]], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(key, value, f"allowed: {', '.join(map(str, m['choices']))}{hint}")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if m.get("ge") is not None and v < m["ge"]:
                raise ConfigError(key, value, f"must be >= {m['ge']}")
            if m.get("gt") is not None and v <= m["gt"]:
                raise ConfigError(key, value, f"must be > {m['gt']}")
            if m.get("le") is not None and v > m["le"]:
                raise ConfigError(key, value, f"must be <= {m['le']}")
            if m.get("lt") is not None and v >= m["lt"]:
                raise ConfigError(key, value, f"must be < {m['lt']}")


def validate(cfg: ExperimentConfig, *, check_env: bool = True) -> ExperimentConfig:
    """Check every field's range and the cross-field rules; raise ConfigError before any work starts.

    ``check_env`` also checks that ``env.env_id`` is a registered gymnasium id (without building it).
    Returns ``cfg`` so calls can be chained.
    """
    for key, _, f in iter_fields():
        obj: Any = cfg
        for part in key.split("."):
            obj = getattr(obj, part)
        _check_field(key, obj, f)

    learn, replay, ap = cfg.learn, cfg.replay, cfg.policy.async_pipeline
    if learn.device not in ("cpu", "auto", "cuda") and not learn.device.startswith("cuda:"):
        raise ConfigError("learn.device", learn.device, "allowed: cpu, auto, cuda, cuda:<index>")
    if list(learn.lr_milestones) != sorted(learn.lr_milestones):
        raise ConfigError("learn.lr_milestones", learn.lr_milestones, "must be increasing")
    if replay.capacity_transitions < learn.batch_size:
        raise ConfigError(
            "replay.capacity_transitions",
            replay.capacity_transitions,
            f"must be >= learn.batch_size ({learn.batch_size})",
        )
    if replay.off_policy_transitions_per_step > 0 and replay.td_steps_min > replay.td_steps:
        raise ConfigError(
            "replay.td_steps_min", replay.td_steps_min, f"must be <= replay.td_steps ({replay.td_steps})"
        )
    if learn.num_threads == 2 and learn.overlap_bootstrap and learn.prefetch_next_batch:
        warnings.warn(
            ConfigWarning(
                "learn.num_threads=2 runs the learner's step on one thread, as 1 does: the bootstrap helper "
                "takes the second core beside both the loss's forward (learn.overlap_bootstrap) and its "
                "backward (learn.prefetch_next_batch), and a Tune trial's bundle reserves both cores; for a "
                "two-thread backward set learn.prefetch_next_batch=false, or use 3 or more threads"
            ),
            stacklevel=2,
        )
    if learn.helper_ssl_encodings > 0:
        if not learn.overlap_bootstrap:
            warnings.warn(
                ConfigWarning(
                    f"learn.helper_ssl_encodings={learn.helper_ssl_encodings} has no helper thread with "
                    "learn.overlap_bootstrap=false: every SSL target encoding runs on the loss's thread"
                ),
                stacklevel=2,
            )
        if learn.helper_ssl_encodings > replay.num_unroll_steps:
            raise ConfigError(
                "learn.helper_ssl_encodings",
                learn.helper_ssl_encodings,
                f"must be <= replay.num_unroll_steps ({replay.num_unroll_steps}): one encoding per step",
            )
    if cfg.env.env_id.startswith("ALE/") and cfg.model.kind != "conv":
        raise ConfigError("model.kind", cfg.model.kind, "Atari image observations need model.kind=conv")
    if ap.max_collect_inflight is not None and ap.max_collect_inflight > ap.num_collector_actors:
        raise ConfigError(
            "policy.async_pipeline.max_collect_inflight",
            ap.max_collect_inflight,
            f"must be <= num_collector_actors ({ap.num_collector_actors}): one collect per actor at a time",
        )
    if ap.max_eval_inflight > ap.num_evaluator_actors:
        raise ConfigError(
            "policy.async_pipeline.max_eval_inflight",
            ap.max_eval_inflight,
            f"must be <= num_evaluator_actors ({ap.num_evaluator_actors})",
        )
    for kind in ("collector", "evaluator"):
        if getattr(ap, f"{kind}_num_cpus") + getattr(ap, f"{kind}_num_gpus") <= 0:
            raise ConfigError(
                f"policy.async_pipeline.{kind}_num_cpus",
                getattr(ap, f"{kind}_num_cpus"),
                f"an actor bundle needs some resource: {kind}_num_cpus + {kind}_num_gpus must be > 0",
            )
    if ap.enabled and 0 <= ap.max_policy_lag < ap.weight_sync_interval - 1:
        warnings.warn(
            ConfigWarning(
                f"policy.async_pipeline.weight_sync_interval={ap.weight_sync_interval} has no effect with "
                f"policy.async_pipeline.max_policy_lag={ap.max_policy_lag}: the lag rule publishes every "
                f"{ap.max_policy_lag + 1} train_iter first (the gap is min(weight_sync_interval, "
                f"max_policy_lag + 1)); set max_policy_lag >= {ap.weight_sync_interval - 1} or -1 (off) "
                f"for the interval to apply"
            ),
            stacklevel=2,
        )
    from muzero_tune.policies.registry import check_policy_type  # light: no torch import

    check_policy_type(cfg.policy.type)
    if check_env:
        from muzero_tune.envs.factory import validate_env_id

        try:
            validate_env_id(cfg.env.env_id)
        except ImportError:
            raise
        except ValueError as e:
            raise ConfigError("env.env_id", cfg.env.env_id, str(e)) from None
    return cfg


def resolved_async(ap: AsyncPipelineConfig) -> AsyncPipelineConfig:
    """The async settings with their None defaults filled in from num_collector_actors."""
    return dataclasses.replace(
        ap,
        max_collect_inflight=ap.max_collect_inflight or ap.num_collector_actors,
        max_train_budget_queue_size=ap.max_train_budget_queue_size or 2 * ap.num_collector_actors,
    )


def make_config(
    preset: str | None = "cartpole_muzero",
    *,
    yaml_path: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    check_env: bool = True,
) -> ExperimentConfig:
    """Preset, then YAML file, then overrides (later wins); validated."""
    cfg = ExperimentConfig()
    if preset is not None:
        if preset not in PRESETS:
            close = difflib.get_close_matches(preset, list(PRESETS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError("preset", preset, f"allowed: {', '.join(PRESETS)}{hint}")
        cfg = apply_overrides(cfg, PRESETS[preset])
    if yaml_path is not None:
        cfg = apply_overrides(cfg, load_yaml(yaml_path))
    if overrides:
        cfg = apply_overrides(cfg, overrides)
    return validate(cfg, check_env=check_env)


def describe_fields() -> str:
    """One line per setting: key, type, default, doc (the CLI's --help epilog)."""
    lines = []
    defaults = to_flat_dict(ExperimentConfig())
    for key, tp, f in iter_fields():
        extra = ""
        if f.metadata.get("choices"):
            extra = f" {{{', '.join(map(str, f.metadata['choices']))}}}"
        lines.append(
            f"  {key} ({_type_name(tp)}, default {defaults[key]!r}){extra}: {f.metadata.get('doc', '')}"
        )
    return "\n".join(lines)
