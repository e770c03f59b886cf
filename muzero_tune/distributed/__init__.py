"""The async pipeline's Ray side: the driver that alone owns the learner and the replay buffer, and the
actors that collect and evaluate beside it.

    async_driver.py  AsyncDriver (the event loop: launches, results, train budgets, metrics) and
                     train_muzero_segment_async
    actor_pool.py    ActorPool: the collector and evaluator slots, their start-up, restarts and shutdown
    weights.py       WeightPublisher: immutable versioned weight snapshots, when one is due
    actors.py        CollectorWorker / EvaluatorWorker Ray actors
    placement.py     placement groups: the trial's under Tune, the run's own standalone
    cluster.py       starting or joining a Ray cluster

Training semantics are :class:`muzero_tune.pipeline.core.DriverCore`'s, shared with the sync driver.
"""
