"""The settings: one frozen dataclass tree (``ExperimentConfig`` and its sections), each field with a
one-line doc and its allowed range (:func:`param`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

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
    path_component: bool = False,
    text: bool = False,
    default_factory: Any = dataclasses.MISSING,
) -> Any:
    """A dataclass field with its doc line and its allowed range (checked by :func:`validate`).

    Every number must be finite. ``path_component``: the value names one folder or file (not empty, no
    separator, not ``.`` or ``..``, no control characters). ``text``: not empty, no control characters."""
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt, "choices": choices,
            "path_component": path_component, "text": text}  # fmt: skip
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


# ---------------------------------------------------------------------------------------------- sections



# the longest wait a timeout may name (about 11.6 days): Ray and the standard library take waits as C integers
# of milliseconds or nanoseconds, so a far larger one overflows them
MAX_WAIT_S = 1_000_000.0

@dataclass(frozen=True)
class EnvConfig:
    """Which environment, how its frames are preprocessed, and how many copies run."""

    env_id: str = param(
        "CartPole-v1",
        "any registered gymnasium id; module:EnvId imports the module that registers it first; ALE/<Game>-v5 "
        "for Atari",
    )
    kwargs: dict[str, Any] = param(
        default_factory=dict, doc="keyword arguments for gymnasium.make, e.g. {is_slippery: false}"
    )
    wrappers: tuple[str, ...] = param(
        (),
        "gymnasium wrappers applied in order after gymnasium.make: 'module:Class', or 'module:Class {k: v}' "
        "with keyword arguments as a YAML mapping",
    )
    multi_discrete_actions: str = param(
        "auto",
        "a MultiDiscrete action space: flat (one discrete action over every combination, at most 4096; every "
        "policy type), factored (one index per factor; the sampled types), auto (flat up to 4096 "
        "combinations, factored above)",
        choices=("auto", "flat", "factored"),
    )
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
        "auto",
        "network family: mlp (vector observations), conv (images) or auto (from the env's observations)",
        choices=("auto", "mlp", "conv"),
    )
    latent_dim: int = param(64, "mlp: size of the hidden state", ge=1, le=16_384)
    hidden_dim: int = param(128, "mlp: width of hidden layers", ge=1, le=16_384)
    num_hidden_layers: int = param(1, "mlp: hidden layers per function", ge=1, le=16)
    num_channels: int = param(64, "conv: channels of the hidden state", ge=1, le=2048)
    num_res_blocks: int = param(1, "conv: residual blocks per stage", ge=1, le=32)
    downsample: bool | None = param(
        None,
        "conv: downsample 64/96 px frames to a 4x4/6x6 hidden state; None: auto (frames of 32 px or more "
        "are downsampled, small grids keep their resolution)",
    )
    value_support_size: int = param(
        300, "value is categorical over integer bins -S..S of h(value)", ge=1, le=100_000
    )
    reward_support_size: int = param(
        300, "reward is categorical over integer bins -S..S of h(reward)", ge=1, le=100_000
    )
    projection_dim: int = param(128, "width of the SSL projection head", ge=1, le=16_384)
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
    host_kernel: bool = param(
        True,
        "the search's network call and its decoding as one numba kernel where the network allows it (the "
        "MLP MuZero, EfficientZero and Stochastic MuZero networks on CPU, float32, up to 64 rows; results "
        "equal the traced call's to float32 rounding); false: the traced call",
    )


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
    td_steps: int = param(10, "n of the n-step value target", ge=1, le=10_000)
    off_policy_transitions_per_step: int = param(
        0,
        "EfficientZero's off-policy correction: a sample's n-step horizon is td_steps minus one per this "
        "many transitions pushed after it, down to td_steps_min (0: off, every sample uses td_steps)",
        ge=0,
    )
    td_steps_min: int = param(1, "the off-policy correction's shortest n-step horizon", ge=1)
    use_priority: bool = param(True, "prioritized replay (else uniform)")
    priority_alpha: float = param(0.6, "PER exponent alpha", ge=0.0, le=4.0)
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
        le=1000.0,
    )
    reanalyze_batch_size: int = param(160, "segments positions re-searched per buffer reanalyze call", ge=1)
    reanalyze_partition: float = param(
        0.75, "buffer reanalyze draws from this oldest fraction of the buffer", gt=0.0, le=1.0
    )


@dataclass(frozen=True)
class LearnConfig:
    """The learner: losses, optimizer, schedule, target network and the train/collect ratio."""

    batch_size: int = param(256, "samples per train step", ge=1, le=1_000_000)
    optimizer: str = param("adam", "optimizer", choices=("adam", "adamw", "sgd"))
    learning_rate: float = param(3e-3, "initial learning rate", gt=0.0, le=10.0)
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
    compile: str = param(
        "off",
        "torch.compile the loss's forward and backward (pipeline/compiled_loss.py): "
        "off, default, or max-autotune-no-cudagraphs (longer compile, faster matmuls on small CPU networks); "
        "a part that cannot compile runs eager with one warning naming the cause",
        choices=("off", "default", "max-autotune-no-cudagraphs"),
    )
    compile_optimizer_step: bool = param(
        False,
        "with learn.compile on: the optimizer's step compiled too, as a second graph (on the CartPole "
        "networks about a second more of first compile per process, for 0-0.6 ms less per train step); "
        "eager under lr_schedule=cosine and behind fp16's gradient scaler",
    )
    compile_cpp_wrapper: bool = param(
        True,
        "with learn.compile on a CPU learner: Inductor's generated C++ calls the compiled graph's kernels "
        "instead of generated Python (the same kernels and results, less per-call overhead, a longer first "
        "compile); no effect on CUDA",
    )
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
        le=1024,
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
    build_ahead_on_helper: bool = param(
        True,
        "with learn.prefetch_next_batch: the next batch's draw and targets run on the helper thread too, "
        "beside this step's backward, instead of on the step's thread between its forward and backward; the "
        "step waits for them before it returns (no buffer write overlaps them), so results are the same",
    )
    num_learners: int = param(
        0,
        "learner workers training the model data-parallel (DistributedDataParallel; gloo on CPU, NCCL on "
        "GPU), each on batch_size / num_learners rows of every batch the driver samples; 0: the learner "
        "runs in the driver's process",
        ge=0,
        le=64,
    )
    learner_resources: dict[str, Any] = param(
        default_factory=dict,
        doc="Ray resources of each learner worker, {CPU: n, GPU: n} ({}: learn.num_threads CPUs, and one "
        "GPU when learn.device is cuda, or auto on a cluster with GPUs)",
    )
    learner_timeout_s: float = param(
        600.0, "seconds a learner worker may take to start or to answer one train step", gt=0.0,
        le=MAX_WAIT_S,
    )


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation: greedy search, no noise, on separate environments."""

    eval_freq: int = param(200, "evaluate every this many train steps", ge=1)
    n_episodes: int = param(8, "episodes per evaluation", ge=1, le=100_000)
    max_episode_steps: int | None = param(None, "cap on steps per evaluation episode", ge=1)
    unvisited_q: str = param(
        "parent",
        "pUCT, evaluation searches (no root noise): an unvisited child's Q is parent (its parent's mean "
        "value) or min (0 after min-max)",
        choices=("parent", "min"),
    )
    video_every: int = param(
        0,
        "record the first episode of every N-th evaluation as an mp4 (the run folder's videos/, and MLflow); "
        "0: never. Needs an env that renders rgb_array frames and the video extra",
        ge=0,
    )


@dataclass(frozen=True)
class AsyncPipelineConfig:
    """``policy.async_pipeline``: the async segment pipeline (docs/distributed.md)."""

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
    collector_num_cpus: float = param(1.0, "Ray CPUs per collector actor", ge=0.0, le=1024.0)
    evaluator_num_cpus: float = param(1.0, "Ray CPUs per evaluator actor", ge=0.0, le=1024.0)
    collector_num_gpus: float = param(
        0.0, "Ray GPUs per collector actor (fractional allowed)", ge=0.0, le=64.0
    )
    evaluator_num_gpus: float = param(
        0.0, "Ray GPUs per evaluator actor (fractional allowed)", ge=0.0, le=64.0
    )
    buffer_stats_interval: int = param(100, "log buffer statistics every this many train_iter", ge=1)
    poll_interval_s: float = param(0.1, "driver event-loop poll interval, seconds", gt=0.0, le=60.0)
    shutdown_timeout_s: float = param(30.0, "actor shutdown timeout at exit, seconds", gt=0.0, le=MAX_WAIT_S)
    ray_local_mode: bool = param(False, "Ray local mode (debugging)")
    max_actor_restarts: int = param(
        3,
        "restarts allowed per actor slot before the slot is given up (the run goes on with the others and "
        "stops with an error when a kind has no actor left)",
        ge=0,
    )
    actor_restart_delay_s: float = param(
        1.0, "wait before restarting a failed actor, seconds", ge=0.0, le=3600.0
    )
    collect_timeout_s: float = param(
        600.0, "a collect running longer is treated as a hung actor, seconds", gt=0.0, le=MAX_WAIT_S
    )
    eval_timeout_s: float = param(
        1800.0, "an evaluation running longer is treated as hung, seconds", gt=0.0, le=MAX_WAIT_S
    )
    actor_start_timeout_s: float = param(
        120.0,
        "wait this long for the placement group and actors to start, seconds; a replacement actor not "
        "started by then is waited for while the run goes on with the others",
        gt=0.0,
        le=MAX_WAIT_S,
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
    lstm_hidden_size: int = param(64, "efficientzero: value-prefix LSTM hidden size", ge=1, le=16_384)
    # gumbel_muzero
    max_num_considered_actions: int = param(
        16,
        "gumbel_muzero: actions sampled at the root (Gumbel-top-k) for sequential halving",
        ge=1,
        le=100_000,
    )
    gumbel_scale: float = param(1.0, "gumbel_muzero: scale of the root Gumbel noise when collecting", ge=0.0)
    gumbel_c_visit: float = param(50.0, "gumbel_muzero: c_visit of the completed-Q transform", gt=0.0)
    gumbel_c_scale: float = param(0.1, "gumbel_muzero: c_scale of the completed-Q transform", gt=0.0)
    # sampled_muzero, sampled_efficientzero
    num_samples: int = param(20, "sampled_*: actions sampled at every search node (K)", ge=1, le=4096)
    sampled_prior: str = param(
        "auto",
        "sampled_*: prior of the K sampled edges: uniform (1/K, the paper's rule for independent draws "
        "from the policy), density (the policy renormalised over the samples, right for distinct discrete "
        "actions drawn without replacement) or auto (uniform for continuous and factored actions, density "
        "for discrete)",
        choices=("auto", "uniform", "density"),
    )
    policy_entropy_weight: float = param(
        5e-3, "sampled_* and unizero: weight of the policy entropy bonus in the policy loss", ge=0.0
    )
    # stochastic_muzero
    chance_space_size: int = param(
        8, "stochastic_muzero: number of chance outcomes (codebook size)", ge=1, le=4096
    )
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
        le=100_000,
    )
    rnn_hidden_size: int = param(64, "muzero_rnn_full_obs: GRU history state size", ge=1, le=16_384)
    # unizero (sampled_unizero)
    world_model_layers: int = param(2, "unizero: transformer layers", ge=1, le=64)
    world_model_heads: int = param(
        2, "unizero: attention heads (embed_dim / heads must be even)", ge=1, le=256
    )
    world_model_embed_dim: int = param(
        64,
        "unizero: token size E (observation latents, action embeddings, transformer width)",
        ge=2,
        le=16_384,
    )
    context_tokens: int = param(
        8,
        "unizero: a root's context holds the env's last context_tokens // 2 observations and the actions "
        "between them (the search appends up to max(2K+1, context_tokens+1) tokens, then slides)",
        ge=2,
        le=4096,
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
        "runs/tune",
        "sweep results: a folder (made absolute; MLflow's default sqlite store lives there), file:///path, "
        "or an object store URI pyarrow opens (s3://bucket/prefix, gs://...; tune.mlflow_tracking_uri then "
        "names a server)",
        text=True,
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
        None,
        "MLflow tracking URI: sqlite:///path/to/mlflow.db, http(s)://host:port (a server) or a database URI "
        "(None: sqlite:///<storage_path>/mlflow.db)",
    )
    sync_period_s: float = param(
        1.0, "how often Tune syncs experiment state to storage (fresh restores)", gt=0.0
    )


@dataclass(frozen=True)
class LoggingConfig:
    """Where runs write and how often they print."""

    output_dir: str = param("runs", "runs are written to <output_dir>/<exp_name>/", text=True)
    progress_interval_s: float = param(5.0, "seconds between progress lines (0: every loop)", ge=0.0)
    quiet: bool = param(False, "no progress lines")
    mlflow: bool = param(False, "standalone runs: log every evaluation to MLflow (metric step = env steps)")
    mlflow_tracking_uri: str | None = param(
        None,
        "standalone MLflow tracking URI: sqlite:///path/to/mlflow.db, http(s)://host:port or a database URI "
        "(None: sqlite:///<output_dir>/mlflow.db)",
    )
    mlflow_experiment: str = param(
        "standalone", "standalone MLflow experiment (compare its runs with muzero-tune compare)", text=True
    )


@dataclass(frozen=True)
class ExperimentConfig:
    """Everything one training run reads."""

    exp_name: str = param(
        "cartpole_muzero",
        "run name, one folder name; outputs go under <logging.output_dir>/<exp_name>/",
        path_component=True,
    )
    seed: int = param(0, "seed of environments, search and learner", ge=0, le=2**31 - 1)
    max_envstep: int = param(100_000, "stop after this many env steps", ge=1)
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


def resolved_async(ap: AsyncPipelineConfig) -> AsyncPipelineConfig:
    """The async settings with their None defaults filled in from num_collector_actors."""
    return dataclasses.replace(
        ap,
        max_collect_inflight=ap.max_collect_inflight or ap.num_collector_actors,
        max_train_budget_queue_size=ap.max_train_budget_queue_size or 2 * ap.num_collector_actors,
    )
